"""`format=webdataset`: WebDataset tar shards, `<key>.jpg|jpeg|png|webp` beside `<key>.cls` (the layout timm and
OpenCLIP write), read by index, so that the sampler, the coverage check, resume and DDP sharding work on them as on
every other format.

The shards are in a local folder, at an S3 prefix or at an HTTP(S) address (data/format/locations.py). A split's
shards are indexed once per node: every sample's shard, the offset and size of its image, and its label from its
`.cls`. The index is kept in `_index-<names>-<versions>.npz` (digests of the shards' names, and of each one's size
and version: for a local shard its mtime, ctime and inode, for a remote one its ETag or Last-Modified), beside local
shards and in format.cache_dir for remote ones, so a later start reads no shard; where neither can be written, or a
server gives no version, each start indexes again in memory. Remote shards are read by byte range: one request per
image, or one per shard a run of records spans under order=blocks, which reads a block of consecutive samples at
once.

The layout is timm's: the shards and `_info.json` (splits -> name, num_samples, shard_lengths, filenames) in one
folder. pack writes the same, its shards in `train/` and `val/`, and pack.json with the class names. wids,
webdataset's own indexed reader, left the package at 1.0: its index was each member's offset and size from the
standard library's tarfile, which is what this one keeps.
"""
import hashlib
import json
import logging
import tarfile
import zipfile
from contextlib import closing
from pathlib import Path

import numpy as np

from ...contracts import Format, Store, Stores
from ...core.errors import ConfigError
from ...core.files import WriteError, one_process_at_a_time, write_atomic
from . import META, SPLITS, check_folder, s3
from .locations import Local, location, said

log = logging.getLogger(__name__)

INFO = "_info.json"
INFO_SPLITS = {"train": "train", "val": "validation"}  # each split's name in _info.json, as timm's shards have it
IMAGES = ("jpg", "jpeg", "png", "webp")
FIELDS = ("shard", "offset", "size", "label")  # the index: one row per sample


def shard_names(where, info: dict | None, split: str, pattern: str | None) -> dict[str, tuple[int, str]]:
    """The split's shards at `where` (a location), those `pattern` expands to or else those _info.json lists, each
    with its size and version."""
    if pattern:
        from braceexpand import braceexpand  # webdataset's own dependency
        names = list(braceexpand(pattern))
    elif info is not None and INFO_SPLITS[split] in info.get("splits", {}):
        names = info["splits"][INFO_SPLITS[split]]["filenames"]
    else:
        raise ConfigError(f"{where.where('')} has no {INFO} listing its {INFO_SPLITS[split]} shards: it is not a "
                          "packed data set, or pass the shards' names, as in "
                          f"format.{split}_shards='{split}-" "{0000..0099}.tar'")  # one brace each: the bake is Jinja
    stats = {}
    for name in names:
        stats[name] = where.stat(name)
        if stats[name] is None:
            named_by = f"format.{split}_shards={pattern}" if pattern else where.where(INFO)
            raise ConfigError(f"{where.where(name)} does not exist, though {named_by} names it: fix the pattern, or "
                              "copy the shard again")
    return stats


def index_shard(where, name: str, size: int) -> np.ndarray:
    """One row of FIELDS per sample of the shard `name` (`size` bytes) at `where`, in the order it holds them (its
    shard column 0). A local shard is read by its headers alone; a remote one streams through once."""
    samples: dict[str, dict] = {}  # key -> extension -> (offset, size), and the label
    try:
        with closing(where.stream(name)) as file, tarfile.open(fileobj=file, mode="r|" if where.remote else "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                if member.offset_data + member.size > size:
                    raise tarfile.ReadError(f"{member.name} runs past the end of the file")
                folder, _, base = member.name.rpartition("/")
                stem, _, extension = base.partition(".")  # webdataset's key: the name up to its first dot
                sample = samples.setdefault(f"{folder}/{stem}", {})
                if extension.lower() == "cls":
                    sample["label"] = tar.extractfile(member).read()
                elif extension.lower() in IMAGES:
                    sample["image"] = (member.offset_data, member.size)
    except (tarfile.TarError, EOFError) as err:
        raise ConfigError(f"{where.where(name)} is not a readable tar shard ({err or 'it ends early'}): truncated or "
                          "damaged; write it again") from None
    rows = []
    for key, sample in samples.items():
        if "image" not in sample:
            raise ConfigError(f"{where.where(name)}: sample {key.lstrip('/')} has no image ({', '.join(IMAGES)}); "
                              "drop it from the shard or add its image")
        if "label" not in sample:
            raise ConfigError(f"{where.where(name)}: sample {key.lstrip('/')} has no .cls, where every sample keeps "
                              "its class number; write the shard again with one")
        try:
            label = int(sample["label"])
        except ValueError:
            raise ConfigError(f"{where.where(name)}: {key.lstrip('/')}.cls holds {sample['label'][:20]!r}, not a "
                              "class number; write the shard again") from None
        rows.append((0, *sample["image"], label))
    return np.array(rows, dtype=np.int64).reshape(-1, len(FIELDS))


def split_index(where, stats: dict[str, tuple[int, str]], kept_in: Path) -> np.ndarray:
    """The index of the shards `stats` names at `where`: the one kept in the folder `kept_in`, or made now and kept
    there where it can be. An index is kept under its shards' names and stamped with each one's size and version,
    so that a shard rewritten since is indexed again and the index it replaces removed. The first process of a node
    to come indexes; the others wait for it, then read what it kept. Where a server gives a shard no version, no
    index is kept, since none could tell a rewritten shard."""
    if unversioned := [name for name, (_, version) in stats.items() if not version]:
        more = len(unversioned) - 1
        log.warning("%s%s: no ETag or Last-Modified, so a kept index could not tell a rewritten shard; none is kept, and "
                    "each process indexes the shards at each start", where.where(unversioned[0]),
                    f" and {more} more shards" if more else "")
        return index_shards(where, stats)
    names = hashlib.sha1("".join(f"{name}\n" for name in stats).encode()).hexdigest()[:12]
    versions = hashlib.sha1("".join(f"{name}\0{size}\0{version}\n" for name, (size, version) in stats.items()).encode())
    kept = kept_in / f"_index-{names}-{versions.hexdigest()[:12]}.npz"
    with one_process_at_a_time(kept_in):
        try:
            with np.load(kept) as saved:
                return np.stack([saved[field] for field in FIELDS], axis=1)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # not made yet, or damaged: made again
            pass
        index = index_shards(where, stats)
        keep(index, kept)
    return index


def index_shards(where, stats: dict[str, tuple[int, str]]) -> np.ndarray:
    rows = []
    for shard, (name, (size, _)) in enumerate(stats.items()):
        rows.append(index_shard(where, name, size))
        rows[-1][:, 0] = shard
    return np.concatenate(rows) if rows else np.zeros((0, len(FIELDS)), np.int64)


def keep(index: np.ndarray, kept: Path) -> None:
    """`index` in the file `kept`, written whole under another name first; the indexes of the same shards' older
    versions removed."""
    def write(temporary: Path) -> None:
        with temporary.open("wb") as file:  # a file, since np.savez adds .npz to a name that lacks it
            np.savez(file, **{field: index[:, column] for column, field in enumerate(FIELDS)})

    try:
        write_atomic(kept, write)
        for stale in kept.parent.glob(f"{kept.name.rsplit('-', 1)[0]}-*.npz"):
            if stale != kept:
                stale.unlink(missing_ok=True)
    except (WriteError, OSError) as err:
        log.info("the shard index is not kept in %s (%s): each start indexes the shards again", kept.parent, err)


def check_lengths(where, info: dict | None, split: str, names: list[str], index: np.ndarray) -> None:
    """Each shard holds as many samples as _info.json says it does, where it lists the shard."""
    if info is None or INFO_SPLITS[split] not in info.get("splits", {}):
        return
    listed = info["splits"][INFO_SPLITS[split]]
    expected = dict(zip(listed["filenames"], listed.get("shard_lengths", [])))
    counts = np.bincount(index[:, 0], minlength=len(names))
    for name, count in zip(names, counts):
        if name in expected and expected[name] != count:
            raise ConfigError(f"{where.where(name)} holds {count} samples where {where.where(INFO)} says "
                              f"{expected[name]}: truncated or replaced; copy or write it again")


class Shards(Store):
    """One split's shards, each sample read at its offset in its shard."""
    when_changed = "put the shard back, or write the shards again: the next start indexes them anew"

    def __init__(self, where, names: list[str], index: np.ndarray):
        super().__init__(index[:, 3].copy())
        self.where = where
        # An array, like the index, where a list would be a Python object per shard (as many as the images, at worst).
        self.names = np.array(names)
        self.shard, self.offset, self.size = index[:, 0], index[:, 1], index[:, 2]
        self.starts = np.searchsorted(self.shard, np.arange(len(names)))  # each shard's first sample

    def payload(self, index: int) -> bytes:
        return self.where.read(self.names[self.shard[index]], int(self.offset[index]), int(self.size[index]))

    def payloads(self, start: int, stop: int) -> list[bytes]:
        """One read per shard the records start..stop-1 span: from the first image's start to the last one's end,
        labels and headers between them included."""
        payloads, shards = [], self.shard[start:stop]
        for shard in np.unique(shards):
            first, last = start + np.flatnonzero(shards == shard)[[0, -1]]  # the index keeps a shard's samples together
            begin = int(self.offset[first])
            span = self.where.read(self.names[shard], begin, int(self.offset[last] + self.size[last]) - begin)
            payloads += [span[self.offset[at] - begin:self.offset[at] - begin + self.size[at]]
                         for at in range(first, last + 1)]
        return payloads

    def name(self, index: int) -> str:
        shard = self.shard[index]
        return f"{self.where.where(self.names[shard])}[{index - self.starts[shard]}]"

    def files(self, indices: list[int]) -> list[Path]:
        if self.where.remote:
            return []
        return [Path(self.where.where(self.names[shard])) for shard in np.unique(self.shard[indices])]


def read_json(where, name: str) -> dict | None:
    text = where.text(name)
    try:
        return None if text is None else json.loads(text)
    except ValueError as err:
        raise ConfigError(f"{where.where(name)} is not JSON ({err}); write it again") from None


def open_shards(where, patterns: dict[str, str | None], kept_in: Path) -> Stores:
    """Both splits of the shards at `where`; the class names from pack.json, else numbered."""
    meta = read_json(where, META)  # pack's; a folder of someone else's shards has none
    if meta is not None and meta.get("format") != "webdataset":
        raise ConfigError(f"{where.where('')} holds format={meta.get('format')}, not format=webdataset")
    info, stores = read_json(where, INFO), []
    for split in SPLITS:
        stats = shard_names(where, info, split, patterns[split])
        index = split_index(where, stats, kept_in)
        check_lengths(where, info, split, list(stats), index)
        stores.append(Shards(where, list(stats), index))
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

    def __init__(self, path: str | None, train_shards: str | None = None, val_shards: str | None = None,
                 cache_dir: str | None = None, endpoint_url: str | None = None, token_env: str | None = None):
        self.path, self.patterns = path, {"train": train_shards, "val": val_shards}
        self.cache_dir, self.endpoint_url, self.token_env = cache_dir, endpoint_url, token_env

    def stores(self, source, stage) -> Stores:
        where = location(self.path, self.endpoint_url, self.token_env)
        if not where.remote:
            check_folder(where.folder, "write it with python -m {{ cookiecutter.package }}.pack format=webdataset "
                         "pack.out=<folder>, or pass your shards' folder", "folder or s3:// prefix")
            where = Local(stage(where.folder))
        kept_in = where.folder if not where.remote else Path(self.cache_dir).expanduser() / hashlib.sha1(
            self.path.encode()).hexdigest()[:12]
        try:
            return open_shards(where, self.patterns, kept_in)
        except ModuleNotFoundError as err:
            raise ConfigError(f"format.path={self.path} needs {err.name}: pip install {err.name}") from None
        except OSError as err:  # a server or bucket that cannot be reached or refuses, a file that cannot be read
            raise ConfigError(f"format.path={self.path} cannot be read: {said(err)}; check the address, that its "
                              "server is up and the credentials") from None

    def write(self, path: Path, records, chunk_mb: float) -> None:
        """One split as shards of about `chunk_mb` megabytes in the folder `path`."""
        import webdataset
        path.mkdir()
        # mtime=0: packing the same tree twice writes the same shards.
        with webdataset.ShardWriter(str(path / "%06d.tar"), maxsize=max(1, int(chunk_mb * 2**20)), maxcount=10**9,
                                    verbose=0, mtime=0) as shards:
            for index, (data, label) in enumerate(records):
                shards.write({"__key__": f"{index:09d}", extension(data): data, "cls": label})

    def exists(self, out: str) -> bool:
        """A local folder, or a finished pack (its pack.json) at an S3 prefix."""
        return META in s3.sizes_at(out, self.endpoint_url) if s3.is_remote(out) else super().exists(out)

    def publish(self, written: Path, out: str) -> None:
        """Index the shards pack wrote (the index kept, so that training reads none at its first start) and list
        them in _info.json, timm's way, before the pack goes to `out`: renamed there, or uploaded to an S3 prefix
        with _info.json and pack.json last, so that a reader never finds them before the shards they vouch for."""
        info, local = {"name": Path(out.rstrip("/")).name, "splits": {}}, Local(written)
        for split in SPLITS:
            names = sorted(str(shard.relative_to(written)) for shard in (written / split).glob("*.tar"))
            index = split_index(local, {name: local.stat(name) for name in names}, written)
            counts = np.bincount(index[:, 0], minlength=len(names))
            info["splits"][INFO_SPLITS[split]] = {"name": INFO_SPLITS[split], "num_samples": int(counts.sum()),
                                                  "filenames": names, "shard_lengths": counts.tolist()}
        (written / INFO).write_text(json.dumps(info, indent=1))
        if s3.is_remote(out):
            for index in written.glob("_index-*.npz"):  # readers of a bucket key theirs by ETag, in their cache_dir
                index.unlink()
            s3.upload(written, out, self.endpoint_url, last=[INFO, META])
        else:
            super().publish(written, out)
