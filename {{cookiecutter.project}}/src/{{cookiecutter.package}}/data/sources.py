"""Where the images come from: `data=folder|synthetic`, the path of a JPEG tree, the crops to cut and the
normalisation; and how a run's preprocessing is settled between the data's keys and the model's weights."""
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, open_dict

from ..contracts import Preprocessing
from ..core.errors import ConfigError
from . import synth
from .crops import DEFAULT_SCALE, CropSchedule
from .device import IMAGENET_MEAN, IMAGENET_STD

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Source:
    """What the data group says: where the JPEG tree is (if anywhere) and the crops to train and validate on."""
    root: Path | None
    crop_size: int  # validation's, and inference's: the side the model is judged and served at
    val_resize: int
    train_crop_size: int  # training's final side: crop_size, or lower to train faster and test higher (FixRes)
    on_error: str
    max_bad_fraction: float = 0.01
    mean: tuple[float, ...] = IMAGENET_MEAN  # per channel, in 0..1 of the pixel range
    std: tuple[float, ...] = IMAGENET_STD
    crop_schedule: CropSchedule | None = None  # progressive resizing of the training crop; None: its side throughout
    crop_scale: tuple[float, float] = DEFAULT_SCALE  # the share of an image's area a training crop covers, least to most


def channels(key: str, values, default: tuple[float, ...]) -> tuple[float, ...]:
    """data.mean or data.std as three numbers (null: `default`), or refuse it in one line."""
    if values is None:
        return default
    try:
        numbers = tuple(float(value) for value in values)
    except (TypeError, ValueError):
        numbers = ()
    if len(numbers) != 3 or (key == "data.std" and min(numbers) <= 0):
        raise ConfigError(f"{key}={values} is not three {'positive ' if key == 'data.std' else ''}numbers, one per "
                          f"channel (R, G, B) in 0..1 of the pixel range, such as {key}=[{','.join(map(str, default))}]")
    return numbers


def crops(crop_size: int, train_crop_size: int | None, start_crop_size: int | None, crop_ramp_epochs,
          crop_scale=DEFAULT_SCALE) -> dict:
    """The Source's training side, crop schedule and crop scale: training ends at data.train_crop_size where one is
    set (trained at a lower side than it is validated at, as FixRes does: arXiv:1906.06423), else at data.crop_size."""
    for key, value in (("data.train_crop_size", train_crop_size), ("data.start_crop_size", start_crop_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{key}={value!r} is not a whole number of pixels, nor null")
    side, key = (crop_size, "data.crop_size") if train_crop_size is None else (train_crop_size, "data.train_crop_size")
    return {"train_crop_size": side, "crop_schedule": CropSchedule(side, start_crop_size, crop_ramp_epochs, key),
            "crop_scale": scale_range(crop_scale)}


def scale_range(values) -> tuple[float, float]:
    """data.crop_scale as the pair (least, most) with 0 < least <= most <= 1, or refuse it in one line."""
    listed = isinstance(values, Sequence) and not isinstance(values, str)
    try:
        numbers = tuple(float(value) for value in values) if listed else ()
    except (TypeError, ValueError):
        numbers = ()
    if len(numbers) != 2 or not 0 < numbers[0] <= numbers[1] <= 1:
        raise ConfigError(f"data.crop_scale={list(values) if listed else values} is not [least, most] shares of an "
                          f"image's area (0 < least <= most <= 1) that a training crop covers, such as "
                          f"[{DEFAULT_SCALE[0]},{DEFAULT_SCALE[1]}]")
    return numbers


def folder(root: str | None, crop_size: int, val_resize: int, on_error: str, max_bad_fraction: float = 0.01,
           mean=None, std=None, start_crop_size: int | None = None, crop_ramp_epochs=(0, 0),
           train_crop_size: int | None = None, crop_scale=DEFAULT_SCALE) -> Source:
    """A tree in the ImageNet layout: root/train/<class>/* and root/val/<class>/*."""
    path = Path(root).expanduser() if root else None
    if path is not None and path.is_file():
        raise ConfigError(f"data.root={root} is a file; pass the folder that holds train/<class>/ and val/<class>/")
    if path is not None and not path.is_dir():
        raise ConfigError(f"data.root={root} does not exist; pass the folder that holds train/<class>/ and val/<class>/")
    return Source(root=path, crop_size=crop_size, val_resize=val_resize, on_error=on_error,
                  max_bad_fraction=max_bad_fraction, mean=channels("data.mean", mean, IMAGENET_MEAN),
                  std=channels("data.std", std, IMAGENET_STD),
                  **crops(crop_size, train_crop_size, start_crop_size, crop_ramp_epochs, crop_scale))


def synthetic(num_classes: int, train_per_class: int, val_per_class: int, cache_dir: str,
              crop_size: int, val_resize: int, on_error: str, max_bad_fraction: float = 0.01, mean=None,
              std=None, start_crop_size: int | None = None, crop_ramp_epochs=(0, 0),
              train_crop_size: int | None = None, crop_scale=DEFAULT_SCALE) -> Source:
    """The built-in data set, written once per size into cache_dir and reused."""
    root = Path(cache_dir).expanduser() / f"c{num_classes}-t{train_per_class}-v{val_per_class}"
    if not (root / "val").is_dir():
        log.info("writing the synthetic data set to %s (once)", root)
        synth.write_dataset(root, num_classes, train_per_class, val_per_class)
    return Source(root=root, crop_size=crop_size, val_resize=val_resize, on_error=on_error,
                  max_bad_fraction=max_bad_fraction, mean=channels("data.mean", mean, IMAGENET_MEAN),
                  std=channels("data.std", std, IMAGENET_STD),
                  **crops(crop_size, train_crop_size, start_crop_size, crop_ramp_epochs, crop_scale))


def fit_preprocessing(data: DictConfig, own: Preprocessing | None, chosen: set[str]) -> Preprocessing:
    """The run's preprocessing, written into `data`: data.mean and data.std where set, else the weights' own (`own`),
    else ImageNet's; data.crop_size and data.val_resize where `chosen` (set on the command line or by a recipe), else
    the weights' own, the resize kept in their proportion to the crop."""
    mean = channels("data.mean", data.get("mean"), own.mean if own else IMAGENET_MEAN)
    std = channels("data.std", data.get("std"), own.std if own else IMAGENET_STD)
    crop = data.crop_size if own is None or "crop_size" in chosen else own.crop_size
    resize = data.val_resize if own is None or "val_resize" in chosen else round(own.resize * crop / own.crop_size)
    if resize < crop:
        raise ConfigError(f"data.val_resize={resize} is smaller than data.crop_size={crop}: the validation crop is cut "
                          "from the resized image; raise data.val_resize")
    with open_dict(data):
        data.mean, data.std, data.crop_size, data.val_resize = list(mean), list(std), crop, resize
    log.info("inputs: %d-pixel crops (validation: of images resized to %d), normalised with mean %s and std %s%s",
             crop, resize, [round(value, 4) for value in mean], [round(value, 4) for value in std],
             "; the weights' own where the data's keys set none" if own else "")
    return Preprocessing(mean=mean, std=std, crop_size=crop, resize=resize)
