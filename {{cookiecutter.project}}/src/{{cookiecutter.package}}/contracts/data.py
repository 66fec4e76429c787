"""The data options' contracts, in the order a training batch meets them (../data/README.md): the crop, the
store a format builds, the order, the decoder and its augmentation, the staging, the loader and the prefetcher."""
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import default_collate

Box = tuple[float, float, float, float]  # left, top, right, bottom, in pixels of the full-size image
Run = tuple[int, int]  # consecutive records start..stop-1, which one loader worker reads in one request
Batch = tuple[torch.Tensor, torch.Tensor]  # (images, labels), as the training step takes them


class Crop(ABC):
    """Where to cut an image of a given size, and the side of the square the cut is resized to."""
    size: int

    @abstractmethod
    def __call__(self, width: int, height: int) -> tuple[Box, bool]:
        """(box, flip) for an image of width x height."""


class Store(ABC):
    """One split of a format: `len`, a label and a payload per index (encoded bytes, or an HWC uint8 array for a
    format whose facts say `holds_pixels`).

    A file is opened lazily in the process that reads it, at its first read: a handle opened in the parent
    and inherited through fork shares its file offset and library state between processes.
    """
    # Where reading one record alone reads many more (a Parquet row group), what it reads, in words: such a store
    # trains only under an order that reads runs of records at once, and the loader assembly refuses the others.
    single_read: str | None = None
    # What to do where a file this store read from is gone mid-run: the line that stops the run says it.
    when_changed = "put the file back, or write the data set again"

    def __init__(self, labels: np.ndarray):
        self.labels = labels
        self._pid = None

    def __len__(self) -> int:
        return len(self.labels)

    def read(self, index: int, run: Run | None = None) -> tuple[Any, int]:
        """(payload, label) of one image; `run`: the records the epoch's order reads it with, where the order reads
        runs (a store that reads them at once, order.BlockReads, takes it; the others read the image alone)."""
        self.ensure_open()
        return self.payload(index), int(self.labels[index])

    def ensure_open(self) -> None:
        if self._pid != os.getpid():
            if self._pid is not None:  # opened in the process this one was forked from (it read with no workers)
                self.close()
            self.open()
            self._pid = os.getpid()

    def open(self) -> None:
        """Open the file in the calling process; a store of separate files has nothing to open."""

    def close(self) -> None:
        """In a forked process, let go of what `open` opened in its parent: a library whose handles must not cross
        fork (LMDB refuses to open the file again while one is open) gets a handle of this process's own."""

    @abstractmethod
    def payload(self, index: int) -> Any:
        """The stored bytes or pixels of one image."""

    def new_epoch(self) -> None:
        """An epoch begins in this process: forget whatever reads of the last one kept for later reads."""

    def payloads(self, start: int, stop: int) -> list[Any]:
        """The payloads of images start..stop-1, in one request where the format's facts say `reads_runs`."""
        return [self.payload(index) for index in range(start, stop)]

    @abstractmethod
    def name(self, index: int) -> str:
        """What an error message calls this image."""

    def files(self, indices: list[int]) -> list[Path]:
        """The local files that hold the images at `indices`, which bench's storage probe drops from the page
        cache before it reads them; none for a store that is not in local files."""
        return []

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if not key.startswith("_")} | {"_pid": None}


@dataclass
class Stores:
    """What a `Format` opens: both splits, the class names and, for a format that streams its training split
    itself, that split's loader factory: train_loader(images, *, world, batch_size, seed, collate,
    worker_init_fn, num_workers, prefetch_factor, pin_memory, persistent_workers) -> ResumableLoader."""
    train: Store
    val: Store
    classes: list[str]
    train_loader: Callable[..., "ResumableLoader"] | None = None


class Format(ABC):
    """One storage kind, read and written (FFCV's `Field`): a `format` option builds one from its settings. Training
    asks it for both splits' `Stores`; `pack` writes a tree into it, split by split, where its facts say `packed`."""
    suffix = ""  # the name pack gives a split's file after the split's own: train<suffix> (a folder of chunks: none)

    @abstractmethod
    def stores(self, source: Any, stage: "Staging") -> Stores:
        """Both splits to train on: the tree of `source` (data.root), or the pack at the format's path; a local one
        staged first (`stage` gives where to read it from)."""

    def write(self, path: Path, records: Iterable[tuple[Any, int]], chunk_mb: float) -> None:
        """One split's (payload, label) records, in their order, into `path`; pack runs it in a child process.
        `chunk_mb`: the size of each piece, for a format that streams its pack in pieces; the others ignore it."""
        raise NotImplementedError(f"{type(self).__name__} is not written by pack: its facts do not say packed")

    def exists(self, out: str) -> bool:
        """Whether a pack is at `out` already, which pack leaves alone unless told to overwrite it."""
        return Path(out).exists()

    def publish(self, written: Path, out: str) -> None:
        """The pack written whole in the folder `written`, now at `out`: renamed over whatever `out` held, so that no
        half-written pack is ever at `out`."""
        if Path(out).exists():
            shutil.rmtree(out)
        written.rename(out)


@dataclass(frozen=True)
class Layout:
    """Who reads an epoch: the processes, the loader workers of each in rank order (1 for none), and the images
    per batch. Every process holds the same layout, agreed at start (sampling.agreed_layout)."""
    processes: int
    workers: tuple[int, ...]  # one count for every process also reads as that count in each
    batch_size: int

    def __post_init__(self):
        workers = (self.workers,) * self.processes if isinstance(self.workers, int) else tuple(self.workers)
        object.__setattr__(self, "workers", tuple(max(1, count) for count in workers))


@dataclass(frozen=True)
class EpochOrder:
    """One epoch's order: a permutation of the data set's indices and, for an order that reads runs of records,
    the run each position's image is read with (`Run`, as two arrays beside the indices)."""
    indices: np.ndarray  # int64
    run_starts: np.ndarray | None = None
    run_stops: np.ndarray | None = None


class Order(ABC):
    """In which order an epoch visits the training images, and what the workers read them from."""

    @abstractmethod
    def draw(self, size: int, generator: torch.Generator, layout: Layout) -> EpochOrder:
        """One epoch's order of range(size), drawn from `generator`. Cut into micro-batches of the layout's batch
        size, process r trains on every processes-th micro-batch from r, and its k-th batch is made by its worker
        k % workers[r] (the DataLoader's turn)."""

    def reads(self, store: Store) -> Store:
        """What the workers read from: `store`, or a view of it that reads this order's runs at once."""
        return store

    def on_another_layout(self, began: Layout, now: Layout) -> str | None:
        """What a run resumed on another layout than its epoch `began` with changes, in one line for the log; None
        for an order drawn the same for any layout."""
        return None


class Decoder(ABC):
    """What the data pipeline asks of every decoder: a worker transform, a collate, and the uploads to the device."""
    # Batches a decoder that decodes beside the training process (DALI's executor) keeps queued while the host takes
    # the one before them: above 0, the host can read the files itself while the decoder works (data/workers.py).
    queued_batches = 0

    @abstractmethod
    def transform(self, crop: Crop) -> Callable:
        """What the loader's workers apply to a file's bytes (or, for a decoder that takes pixels, to them)."""

    def collate(self, samples: list):
        return default_collate(samples)

    def uploads(self, batches: Iterable, device: torch.device, non_blocking: bool
                ) -> Iterator[tuple[torch.Tensor, Any]]:
        """Collated (images, labels) batches -> (uint8 NCHW images on `device`, labels), in their order: the one way a
        batch reaches the device, which `ToDevice` (data/device.py) normalises. A decoder that decodes on the device
        does it here, and may start the next batch before it hands over this one (`queued_batches`)."""
        for images, labels in batches:
            yield images.to(device, non_blocking=non_blocking).permute(0, 3, 1, 2), labels

    def check_device(self, device: torch.device) -> None:
        """Refuse at start-up a device this decoder cannot feed."""


class Augment(Protocol):
    """An `augment` option's policy: the option builds the training transform wrapped with it (data/augment.py), or the
    transform as it is."""

    def __call__(self, pixels: np.ndarray, seed: int) -> None:
        """Change a training crop's HWC uint8 RGB pixels in place, drawing at random only from `seed`, which the
        crop's (seed, epoch, image) gives."""


class Staging(Protocol):
    def __call__(self, source: Path) -> Path:
        """Where to read `source` from: a copy of it, or itself."""


class Trace(Protocol):
    """Which images a loader's batches held of the epoch so far (data/coverage.py's EpochTrace), for the check at its
    end that every image was trained once."""

    def counts(self, size: int) -> np.ndarray:
        """How many times each of the `size` images was taken."""


class Uploader(Protocol):
    """Collated batches to normalised float images and labels on `device` (data/device.py's ToDevice): the one way
    a prefetcher gets each batch there."""
    device: torch.device

    def stream(self, batches: Iterable) -> Iterator[Batch]: ...


class ResumableLoader(Protocol):
    """A training loader that knows where an epoch stands, so that a resumed run trains each image left once."""

    def __iter__(self) -> Iterator: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int, skip_images: int = 0) -> None:
        """Shuffle for `epoch`, leaving out the first `skip_images` images all processes trained on; len is then
        the batches left."""

    def state(self, epoch: int, images_done: int) -> dict:
        """What it needs, beyond the epoch and the images all processes trained on, to resume there; asked of it
        rather than read from it, since a prefetcher runs ahead of the training step."""

    def load_state(self, state: dict) -> None:
        """Take a `state` back, before the `set_epoch` of the epoch it was saved in."""

    def coverage(self) -> Trace | None:
        """What this process has taken of the epoch so far (data/coverage.py), or None for a loader that cannot
        tell which images its batches hold."""


class Prefetcher(ABC):
    """How batches reach the device: wraps a loader, keeps its len and its place in the epoch, and yields
    (normalised images, labels) on the device, made by `to_device`."""

    def __init__(self, loader: ResumableLoader, to_device: Uploader):
        self.loader, self.to_device = loader, to_device

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int, skip_images: int = 0) -> None:
        self.loader.set_epoch(epoch, skip_images)

    def state(self, epoch: int, images_done: int) -> dict:
        return self.loader.state(epoch, images_done)

    def load_state(self, state: dict) -> None:
        self.loader.load_state(state)

    def coverage(self) -> Trace | None:
        return self.loader.coverage()

    @abstractmethod
    def __iter__(self) -> Iterator[Batch]:
        """The epoch's batches, on the device."""

