"""Where the images come from: `data=imagenet|synthetic`, the path of a JPEG tree and the crops to cut."""
import logging
from dataclasses import dataclass
from pathlib import Path

from ..core.config import ConfigError
from . import synth

log = logging.getLogger(__name__)


@dataclass
class Source:
    """What the data group says: where the JPEG tree is (if anywhere) and the crops to train and validate on."""
    root: Path | None
    crop_size: int
    val_resize: int
    on_error: str
    max_bad_fraction: float = 0.01


def imagenet(root: str | None, crop_size: int, val_resize: int, on_error: str,
             max_bad_fraction: float = 0.01) -> Source:
    """The ImageNet layout: root/train/<class>/* and root/val/<class>/*."""
    path = Path(root).expanduser() if root else None
    if path is not None and not path.is_dir():
        raise ConfigError(f"data.root={root} does not exist")
    return Source(path, crop_size, val_resize, on_error, max_bad_fraction)


def synthetic(num_classes: int, train_per_class: int, val_per_class: int, cache_dir: str,
              crop_size: int, val_resize: int, on_error: str, max_bad_fraction: float = 0.01) -> Source:
    """The built-in data set, written once per size into cache_dir and reused."""
    root = Path(cache_dir).expanduser() / f"c{num_classes}-t{train_per_class}-v{val_per_class}"
    if not (root / "val").is_dir():
        log.info("writing the synthetic data set to %s (once)", root)
        synth.write_dataset(root, num_classes, train_per_class, val_per_class)
    return Source(root, crop_size, val_resize, on_error, max_bad_fraction)
