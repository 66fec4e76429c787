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


BAD_ALLOWED = 10  # unreadable images always skipped, however small the data set: data.max_bad_fraction judges beyond
REPLACEMENTS = BAD_ALLOWED + 1  # images tried after an unreadable one; more than that many bad ones stop the run


class Images(Dataset):
    """A store's payloads through the decoder's worker transform; an unreadable one is skipped or raised.

    Indices come from the sampler, for training as (index, epoch): the random crop and flip of an image
    are then drawn from a generator seeded by (seed, epoch, index), whichever worker reads it, so a run
    resumed mid-epoch, with any worker count, sees the augmentation the uninterrupted run would have.

    The skip policy judges the data set, not the order it is read in: it counts distinct unreadable
    images, however many times and by whichever worker, epoch or process they are read, and stops the run
    once they are more than data.max_bad_fraction of the split can ever allow. The same files get the same
    decision in every epoch and after a resume (the flags travel in the checkpoint).
    """

    def __init__(self, store: Store, transform, on_error: str, max_bad_fraction: float = 0.01, seed: int = 0,
                 split: str = "training"):
        if on_error not in ("skip", "raise"):
            raise ConfigError(f"data.on_error={on_error!r}: pick skip or raise")
        self.store, self.transform, self.on_error = store, transform, on_error
        self.max_bad_fraction, self.seed, self.split = max_bad_fraction, seed, split
        # In shared memory, so that every worker and every epoch sees them: one flag per image found unreadable,
        # and their count (whose lock also guards setting a flag).
        self.bad = multiprocessing.RawArray("b", len(store))
        self.bad_count = multiprocessing.Value("q", 0)
        self.shared_count = 0  # the flags all processes held at the last share_unreadable
        self.reads = multiprocessing.Value("q", 0)  # across workers, for faults.worker_error_at
        self.fail_at = -1  # faults.worker_error_at: the read (counted across workers, from 1) that raises
        self.read_delay_s = 0.0  # faults.read_delay_ms: a slow disk or decoder, on purpose

    def __len__(self) -> int:
        return len(self.store)

    @property
    def allowed_bad(self) -> float:
        """Unreadable images this split may hold: data.max_bad_fraction of it, and never fewer than BAD_ALLOWED."""
        return max(self.max_bad_fraction * len(self.store), BAD_ALLOWED)

    def bad_flags(self) -> torch.Tensor:
        return torch.frombuffer(self.bad, dtype=torch.int8)

    def __getitem__(self, key: int | tuple[int, int]):
        index, epoch = key if isinstance(key, tuple) else (key, None)
        if epoch is not None:
            random.seed(hash((self.seed, epoch, index)))  # ints and tuples of them hash the same in every process
        for position in (index + offset for offset in range(min(REPLACEMENTS, len(self.store)))):
            position %= len(self.store)
            self._count_read()
            try:
                payload, label = self.store.read(position)
                item = self.transform(payload), label
            except Unreadable as err:
                self._skip(position, err)
                continue
            if self.read_delay_s:  # even time.sleep(0) costs a tenth of a millisecond
                time.sleep(self.read_delay_s)
            return item
        raise WrongDataSet(f"{REPLACEMENTS} images in a row from {self.store.name(index)} on are unreadable: is "
                           "this the data set you meant?")

    def _count_read(self) -> None:
        with self.reads.get_lock():
            self.reads.value += 1
            reads = self.reads.value
        if reads == self.fail_at:
            raise InjectedFault(f"faults.worker_error_at={reads}: the loader worker reading training image number "
                                f"{reads} of this run raised, as asked")

    def _skip(self, position: int, err: Unreadable) -> None:
        name = self.store.name(position)
        if self.on_error == "raise":
            raise UnreadableImage(f"unreadable image {name}: {err} (data.on_error=skip would skip it)") from err
        with self.bad_count.get_lock():
            new = not self.bad[position]
            self.bad[position] = 1
            self.bad_count.value += new
            found = self.bad_count.value
        if new:
            log.warning("skipping unreadable image %s: %s", name, err)
        self.judge(found)

    def judge(self, found: int) -> None:
        """Stop the run once `found` distinct unreadable images are more than the split may hold."""
        if found > self.allowed_bad:
            raise WrongDataSet(f"{found} of the {len(self)} {self.split} images are unreadable, more than "
                               f"data.max_bad_fraction={self.max_bad_fraction:g} allows ({self.allowed_bad:g}): is "
                               "this the data set you meant? (raise data.max_bad_fraction to train on it anyway)")

    def adopt_unreadable(self, flags: torch.Tensor) -> None:
        """Take `flags` (every process's, combined) as this process's, and judge the split on them."""
        with self.bad_count.get_lock():
            self.bad_flags().copy_(flags.to(torch.int8))
            self.bad_count.value = self.shared_count = int(flags.count_nonzero())
        self.judge(self.shared_count)

    def unreadable_state(self) -> list[int]:
        """The images found unreadable: a resumed run starts with them, and counts none of them twice."""
        return self.bad_flags().nonzero().flatten().tolist()

    def load_unreadable_state(self, positions: list[int]) -> None:
        with self.bad_count.get_lock():
            flags = self.bad_flags()
            flags[positions] = 1
            self.bad_count.value = self.shared_count = int(flags.count_nonzero())


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

    def share_unreadable(self, world: World) -> None:
        """Every process holds, and judges the data set on, the unreadable images any of them found.

        One all-reduce of two numbers per call; the flags themselves cross only when some process found new ones.
        Alone, a process has nothing to share: its workers judged as they flagged.
        """
        if world.size == 1:
            return
        splits = (self.train, self.val)
        found = world.sum(torch.tensor([images.bad_count.value - images.shared_count for images in splits],
                                       device=world.device)).tolist()
        for images, new in zip(splits, found):
            if new:
                images.adopt_unreadable(world.any(images.bad_flags().to(world.device, torch.uint8)).cpu())

    def unreadable_state(self) -> dict[str, list[int]]:
        return {"train": self.train.unreadable_state(), "val": self.val.unreadable_state()}

    def load_unreadable_state(self, state: dict[str, list[int]]) -> None:
        self.train.load_unreadable_state(state.get("train", []))
        self.val.load_unreadable_state(state.get("val", []))


def make_splits(source: Source, stores: Stores, decoder: Decoder, seed: int = 0) -> Splits:
    """Training and validation data sets: random crops for one, the deterministic centre crop for the other."""
    if stores.train.decoded and not isinstance(decoder, NoDecoder):
        raise ConfigError("format=tensor stores decoded pixels, so there is nothing to decode: pass decoder=none")
    if isinstance(decoder, NoDecoder) and not stores.train.decoded:
        raise ConfigError("decoder=none is for formats that store decoded pixels (format=tensor), and this one "
                          "stores encoded files: pick a decoder, such as decoder=turbojpeg")
    size, on_error, fraction = source.crop_size, source.on_error, source.max_bad_fraction
    return Splits(Images(stores.train, decoder.transform(TrainCrop(size)), on_error, fraction, seed, "training"),
                  Images(stores.val, decoder.transform(CenterCrop(size, source.val_resize)), on_error, fraction,
                         split="validation"),
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
