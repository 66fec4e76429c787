"""The training and validation data sets: a store's images through the decoder's worker transform, the crops
cut from them, and the skip policy for unreadable files. loaders.py puts them together with the other data
options.
"""
import errno
import logging
import multiprocessing
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from ..contracts import Decoder, Store, Stores
from ..core.errors import ClearError, ConfigError
from ..core.distributed import World
from ..core.files import STORAGE_FAILED, errno_name
from .crops import CenterCrop, TrainCrop
from .decoder import Unreadable
from .sources import Source

log = logging.getLogger(__name__)


class UnreadableImage(ClearError):
    """An image that does not decode, under data.on_error=raise."""


class WrongDataSet(ClearError):
    """Too many unreadable images: the data, not a few bad files."""


class StorageFailed(ClearError):
    """A read that the disk, the mount or the server failed (core.files.STORAGE_FAILED), not the image: never skipped or
    counted as unreadable, since every image behind it would fail the same way; the run stops."""


class FileChanged(ClearError):
    """A file the listing had that is gone, is a folder now, or may not be read: the tree changed under the run."""


GONE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR})
FORBIDDEN = frozenset({errno.EACCES, errno.EPERM})


def unread(name: str, err: OSError, when_changed: str = Store.when_changed) -> ClearError | None:
    """The line a failed read of the data set's file `name` ends the run with, naming the file and what to do, where
    the storage failed or the file changed (`when_changed`: what the store says brings it back); None for another
    error, which keeps its traceback."""
    why = f"could not read {name}: {err.strerror} ({errno_name(err)})"
    if err.errno in STORAGE_FAILED:
        return StorageFailed(f"{why}: the storage failed, not the image: check the disk, the mount or the server it "
                             "is on")
    if err.errno in GONE:
        return FileChanged(f"{why}: the data set changed since it was opened: {when_changed}")
    if err.errno in FORBIDDEN:
        return FileChanged(f"{why}: this user may not read it: give it read permission (chmod a+r), or run as a user "
                           "who may")
    return None


BAD_ALLOWED = 10  # unreadable images always skipped, however small the data set: data.max_bad_fraction judges beyond
REPLACEMENTS = BAD_ALLOWED + 1  # images tried after an unreadable one; more than that many bad ones stop the run


class ReadTimes:
    """Where the loader's workers spend each image: reading its bytes from the store, or decoding, cropping and
    resizing them (in the transform, and in the collate where `timed` wraps it). Summed in shared memory by every
    worker; `sample()` gives per-image figures since its previous call."""
    FIGURES = {"loader/read_ms": "reading {:.2f} ms/image", "loader/decode_ms": "decoding {:.2f} ms/image",
               "loader/read_share": "{:.0f}% of a worker's time reading"}  # tag: the report's words and unit

    def __init__(self):
        self.totals = multiprocessing.Array("d", 3)  # seconds reading, seconds transforming, images
        self.last = (0.0, 0.0, 0.0)

    def add(self, reading_s: float, transforming_s: float, images: int = 1) -> None:
        with self.totals.get_lock():
            self.totals[0] += reading_s
            self.totals[1] += transforming_s
            self.totals[2] += images

    def timed(self, collate: Callable) -> "TimedCollate":
        """`collate`, its seconds counted as transforming: a CPU decoder crops and resizes a batch's images there."""
        return TimedCollate(collate, self)

    def sample(self) -> dict[str, float]:
        """`loader/read_ms` and `loader/decode_ms` per image, and `loader/read_share`, the percentage of a
        worker's time per image spent reading; zeros when no image was loaded since the last call (batches
        served from memory)."""
        with self.totals.get_lock():
            now = tuple(self.totals)
        reading, transforming, images = (new - old for new, old in zip(now, self.last))
        self.last = now
        return {"loader/read_ms": 1000 * reading / max(images, 1), "loader/decode_ms": 1000 * transforming / max(images, 1),
                "loader/read_share": 100 * reading / (reading + transforming) if images else 0.0}


class TimedCollate:
    def __init__(self, collate: Callable, times: ReadTimes):
        self.collate, self.times = collate, times

    def __call__(self, samples: list):
        start = time.perf_counter()
        batch = self.collate(samples)
        self.times.add(0.0, time.perf_counter() - start, images=0)
        return batch


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
                 split: str = "training", crop: TrainCrop | None = None):
        if on_error not in ("skip", "raise"):
            raise ConfigError(f"data.on_error={on_error!r}: pick skip or raise")
        self.store, self.transform, self.on_error = store, transform, on_error
        self.crop = crop  # the transform's crop, told each epoch as this process begins it
        self.max_bad_fraction, self.seed, self.split = max_bad_fraction, seed, split
        # In shared memory, so that every worker and every epoch sees them: one flag per image found unreadable,
        # and their count (whose lock also guards setting a flag).
        self.bad = multiprocessing.RawArray("b", len(store))
        self.bad_count = multiprocessing.Value("q", 0)
        self.shared_count = 0  # the flags all processes held at the last share_unreadable
        self.times = ReadTimes()
        self._epoch = None  # the last epoch this process read an image of

    def __len__(self) -> int:
        return len(self.store)

    @property
    def allowed_bad(self) -> float:
        """Unreadable images this split may hold: data.max_bad_fraction of it, and never fewer than BAD_ALLOWED."""
        return max(self.max_bad_fraction * len(self.store), BAD_ALLOWED)

    def bad_flags(self) -> torch.Tensor:
        return torch.frombuffer(self.bad, dtype=torch.int8)

    def __getitem__(self, key: int | tuple):
        """`key`: an index, or from the training sampler (index, epoch), with the run the order reads it with where
        it reads runs (sampling.EpochPlan.keys)."""
        index, epoch, *run = key if isinstance(key, tuple) else (key, None)
        if epoch is not None:
            random.seed(hash((self.seed, epoch, index)))  # ints and tuples of them hash the same in every process
            if epoch != self._epoch:  # this process's copy: each worker's first image of an epoch
                self.store.new_epoch()
                if self.crop is not None:
                    self.crop.set_epoch(epoch)
                self._epoch = epoch
        for position in (index + offset for offset in range(min(REPLACEMENTS, len(self.store)))):
            position %= len(self.store)
            try:
                start = time.perf_counter()
                payload, label = self.store.read(position, tuple(run) if run and position == index else None)
                read = time.perf_counter()
                item = self.transform(payload)
                self.times.add(read - start, time.perf_counter() - read)
                return item, label
            except Unreadable as err:
                self._skip(position, err)
            except OSError as err:
                if (failure := unread(self.store.name(position), err, self.store.when_changed)) is None:
                    raise
                raise failure from err
        raise WrongDataSet(f"{REPLACEMENTS} images in a row from {self.store.name(index)} on are unreadable: is "
                           "this the data set you meant?")

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

    def state_dict(self) -> dict[str, list[int]]:
        """The images of each split found unreadable: a checkpoint part (contracts.Stateful)."""
        return {"train": self.train.unreadable_state(), "val": self.val.unreadable_state()}

    def load_state_dict(self, state: dict[str, list[int]]) -> None:
        self.train.load_unreadable_state(state.get("train", []))
        self.val.load_unreadable_state(state.get("val", []))


def make_splits(source: Source, stores: Stores, decoder: Decoder, seed: int = 0) -> Splits:
    """Training and validation data sets: random crops for one, the deterministic centre crop for the other."""
    size, on_error, fraction = source.crop_size, source.on_error, source.max_bad_fraction
    crop = TrainCrop(source.train_crop_size, source.crop_scale, schedule=source.crop_schedule)
    return Splits(Images(stores.train, decoder.transform(crop), on_error, fraction, seed, "training", crop),
                  Images(stores.val, decoder.transform(CenterCrop(size, source.val_resize)), on_error, fraction,
                         split="validation"),
                  stores.classes, decoder)


