"""Where the images are read from: `format=folder|hdf5|lmdb|tensor|litdata`; `python -m <package>.pack` writes the packed ones.

A packed data set is a folder holding one file per split and `pack.json`, written last, that names the
format, the classes and each file's size, so a truncated or foreign file is refused before training.
Packed files are opened lazily in each loader worker: a handle opened in the parent and inherited
through fork shares its file offset and library state between processes.
"""
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import ConfigError

META = "pack.json"
SPLITS = ("train", "val")


class Store:
    """One split: `len`, a label and a payload per index (encoded bytes, or an HWC uint8 array if `decoded`)."""
    decoded = False

    def __init__(self, labels: np.ndarray):
        self.labels = labels
        self._pid = None

    def __len__(self) -> int:
        return len(self.labels)

    def read(self, index: int) -> tuple[object, int]:
        """(payload, label) of one image."""
        if self._pid != os.getpid():  # first read in this process: open here, never inherit a handle
            self.open()
            self._pid = os.getpid()
        return self.payload(index), int(self.labels[index])

    def open(self) -> None:
        """Open the file in the calling process."""

    def payload(self, index: int):
        raise NotImplementedError

    def name(self, index: int) -> str:
        """What an error message calls this image."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if not key.startswith("_")} | {"_pid": None}


class Packed(Store):
    """A split of a packed file; `name` is the file and the index within it."""

    def __init__(self, path: Path, labels: np.ndarray):
        super().__init__(labels)
        self.path = path

    def name(self, index: int) -> str:
        return f"{self.path}[{index}]"


def read_meta(folder: Path, format: str) -> dict:
    """pack.json of a packed folder, refusing a folder of another format or one whose files do not match it."""
    meta_path = folder / META
    if not folder.is_dir():
        raise ConfigError(f"format.path={folder} does not exist; "
                          "write it with python -m {{ cookiecutter.package }}.pack")
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{folder} has no {META}: it is not a packed data set, or its pack did not finish") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{meta_path} is unreadable: {err}") from None
    if meta.get("format") != format:
        raise ConfigError(f"{folder} holds format={meta.get('format')}, not format={format}")
    for split in SPLITS:
        expected = meta["splits"][split]["bytes"]
        path = folder / meta["splits"][split]["file"]
        actual = path.stat().st_size if path.exists() else 0
        if actual != expected:
            raise ConfigError(f"{path} has {actual} bytes where {META} says {expected}: truncated or replaced; "
                              "pack it again")
    return meta


def split_file(folder: Path, meta: dict, split: str) -> Path:
    return folder / meta["splits"][split]["file"]


@dataclass
class Stores:
    train: Store
    val: Store
    classes: list[str]
    # A format that shards, shuffles and keeps its own place in the training split (litdata) brings its loader:
    # train_loader(images, *, batch_size, seed, collate, worker_init_fn, num_workers, prefetch_factor, pin_memory,
    # persistent_workers), keywords as DataLoader's.
    train_loader: Callable | None = None


def open_packed(path: str, stage, format: str, reader) -> Stores:
    """The splits of a packed folder (staged first, if asked), each opened by `reader(file, meta, split)`."""
    folder = stage(Path(path).expanduser())
    meta = read_meta(folder, format)
    return Stores(*(reader(split_file(folder, meta, split), meta["splits"][split]) for split in SPLITS),
                  meta["classes"])
