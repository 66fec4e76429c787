"""Where the images are read from: `format=<option>`, one module here each, holding its `Format` (contracts/), the
reader of its `Stores` and, for the packed ones, the writer `python -m <package>.pack` calls.

A packed data set is a folder holding one file per split and `pack.json`, written last, that names the
format, the classes and each file's size, so a truncated or foreign file is refused before training.
"""
import json
from pathlib import Path

import numpy as np

from ...contracts import Format, Store, Stores
from ...core.errors import ConfigError
from ...core.files import bytes_in

META = "pack.json"
SPLITS = ("train", "val")


class Packed(Store):
    """A split of a packed file; `name` is the file and the index within it."""
    when_changed = "put the file back, or pack the data set again"

    def __init__(self, path: Path, labels: np.ndarray):
        super().__init__(labels)
        self.path = path

    def name(self, index: int) -> str:
        return f"{self.path}[{index}]"

    def files(self, indices: list[int]) -> list[Path]:
        return [self.path]


def check_folder(folder: Path, writes: str = "write it with python -m {{ cookiecutter.package }}.pack", wanted: str = "folder") -> None:
    """Refuse, in one line, a format.path that is a file or does not exist; `writes` says how to make one, `wanted`
    what format.path may name."""
    if folder.is_file():
        raise ConfigError(f"format.path={folder} is a file; pass the {wanted} pack wrote (its pack.out, which holds "
                          f"{META})")
    if not folder.is_dir():
        raise ConfigError(f"format.path={folder} does not exist; {writes}")


def read_meta(folder: Path, format: str) -> dict:
    """pack.json of a packed folder, refusing a folder of another format or one whose files do not match it."""
    meta_path = folder / META
    check_folder(folder)
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{folder} has no {META}: it is not a packed data set, or its pack did not finish; write it "
                          "with python -m {{ cookiecutter.package }}.pack pack.out=<folder>") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{meta_path} is unreadable: {err}") from None
    if meta.get("format") != format:
        raise ConfigError(f"{folder} holds format={meta.get('format')}, not format={format}")
    for split in SPLITS:
        expected = meta["splits"][split]["bytes"]
        path = folder / meta["splits"][split]["file"]
        actual = bytes_in(path) if path.exists() else 0  # a file, or a split's folder of shards
        if actual != expected:
            raise ConfigError(f"{path} has {actual} bytes where {META} says {expected}: truncated or replaced; "
                              "pack it again")
    return meta


def split_file(folder: Path, meta: dict, split: str) -> Path:
    return folder / meta["splits"][split]["file"]


def open_packed(path: str, stage, format: str, reader) -> Stores:
    """The splits of a packed folder (staged first, if asked), each opened by `reader(file, meta, split)`."""
    folder = stage(Path(path).expanduser())
    meta = read_meta(folder, format)
    return Stores(*(reader(split_file(folder, meta, split), meta["splits"][split]) for split in SPLITS),
                  meta["classes"])


class PackedFile(Format):
    """A format whose pack is one file (or folder) per split beside pack.json, at `path`: its `kind` names it in
    pack.json, and `reader(file, split)` opens a split's file."""
    kind: str
    reader: type[Store]

    def __init__(self, path: str | None):
        self.path = path  # None where the format is only written (pack writes to pack.out)

    def stores(self, source, stage) -> Stores:
        return open_packed(self.path, stage, self.kind, self.reader)
