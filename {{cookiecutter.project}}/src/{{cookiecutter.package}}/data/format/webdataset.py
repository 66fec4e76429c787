"""`format=webdataset`: WebDataset tar shards, `<key>.jpg|jpeg|png|webp` beside `<key>.cls` (the layout timm and
OpenCLIP write), read by index, so that the sampler, the coverage check, resume and DDP sharding work on them as on
every other format.

A split's shards are indexed once: every sample's shard, the offset and size of its image, and its label from its
`.cls`. The index is kept beside the shards in `_index-<digest>.npz` (the digest names each shard and its size), so
a later start reads no shard; where the folder is read-only, each start indexes again in memory.

The layout is timm's: the shards and `_info.json` (splits -> name, num_samples, shard_lengths, filenames) in one
folder. pack writes the same, its shards in `train/` and `val/`, and pack.json with the class names. wids,
webdataset's own indexed reader, left the package at 1.0: its index was each member's offset and size from the
standard library's tarfile, which is what this one keeps.
"""
import hashlib
import json
import logging
import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from ...contracts import Format, Store, Stores
from ...core.errors import ConfigError
from . import META, SPLITS, check_folder

log = logging.getLogger(__name__)

INFO = "_info.json"
INFO_SPLITS = {"train": "train", "val": "validation"}  # each split's name in _info.json, as timm's shards have it
IMAGES = ("jpg", "jpeg", "png", "webp")
FIELDS = ("shard", "offset", "size", "label")  # the index: one row per sample


def shard_names(folder: Path, info: dict | None, split: str, pattern: str | None) -> list[str]:
    """The split's shards under `folder`: those `pattern` expands to, or else those _info.json lists."""
    if pattern:
        from braceexpand import braceexpand  # webdataset's own dependency
        names = list(braceexpand(pattern))
    elif info is not None and INFO_SPLITS[split] in info.get("splits", {}):
        names = info["splits"][INFO_SPLITS[split]]["filenames"]
    else:
        raise ConfigError(f"{folder} has no {INFO} listing its {INFO_SPLITS[split]} shards: it is not a packed data set, "
                          "or pass the shards' names, as in "
                          f"format.{split}_shards='{split}-" "{0000..0099}.tar'")  # one brace each: the bake is Jinja
    for name in names:
        if not (folder / name).is_file():
            where = f"format.{split}_shards={pattern}" if pattern else f"{folder / INFO}"
            raise ConfigError(f"{folder / name} does not exist, though {where} names it: fix the pattern, or copy "
                              "the shard again")
    return names


def index_shard(path: Path) -> np.ndarray:
    """One row of FIELDS per sample of the shard at `path`, in the order it holds them (its shard column 0)."""
    samples: dict[str, dict] = {}  # key -> extension -> (offset, size), and the label
    try:
        end = path.stat().st_size
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                if member.offset_data + member.size > end:
                    raise tarfile.ReadError(f"{member.name} runs past the end of the file")
                folder, _, base = member.name.rpartition("/")
                stem, _, extension = base.partition(".")  # webdataset's key: the name up to its first dot
                sample = samples.setdefault(f"{folder}/{stem}", {})
                if extension.lower() == "cls":
                    sample["label"] = tar.extractfile(member).read()
                elif extension.lower() in IMAGES:
                    sample["image"] = (member.offset_data, member.size)
    except tarfile.TarError as err:
        raise ConfigError(f"{path} is not a readable tar shard ({err}): truncated or damaged; write it again") from None
    rows = []
    for key, sample in samples.items():
        if "image" not in sample:
            raise ConfigError(f"{path}: sample {key.lstrip('/')} has no image ({', '.join(IMAGES)}); drop it from "
                              "the shard or add its image")
        if "label" not in sample:
            raise ConfigError(f"{path}: sample {key.lstrip('/')} has no .cls, where every sample keeps its class "
                              "number; write the shard again with one")
        try:
            label = int(sample["label"])
        except ValueError:
            raise ConfigError(f"{path}: {key.lstrip('/')}.cls holds {sample['label'][:20]!r}, not a class number; "
                              "write the shard again") from None
        rows.append((0, *sample["image"], label))
    return np.array(rows, dtype=np.int64).reshape(-1, len(FIELDS))


def split_index(folder: Path, names: list[str]) -> np.ndarray:
    """The index of the shards `names` under `folder`: the one kept there, or made now and kept where it can be.
    The index kept is named by each shard's name, size and time of change: a shard rewritten since is indexed again."""
    stats = [(folder / name).stat() for name in names]
    digest = hashlib.sha1("".join(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                                  for name, stat in zip(names, stats)).encode())
    kept = folder / f"_index-{digest.hexdigest()[:12]}.npz"
    try:
        with np.load(kept) as saved:
            return np.stack([saved[field] for field in FIELDS], axis=1)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # not made yet, or damaged: made again
        pass
    rows = []
    for shard, name in enumerate(names):
        rows.append(index_shard(folder / name))
        rows[-1][:, 0] = shard
    index = np.concatenate(rows) if rows else np.zeros((0, len(FIELDS)), np.int64)
    partial = kept.with_name(f".{kept.name}.{os.getpid()}")  # another rank may be writing the same index
    try:
        with partial.open("wb") as file:
            np.savez(file, **{field: index[:, column] for column, field in enumerate(FIELDS)})
        partial.replace(kept)  # a start that finds it finds it whole
    except OSError as err:
        partial.unlink(missing_ok=True)
        log.info("the shard index is not kept in %s (%s): each start indexes the shards again", folder, err)
    return index


def check_lengths(folder: Path, info: dict | None, split: str, names: list[str], index: np.ndarray) -> None:
    """Each shard holds as many samples as _info.json says it does, where it lists the shard."""
    if info is None or INFO_SPLITS[split] not in info.get("splits", {}):
        return
    listed = info["splits"][INFO_SPLITS[split]]
    expected = dict(zip(listed["filenames"], listed.get("shard_lengths", [])))
    counts = np.bincount(index[:, 0], minlength=len(names))
    for name, count in zip(names, counts):
        if name in expected and expected[name] != count:
            raise ConfigError(f"{folder / name} holds {count} samples where {folder / INFO} says {expected[name]}: "
                              "truncated or replaced; copy or write it again")


class Shards(Store):
    """One split's shards, each sample read at its offset in its shard."""

    def __init__(self, paths: list[Path], index: np.ndarray):
        super().__init__(index[:, 3].copy())
        # An array, like the index, where a list would be a Python object per shard (as many as the images, at worst).
        self.paths = np.array([str(path) for path in paths])
        self.shard, self.offset, self.size = index[:, 0], index[:, 1], index[:, 2]
        self.starts = np.searchsorted(self.shard, np.arange(len(paths)))  # each shard's first sample

    def payload(self, index: int) -> bytes:
        # Opened at each read: a split of thousands of shards would hold more files open than a process may.
        with open(self.paths[self.shard[index]], "rb") as file:
            return os.pread(file.fileno(), int(self.size[index]), int(self.offset[index]))

    def name(self, index: int) -> str:
        shard = self.shard[index]
        return f"{self.paths[shard]}[{index - self.starts[shard]}]"

    def files(self, indices: list[int]) -> list[Path]:
        return [Path(self.paths[shard]) for shard in np.unique(self.shard[indices])]


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path} is unreadable: {err}") from None


def open_shards(folder: Path, patterns: dict[str, str | None]) -> Stores:
    """Both splits of the shards in `folder`; the class names from pack.json, else numbered."""
    check_folder(folder, "write it with python -m {{ cookiecutter.package }}.pack format=webdataset "
                 "pack.out=<folder>, or pass your shards' folder")
    meta = read_json(folder / META)  # pack's; a folder of someone else's shards has none
    if meta is not None and meta.get("format") != "webdataset":
        raise ConfigError(f"{folder} holds format={meta.get('format')}, not format=webdataset")
    info, stores = read_json(folder / INFO), []
    for split in SPLITS:
        names = shard_names(folder, info, split, patterns[split])
        index = split_index(folder, names)
        check_lengths(folder, info, split, names, index)
        stores.append(Shards([folder / name for name in names], index))
    classes = meta["classes"] if meta else [str(label) for label in range(
        1 + max((int(store.labels.max()) for store in stores if len(store)), default=0))]
    return Stores(*stores, classes)


def extension(data: bytes) -> str:
    """What the name of an image's member says it is, from its first bytes, for readers that go by the name."""
    if data.startswith(b"\x89PNG"):
        return "png"
    return "webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else "jpg"


class Webdataset(Format):
    suffix = ""  # each split is a folder of shards

    def __init__(self, path: str | None, train_shards: str | None = None, val_shards: str | None = None):
        self.path, self.patterns = path, {"train": train_shards, "val": val_shards}

    def stores(self, source, stage) -> Stores:
        return open_shards(stage(Path(self.path).expanduser()), self.patterns)

    def write(self, path: Path, records, chunk_mb: float) -> None:
        """One split as shards of about `chunk_mb` megabytes in the folder `path`."""
        import webdataset
        path.mkdir()
        # mtime=0: packing the same tree twice writes the same shards.
        with webdataset.ShardWriter(str(path / "%06d.tar"), maxsize=max(1, int(chunk_mb * 2**20)), maxcount=10**9,
                                    verbose=0, mtime=0) as shards:
            for index, (data, label) in enumerate(records):
                shards.write({"__key__": f"{index:09d}", extension(data): data, "cls": label})

    def publish(self, written: Path, out: str) -> None:
        """Index the shards pack wrote (the index kept, so that training reads none at its first start) and list
        them in _info.json, timm's way, before the pack goes to `out`."""
        info = {"name": Path(out).name, "splits": {}}
        for split in SPLITS:
            names = sorted(str(shard.relative_to(written)) for shard in (written / split).glob("*.tar"))
            counts = np.bincount(split_index(written, names)[:, 0], minlength=len(names))
            info["splits"][INFO_SPLITS[split]] = {"name": INFO_SPLITS[split], "num_samples": int(counts.sum()),
                                                  "filenames": names, "shard_lengths": counts.tolist()}
        (written / INFO).write_text(json.dumps(info, indent=1))
        super().publish(written, out)
