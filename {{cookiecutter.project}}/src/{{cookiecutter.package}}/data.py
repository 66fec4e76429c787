"""Data sets and loaders: worker processes decode and crop to uint8 tensors; the device normalises.

`data=synthetic` needs no download; `data=imagenet data.root=/path` reads an ImageNet-style tree.
Either way a batch reaching the training step is (float images normalised on the device, labels).
"""
import io
import logging
import math
import multiprocessing
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms.functional import pil_to_tensor

from . import synth
from .config import ConfigError
from .distributed import Shard, World

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclass
class Splits:
    train: Dataset
    val: Dataset
    classes: list[str]

    def skipped_files(self, world: World) -> int:
        """Files found unreadable by any worker of any process, each counted once."""
        flags = torch.cat([self.train.bad_flags(), self.val.bad_flags()]).to(world.device, torch.int32)
        return int(world.sum(flags).count_nonzero())


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
    samples = [(path, label) for label, name in enumerate(classes)
               for path in sorted((split_dir / name).iterdir()) if path.suffix.lower() in IMAGE_SUFFIXES]
    if not samples:
        raise ConfigError(f"{split_dir} holds no .JPEG, .jpg or .png files")
    return samples, classes


def _decode_box(image: Image.Image, box: tuple[float, float, float, float], size: int) -> Image.Image:
    """Decode only as much as a size x size output of `box` (left, top, right, bottom) needs, and resize.

    When the box spans at least twice `size`, libjpeg decodes at 1/2, 1/4 or 1/8 scale (PIL's draft),
    which skips most of the inverse DCT work; the box is rescaled to the reduced image.
    """
    width, height = image.size
    factor = min(box[2] - box[0], box[3] - box[1]) / size
    if factor >= 2:
        image.draft("RGB", (math.ceil(width / factor), math.ceil(height / factor)))
    sx, sy = image.size[0] / width, image.size[1] / height
    scaled = (box[0] * sx, box[1] * sy, min(box[2] * sx, image.size[0]), min(box[3] * sy, image.size[1]))
    return image.convert("RGB").resize((size, size), Image.BILINEAR, box=scaled)


class TrainCrop:
    """Random-resized-crop to size x size and a random horizontal flip, decoding at reduced scale when possible."""

    def __init__(self, size: int, scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)):
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, data: bytes) -> torch.Tensor:
        image = Image.open(io.BytesIO(data))
        top, left, height, width = RandomResizedCrop.get_params(image, list(self.scale), list(self.ratio))
        image = _decode_box(image, (left, top, left + width, top + height), self.size)
        if torch.rand(()) < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return pil_to_tensor(image)


class CenterCrop:
    """Resize the shorter side to `resize`, then take the central size x size square (deterministic)."""

    def __init__(self, size: int, resize: int):
        self.size, self.resize = size, resize

    def __call__(self, data: bytes) -> torch.Tensor:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        side = self.size * min(width, height) / self.resize  # the crop's side in original pixels
        left, top = (width - side) / 2, (height - side) / 2
        return pil_to_tensor(_decode_box(image, (left, top, left + side, top + side), self.size))


class ImageFiles(Dataset):
    """Encoded image files decoded in the worker; an unreadable file is skipped or raised per `on_error`."""

    def __init__(self, samples: list[tuple[Path, int]], transform, on_error: str):
        if on_error not in ("skip", "raise"):
            raise ConfigError(f"data.on_error={on_error!r}: pick skip or raise")
        self.samples, self.transform, self.on_error = samples, transform, on_error
        # One flag per file in shared memory, so every worker and every epoch counts a bad file once.
        self.bad = multiprocessing.RawArray("b", len(samples))

    def __len__(self) -> int:
        return len(self.samples)

    def bad_flags(self) -> torch.Tensor:
        return torch.frombuffer(self.bad, dtype=torch.int8)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        for offset in range(len(self.samples)):
            position = (index + offset) % len(self.samples)
            path, label = self.samples[position]
            try:
                return self.transform(path.read_bytes()), label
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
                if self.on_error == "raise":
                    raise RuntimeError(f"unreadable image {path}: {err} (data.on_error=skip would skip it)") from err
                if not self.bad[position]:
                    log.warning("skipping unreadable image %s: %s", path, err)
                self.bad[position] = 1
        raise RuntimeError("every image in the data set is unreadable")


def image_folder(root: str, crop_size: int, val_resize: int, on_error: str) -> Splits:
    """The ImageNet layout: root/train/<class>/* and root/val/<class>/*."""
    root_path = Path(root).expanduser()
    if not root_path.is_dir():
        raise ConfigError(f"data.root={root} does not exist")
    train, classes = list_images(root_path / "train")
    val, _ = list_images(root_path / "val", classes)
    return Splits(ImageFiles(train, TrainCrop(crop_size), on_error),
                  ImageFiles(val, CenterCrop(crop_size, val_resize), on_error), classes)


def synthetic(num_classes: int, train_per_class: int, val_per_class: int, cache_dir: str,
              crop_size: int, val_resize: int, on_error: str) -> Splits:
    """The built-in data set, written once per size into cache_dir and reused."""
    root = Path(cache_dir).expanduser() / f"c{num_classes}-t{train_per_class}-v{val_per_class}"
    if not (root / "val").is_dir():
        log.info("writing the synthetic data set to %s (once)", root)
        synth.write_dataset(root, num_classes, train_per_class, val_per_class)
    return image_folder(str(root), crop_size, val_resize, on_error)


def seed_worker(worker_id: int) -> None:
    """Seed Python's and NumPy's generators from the per-worker, per-epoch seed torch gives each worker."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def make_loader(dataset: Dataset, batch_size: int, train: bool, seed: int, world: World,
                num_workers: int, prefetch_factor: int, pin_memory: bool, persistent_workers: bool) -> DataLoader:
    """Training batches are shuffled and full, a different share per process; validation covers each image once.

    DistributedSampler serves a single process too (one replica needs no process group); its order depends
    only on seed and epoch, so a resumed run sees the same order the uninterrupted one would have.
    """
    sampler = (DistributedSampler(dataset, world.size, world.rank, shuffle=True, seed=seed, drop_last=True)
               if train else Shard(dataset, world))
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=train, num_workers=num_workers,
        pin_memory=pin_memory and world.device.type == "cuda",
        prefetch_factor=prefetch_factor if num_workers else None,
        persistent_workers=persistent_workers and num_workers > 0,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed + world.rank),  # a new worker base seed each epoch
    )


class OnDevice:
    """Moves uint8 batches to the device and normalises them there; keeps the loader's len and sampler."""

    def __init__(self, loader: DataLoader, device: torch.device):
        self.loader, self.device = loader, device
        self.sampler = loader.sampler
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the training order for this epoch."""
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        for images, labels in self.loader:
            images = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
            yield images, labels.to(self.device, non_blocking=True)
