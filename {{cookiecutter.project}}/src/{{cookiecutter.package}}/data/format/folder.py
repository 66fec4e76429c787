"""`format=folder`: the JPEG tree as it is, root/{train,val}/<class>/*. Nothing to prepare; millions of small reads."""
from pathlib import Path

import numpy as np

from ...contracts import Store, Stores
from ...core.config import ConfigError

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}


def list_images(split_dir: Path, classes: list[str] | None = None) -> tuple[list[tuple[Path, int]], list[str]]:
    """(path, label) for every image under split_dir/<class>/, labels in sorted class order."""
    if not split_dir.is_dir():
        raise ConfigError(f"{split_dir} is not a folder; data.root must hold train/<class>/ and val/<class>/")
    found = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    if not found:
        raise ConfigError(f"{split_dir} has no class folders; expected {split_dir}/<class>/*.JPEG")
    classes = classes or found
    if set(found) - set(classes):
        raise ConfigError(f"{split_dir} has class folders that train/ lacks: {sorted(set(found) - set(classes))[:5]}")
    present = set(found)  # val may lack some of train's classes
    samples = [(path, label) for label, name in enumerate(classes) if name in present
               for path in sorted((split_dir / name).iterdir()) if path.suffix.lower() in IMAGE_SUFFIXES]
    if not samples:
        raise ConfigError(f"{split_dir} holds no .JPEG, .jpg or .png files")
    return samples, classes


class ImageFiles(Store):
    def __init__(self, samples: list[tuple[Path, int]]):
        super().__init__(np.array([label for _, label in samples], dtype=np.int64))
        self.paths = [path for path, _ in samples]

    def payload(self, index: int) -> bytes:
        return self.paths[index].read_bytes()

    def name(self, index: int) -> str:
        return str(self.paths[index])

    def files(self, indices: list[int]) -> list[Path]:
        return [self.paths[index] for index in indices]


def open_tree(root: Path) -> tuple[ImageFiles, ImageFiles, list[str]]:
    train, classes = list_images(root / "train")
    val, _ = list_images(root / "val", classes)
    return ImageFiles(train), ImageFiles(val), classes


def build(source, stage) -> Stores:
    """The tree at data.root, staged first if staging= asks."""
    if source.root is None:
        raise ConfigError("format=folder reads data.root: pass data.root=/path/to/imagenet")
    train, val, classes = open_tree(stage(Path(source.root)))
    return Stores(train, val, classes)
