"""`format=folder`: the image tree as it is, root/{train,val}/<class>/**. Nothing to prepare; millions of small reads.
It reads what torchvision's ImageFolder reads: every file with an image suffix (IMAGE_SUFFIXES) in a class folder
or any folder below it; the other files it leaves out are counted and named in one line when the split is listed.

A split's listing is a `FileIndex`: three arrays (every file's path below the split folder, end to end in one byte
string; where each ends; its label), not a Python object per file. A loader worker that reads an image's path then
touches no object's reference count, so its memory does not grow toward a copy of the index as it reads: the
DataLoader copy-on-write problem (pytorch/pytorch#13246), which a list of 1.28M paths costs each worker hundreds of
MB of. Listing walks each class folder once (os.walk); the index is kept in the user's cache and used again, by the
next run, while the split folder, every class folder and every folder found below one keep their stamps:
modification time (a file added, removed or renamed changes its folder's), change time and inode, which a tree
extracted again gets new even where the tool sets the modification times back (a reproducible tar, a rebuilt
container layer). A tree on a FUSE mount,
whose folder times need not follow its files (object stores), is listed afresh every run, as is any with
format.reindex=true.
"""
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...contracts import Format, Store, Stores
from ...core.errors import ConfigError
from ...core.files import WriteError, file_systems, user_cache, write_atomic

log = logging.getLogger(__name__)

# torchvision's IMG_EXTENSIONS, compared without case: what ImageFolder reads, and Pillow decodes.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
INDEX_VERSION = 3  # of the cached index's layout: another version is listed again


class FileIndex:
    """The files of one split, as arrays: indexed like a list of their Paths, each made when it is asked for."""

    def __init__(self, root: Path, names: np.ndarray, ends: np.ndarray, labels: np.ndarray):
        self.root, self.names, self.ends, self.labels = root, names, ends, labels
        self.base = os.fsencode(root) + b"/"

    @classmethod
    def of(cls, root: Path, files: list[bytes], labels: list[int]) -> "FileIndex":
        """The index of `files` (each a path below `root`, as bytes), with their labels."""
        ends = np.cumsum(np.fromiter(map(len, files), dtype=np.int64, count=len(files)))
        names = np.frombuffer(b"".join(files), dtype=np.uint8)
        return cls(root, names, ends, np.asarray(labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.ends)

    def path_bytes(self, index: int) -> bytes:
        start = self.ends[index - 1] if index else 0
        return self.base + self.names[start:self.ends[index]].tobytes()

    def __getitem__(self, key: int | slice) -> Path | list[Path]:
        if isinstance(key, slice):
            return [self[index] for index in range(*key.indices(len(self)))]
        return Path(os.fsdecode(self.path_bytes(key if key >= 0 else len(self) + key)))

    def __iter__(self) -> Iterator[Path]:
        return (self[index] for index in range(len(self)))


class ImageFiles(Store):
    when_changed = "put the file back, or list the tree again with format.reindex=true (a kept index may be stale)"

    def __init__(self, paths: FileIndex):
        super().__init__(paths.labels)
        self.paths = paths

    def payload(self, index: int) -> bytes:
        with open(self.paths.path_bytes(index), "rb") as file:
            return file.read()

    def name(self, index: int) -> str:
        return str(self.paths[index])

    def files(self, indices: list[int]) -> list[Path]:
        return [self.paths[index] for index in indices]


def class_folders(split_dir: Path) -> list[str]:
    if not split_dir.is_dir():
        raise ConfigError(f"{split_dir} is not a folder; data.root must hold train/<class>/ and val/<class>/")
    with os.scandir(split_dir) as entries:
        found = sorted(entry.name for entry in entries if entry.is_dir())
    if not found:
        raise ConfigError(f"{split_dir} has no class folders; expected {split_dir}/<class>/*.JPEG")
    return found


def stamp(folder: Path) -> tuple[int, int, int]:
    """A folder's modification time, change time (ns) and inode (as an int64)."""
    status = os.stat(folder)
    return status.st_mtime_ns, status.st_ctime_ns, status.st_ino & 0x7FFF_FFFF_FFFF_FFFF


def stamps(split_dir: Path, classes: list[str], present: set[str]) -> np.ndarray:
    """The stamps of the split folder and of each class folder, -1s for a class it lacks."""
    return np.array([stamp(split_dir), *(stamp(split_dir / name) if name in present else (-1, -1, -1)
                                        for name in classes)], dtype=np.int64)


def stamps_below(split_dir: Path, below: list[bytes]) -> np.ndarray:
    """The stamps of the folders `below` the class folders (paths from the split folder)."""
    return np.array([stamp(split_dir / os.fsdecode(folder)) for folder in below], dtype=np.int64).reshape(-1, 3)


def untrusted(split_dir: Path, reindex: bool) -> str | None:
    """Why the kept index of `split_dir` must not be used this run, or None."""
    if reindex:
        return "format.reindex=true"
    if fuse := sorted(kind for kind in file_systems([split_dir]) if kind.startswith("fuse")):
        return f"it is on a FUSE mount ({fuse[0]}), whose folder times need not change with its files"
    return None


def list_split(split_dir: Path, classes: list[str] | None = None, reindex: bool = False) -> tuple[FileIndex, list[str]]:
    """Every image under split_dir/<class>/ with its label (classes in sorted order, or `classes`' order), read from
    the cached index where no folder changed since it was listed, else listed and cached; listed afresh where the
    index cannot be trusted (`reindex`, a FUSE mount)."""
    found = class_folders(split_dir)
    classes = classes or found
    if set(found) - set(classes):
        raise ConfigError(f"{split_dir} has class folders that train/ lacks: {sorted(set(found) - set(classes))[:5]}")
    present = set(found)  # val may lack some of train's classes, which its scores then leave out: say so
    absent = [name for name in classes if name not in present]
    if absent:
        log.warning("%s lacks %d of the %d classes of train/ (such as %s): the validation scores leave them out",
                    split_dir, len(absent), len(classes), absent[0])
    top = stamps(split_dir, classes, present)
    cache = index_cache(split_dir, classes)
    if why := untrusted(split_dir, reindex):
        log.info("%s: listed afresh, not from the index kept in %s: %s", split_dir, cache, why)
        index = None
    else:
        index = cached(cache, split_dir, top)
    if index is None:
        index, below = listed(split_dir, classes, present)
        keep(cache, index, below, np.concatenate([top, stamps_below(split_dir, below)]))
    if not len(index):
        raise ConfigError(f"{split_dir} holds no image files ({', '.join(IMAGE_SUFFIXES)}); put each class's images "
                          f"in {split_dir}/<class>/")
    return index, classes


def listed(split_dir: Path, classes: list[str], present: set[str]) -> tuple[FileIndex, list[bytes]]:
    """The split's images, and the folders below its class folders (paths from the split folder, whose stamps the
    kept index is checked against), walked as ImageFolder walks them: symbolic links to folders followed."""
    files, labels, below, left_out = [], [], [], []
    for label, name in enumerate(classes):
        if name not in present:
            continue
        for folder, folders, names in os.walk(os.fsencode(split_dir / name), followlinks=True):
            folders.sort()
            relative = os.path.relpath(folder, os.fsencode(split_dir)) + b"/"
            if relative.count(b"/") > 1:
                below.append(relative.rstrip(b"/"))
            images = []
            for file in sorted(names):  # each name's suffix tested once: a class folder may hold thousands
                (images if os.fsdecode(file).lower().endswith(IMAGE_SUFFIXES) else left_out).append(relative + file)
            files += images
            labels += [label] * len(images)
    if left_out:
        log.warning("%s: left out %d files without an image suffix (such as %s); ImageFolder leaves them out too",
                    split_dir, len(left_out), os.fsdecode(left_out[0]))
    return FileIndex.of(split_dir, files, labels), below


def index_cache(split_dir: Path, classes: list[str]) -> Path:
    """Where the index of `split_dir`, labelled by `classes`, is kept."""
    key = hashlib.sha256("\n".join([str(split_dir.resolve()), *classes]).encode(errors="surrogateescape"))
    return user_cache() / "index" / f"{key.hexdigest()[:24]}.npz"


def cached(cache: Path, split_dir: Path, top: np.ndarray) -> FileIndex | None:
    """The index kept at `cache`, if the split's and class folders' stamps are still `top` and those of the folders
    below them it recorded are unchanged too."""
    try:
        with np.load(cache, allow_pickle=False) as kept:
            if int(kept["version"]) != INDEX_VERSION or not np.array_equal(kept["stamps"][:len(top)], top):
                return None
            below = [bytes(folder) for folder in kept["below"]]
            if not np.array_equal(kept["stamps"][len(top):], stamps_below(split_dir, below)):
                return None
            index = FileIndex(split_dir, kept["names"], kept["ends"], kept["labels"])
    except FileNotFoundError:  # the index, or a folder below a class folder that was removed
        return None
    except (OSError, ValueError, KeyError) as err:  # a damaged or foreign file: listed again, and written over
        log.warning("ignoring the unreadable index %s (%s); listing %s again", cache, err, split_dir)
        return None
    log.info("%s: %d files, from the index kept in %s", split_dir, len(index), cache)
    return index


def keep(cache: Path, index: FileIndex, below: list[bytes], folder_stamps: np.ndarray) -> None:
    """Write the index for the next run; a cache that cannot be written costs that run a listing, not this one."""
    def write(path: Path) -> None:
        with open(path, "wb") as file:
            np.savez(file, version=INDEX_VERSION, stamps=folder_stamps, names=index.names, ends=index.ends,
                     labels=index.labels, below=np.array(below, dtype=np.bytes_))

    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, write)
    except (OSError, WriteError) as err:
        log.warning("could not keep the index of %s in %s (%s); the next run lists it again", index.root, cache, err)


def open_tree(root: Path, reindex: bool = False) -> tuple[ImageFiles, ImageFiles, list[str]]:
    train, classes = list_split(root / "train", reindex=reindex)
    val, _ = list_split(root / "val", classes, reindex=reindex)
    return ImageFiles(train), ImageFiles(val), classes


class Folder(Format):
    """The tree at data.root as it is; pack reads it, and never writes one. `reindex`: list it afresh, not from the
    index kept in the cache."""

    def __init__(self, reindex: bool = False):
        self.reindex = reindex

    def stores(self, source, stage) -> Stores:
        """The tree at data.root, staged first if staging= asks."""
        if source.root is None:
            raise ConfigError("format=folder reads data.root: pass data.root=/path/to/imagenet")
        train, val, classes = open_tree(stage(Path(source.root)), self.reindex)
        return Stores(train, val, classes)
