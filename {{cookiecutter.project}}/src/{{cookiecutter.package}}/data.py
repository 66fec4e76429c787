"""Data sets: where the images come from (`data=`), the crops cut from them, and the skip policy for
unreadable files; loaders.py puts them together with the other data options.

Whatever the choices, a batch reaching the training step is (float images normalised on the device, labels):
workers produce uint8 HWC crops (or encoded bytes, for GPU decoders) and the device does the rest.
"""
import logging
import math
import multiprocessing
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from . import synth
from .config import ClearError, ConfigError
from .decoder import Box, Crop, Decoder, Unreadable
from .decoder.none import NoDecoder
from .distributed import World
from .faults import InjectedFault
from .format import Store, Stores

log = logging.getLogger(__name__)

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


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


class TrainCrop(Crop):
    """Random-resized-crop box (torchvision's sampling rule) and a coin flip for the horizontal mirror.

    Drawn with Python's `random`, which seed_worker seeds per worker and epoch: a tenth of the cost of
    torchvision's get_params, which matters once nothing is left to decode (format=tensor).
    """

    def __init__(self, size: int, scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)):
        self.size, self.scale = size, scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.ratio = ratio

    def full_detail_side(self) -> int:
        """The shorter side from which even the smallest crop spans `size` pixels each way: images resized to
        it first lose nothing the crops keep (a pack at that size trains on the same pixels, within resampling)."""
        return math.ceil(self.size / math.sqrt(self.scale[0] * min(self.ratio[0], 1 / self.ratio[1])))

    def __call__(self, width: int, height: int) -> tuple[Box, bool]:
        area = width * height
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(*self.log_ratio))
            box_width, box_height = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < box_width <= width and 0 < box_height <= height:
                left, top = random.randint(0, width - box_width), random.randint(0, height - box_height)
                return (left, top, left + box_width, top + box_height), random.random() < 0.5
        # Fallback: the central crop at the nearest allowed aspect ratio.
        aspect = width / height
        if aspect < self.ratio[0]:
            box_width, box_height = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            box_width, box_height = round(height * self.ratio[1]), height
        else:
            box_width, box_height = width, height
        left, top = (width - box_width) // 2, (height - box_height) // 2
        return (left, top, left + box_width, top + box_height), random.random() < 0.5


class CenterCrop(Crop):
    """The central square that resizing the shorter side to `resize` and cropping `size` would keep."""

    def __init__(self, size: int, resize: int):
        self.size, self.resize = size, resize

    def __call__(self, width: int, height: int) -> tuple[Box, bool]:
        side = self.size * min(width, height) / self.resize  # the crop's side in original pixels
        left, top = (width - side) / 2, (height - side) / 2
        return (left, top, left + side, top + side), False


class UnreadableImage(ClearError):
    """An image that does not decode, under data.on_error=raise."""


class WrongDataSet(ClearError):
    """Too many unreadable images: the data, not a few bad files."""


BAD_ALLOWED = 10  # unreadable images always skipped, however few were read: data.max_bad_fraction judges beyond
REPLACEMENTS = BAD_ALLOWED + 1  # images tried after an unreadable one; more than that many bad ones stop the run


class Images(Dataset):
    """A store's payloads through the decoder's worker transform; an unreadable one is skipped or raised.

    Indices come from the sampler, for training as (index, epoch): the random crop and flip of an image
    are then drawn from a generator seeded by (seed, epoch, index), whichever worker reads it, so a run
    resumed mid-epoch, with any worker count, sees the augmentation the uninterrupted run would have.
    """

    def __init__(self, store: Store, transform, on_error: str, max_bad_fraction: float = 0.01, seed: int = 0):
        if on_error not in ("skip", "raise"):
            raise ConfigError(f"data.on_error={on_error!r}: pick skip or raise")
        self.store, self.transform, self.on_error = store, transform, on_error
        self.max_bad_fraction, self.seed = max_bad_fraction, seed
        # In shared memory, so that every worker and every epoch adds to them: one flag per image, to count
        # a bad image once, and the images read and found unreadable, to judge the share.
        self.bad = multiprocessing.RawArray("b", len(store))
        self.counts = multiprocessing.Array("q", 2)  # reads, unreadable reads
        self.fail_at = -1  # faults.worker_error_at: the read (counted across workers, from 1) that raises
        self.read_delay_s = 0.0  # faults.read_delay_ms: a slow disk or decoder, on purpose

    def __len__(self) -> int:
        return len(self.store)

    def bad_flags(self) -> torch.Tensor:
        return torch.frombuffer(self.bad, dtype=torch.int8)

    def __getitem__(self, key: int | tuple[int, int]):
        index, epoch = key if isinstance(key, tuple) else (key, None)
        if epoch is not None:
            random.seed(hash((self.seed, epoch, index)))  # ints and tuples of them hash the same in every process
        for position in (index + offset for offset in range(min(REPLACEMENTS, len(self.store)))):
            position %= len(self.store)
            try:
                payload, label = self.store.read(position)
                item = self.transform(payload), label
            except Unreadable as err:
                self._count(unreadable=True)
                self._skip(position, err)
                continue
            self._count(unreadable=False)
            if self.read_delay_s:  # even time.sleep(0) costs a tenth of a millisecond
                time.sleep(self.read_delay_s)
            return item
        raise WrongDataSet(f"{REPLACEMENTS} images in a row from {self.store.name(index)} on are unreadable: is "
                           "this the data set you meant?")

    def _count(self, unreadable: bool) -> None:
        with self.counts.get_lock():
            self.counts[0] += 1
            self.counts[1] += unreadable
            reads, bad = self.counts[0], self.counts[1]
        if reads == self.fail_at:
            raise InjectedFault(f"faults.worker_error_at={reads}: the loader worker reading training image number "
                                f"{reads} of this run raised, as asked")
        if unreadable and bad > max(self.max_bad_fraction * reads, BAD_ALLOWED):
            raise WrongDataSet(f"{bad} of the {reads} images read so far are unreadable, more than "
                               f"data.max_bad_fraction={self.max_bad_fraction:g}: is this the data set you meant? "
                               "(raise data.max_bad_fraction to train on it anyway)")

    def _skip(self, position: int, err: Unreadable) -> None:
        name = self.store.name(position)
        if self.on_error == "raise":
            raise UnreadableImage(f"unreadable image {name}: {err} (data.on_error=skip would skip it)") from err
        if not self.bad[position]:
            log.warning("skipping unreadable image %s: %s", name, err)
        self.bad[position] = 1


@dataclass
class Splits:
    train: Images
    val: Images
    classes: list[str]
    decoder: Decoder

    def skipped_files(self, world: World) -> int:
        """Images found unreadable by any worker of any process, each counted once."""
        flags = torch.cat([self.train.bad_flags(), self.val.bad_flags()]).to(world.device, torch.int32)
        return int(world.sum(flags).count_nonzero())


def make_splits(source: Source, stores: Stores, decoder: Decoder, seed: int = 0) -> Splits:
    """Training and validation data sets: random crops for one, the deterministic centre crop for the other."""
    if stores.train.decoded and not isinstance(decoder, NoDecoder):
        raise ConfigError("format=tensor stores decoded pixels, so there is nothing to decode: pass decoder=none")
    if isinstance(decoder, NoDecoder) and not stores.train.decoded:
        raise ConfigError("decoder=none is for formats that store decoded pixels (format=tensor), and this one "
                          "stores encoded files: pick a decoder, such as decoder=turbojpeg")
    size, on_error, fraction = source.crop_size, source.on_error, source.max_bad_fraction
    return Splits(Images(stores.train, decoder.transform(TrainCrop(size)), on_error, fraction, seed),
                  Images(stores.val, decoder.transform(CenterCrop(size, source.val_resize)), on_error, fraction),
                  stores.classes, decoder)


class ToDevice:
    """A collated batch -> (normalised float images, labels) on the device; prefetchers choose when and where."""

    def __init__(self, decoder: Decoder, device: torch.device, non_blocking: bool,
                 memory_format: torch.memory_format = torch.contiguous_format):
        self.decoder, self.device, self.non_blocking, self.memory_format = decoder, device, non_blocking, memory_format
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    def __call__(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        images = self.decoder.upload(images, self.device, self.non_blocking)
        images = images.float().sub_(self.mean).div_(self.std).contiguous(memory_format=self.memory_format)
        return images, labels.to(self.device, non_blocking=self.non_blocking)
