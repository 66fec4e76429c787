"""format=folder's index: the same files as a plain walk, listed no slower than torchvision's ImageFolder, kept and
used again while no folder changed, and read by loader workers without their memory growing toward a copy of it."""
import os
import random
import time
from pathlib import Path

import pytest
from PIL import Image
from torch.utils.data import DataLoader, Sampler

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.contracts import Store
from {{ cookiecutter.package }}.data.format import folder
from {{ cookiecutter.package }}.data.format.folder import FileIndex, ImageFiles, list_split
from {{ cookiecutter.package }}.data.images import Images

KEPT = Path(os.environ["XDG_CACHE_HOME"]) / options.PACKAGE / "index"  # conftest's cache for the pytest session


def tree(root: Path, classes: int, per_class: int) -> Path:
    """A split of empty .JPEG files (listing reads names, not bytes), and a stray file of another kind per class."""
    for label in range(classes):
        folder_path = root / f"n{label:08d}"
        folder_path.mkdir(parents=True)
        for index in range(per_class):
            (folder_path / f"n{label:08d}_{index}.JPEG").touch()
        (folder_path / "notes.txt").touch()
    return root


def test_a_validation_split_without_some_classes_gets_one_warning_naming_one(tmp_path, caplog):
    tree(tmp_path / "train", classes=3, per_class=2)
    tree(tmp_path / "val", classes=1, per_class=2)
    with caplog.at_level("WARNING"):
        folder.open_tree(tmp_path)
    assert [record.getMessage() for record in caplog.records if "classes of train" in record.getMessage()] == [
        f"{tmp_path / 'val'} lacks 2 of the 3 classes of train/ (such as n00000001): the validation scores leave "
        "them out"]


def test_the_index_holds_the_files_a_walk_finds_in_sorted_order_with_their_labels(tmp_path):
    split = tree(tmp_path / "train", classes=3, per_class=4)
    (split / "n00000001" / "UPPER.JPG").touch()
    index, classes = list_split(split)
    walked = sorted((path.parent.name, path) for path in split.rglob("*") if path.suffix.lower() in (".jpeg", ".jpg"))
    assert list(index) == [path for _, path in walked] and classes == sorted({name for name, _ in walked})
    assert index.labels.tolist() == [classes.index(name) for name, _ in walked]
    assert index[-1] == walked[-1][1] and index[1:3] == [walked[1][1], walked[2][1]]


def imagefolder_tree(split: Path) -> Path:
    """A class folder as users keep them: JPEGs, a WebP, a PNG under upper case, a nested folder of its own, a
    note; and a class whose images are all in nested folders."""
    for name in ("cats", "dogs"):
        (split / name / "more" / "deeper").mkdir(parents=True)
    for path in ("cats/a.jpg", "cats/b.JPEG", "cats/more/c.jpeg", "dogs/more/deeper/e.jpg"):
        Image.new("RGB", (8, 8)).save(split / path, "JPEG")
    Image.new("RGB", (8, 8)).save(split / "cats" / "d.webp", "WEBP")
    Image.new("RGB", (8, 8)).save(split / "dogs" / "F.PNG", "PNG")
    (split / "cats" / "notes.txt").write_text("not an image")
    return split


def test_a_tree_is_read_as_torchvisions_imagefolder_reads_it_and_what_it_leaves_out_is_named(tmp_path, caplog):
    from torchvision.datasets import ImageFolder

    split = imagefolder_tree(tmp_path / "train")
    with caplog.at_level("WARNING"):
        index, classes = list_split(split)
    theirs = ImageFolder(str(split))
    assert sorted(zip(map(str, index), index.labels.tolist())) == sorted(theirs.samples)
    assert classes == theirs.classes and len(index) == 6
    assert [record.getMessage() for record in caplog.records] == [
        f"{split}: left out 1 files without an image suffix (such as cats/notes.txt); ImageFolder leaves them out too"]


def test_a_file_added_in_a_nested_folder_lists_the_split_again(tmp_path, monkeypatch):
    split = imagefolder_tree(tmp_path / "train")
    listings = []
    listed = folder.listed
    monkeypatch.setattr(folder, "listed", lambda *args: listings.append(args[0]) or listed(*args))
    first, _ = list_split(split)
    assert len(list_split(split)[0]) == len(first) and len(listings) == 1  # read from the kept index
    (split / "dogs" / "more" / "deeper" / "g.jpg").touch()  # neither class folder's time moves
    assert len(list_split(split)[0]) == len(first) + 1 and len(listings) == 2
    for path in (split / "dogs" / "more" / "deeper").iterdir():
        path.unlink()
    (split / "dogs" / "more" / "deeper").rmdir()
    assert len(list_split(split)[0]) == len(first) - 1 and len(listings) == 3


def test_the_index_is_kept_and_listed_again_only_where_a_folder_changed(tmp_path, monkeypatch, caplog):
    split = tree(tmp_path / "train", classes=3, per_class=4)
    listings = []
    listed = folder.listed
    monkeypatch.setattr(folder, "listed", lambda *args: listings.append(args[0]) or listed(*args))
    first, _ = list_split(split)
    again, _ = list_split(split)
    assert len(listings) == 1 and list(again) == list(first)  # the second run read the kept index
    (split / "n00000002" / "new.JPEG").touch()  # a file added: its folder's modification time moves
    added, _ = list_split(split)
    assert len(listings) == 2 and len(added) == len(first) + 1
    (split / "n00000000" / "n00000000_0.JPEG").rename(split / "n00000000" / "renamed.JPEG")
    renamed, _ = list_split(split)
    assert len(listings) == 3 and split / "n00000000" / "renamed.JPEG" in list(renamed)
    (split / "n00000003").mkdir()  # a new class folder: the split's own modification time moves
    (split / "n00000003" / "x.JPEG").touch()
    _, classes = list_split(split)
    assert len(listings) == 4 and classes[-1] == "n00000003"

    for kept in KEPT.glob("*.npz"):
        kept.write_bytes(b"not an index")  # a damaged cache: listed again, with one warning, and written anew
    list_split(split)
    assert len(listings) == 5 and any("ignoring the unreadable index" in record.getMessage()
                                      for record in caplog.records)
    list_split(split)
    assert len(listings) == 5


def test_a_tree_extracted_again_with_its_folder_times_set_back_is_listed_again(tmp_path, monkeypatch):
    """As a reproducible tar does: other files, every folder's modification time as it was. Its change time and inode
    are new, which no tool sets back."""
    split = tree(tmp_path / "train", classes=2, per_class=3)
    times = {path: os.stat(path).st_mtime_ns for path in (split, *split.iterdir())}
    first, _ = list_split(split)
    (split / "n00000001" / "n00000001_0.JPEG").unlink()
    (split / "n00000001" / "extracted.JPEG").touch()
    for path, modified in times.items():
        os.utime(path, ns=(modified, modified))
    assert {path: os.stat(path).st_mtime_ns for path in times} == times
    again, _ = list_split(split)
    assert split / "n00000001" / "extracted.JPEG" in list(again)
    assert split / "n00000001" / "n00000001_0.JPEG" not in list(again)


@pytest.mark.parametrize("why", ["format.reindex=true", "a FUSE mount"])
def test_a_tree_whose_stamps_cannot_be_trusted_is_listed_afresh_and_the_log_says_why(why, tmp_path, monkeypatch,
                                                                                      caplog):
    split = tree(tmp_path / "train", classes=2, per_class=3)
    list_split(split)
    listings = []
    listed = folder.listed
    monkeypatch.setattr(folder, "listed", lambda *args: listings.append(args[0]) or listed(*args))
    if why == "a FUSE mount":
        monkeypatch.setattr(folder, "file_systems", lambda paths: {"fuse.s3fs"})
    with caplog.at_level("INFO"):
        list_split(split, reindex=why == "format.reindex=true")
    reason = ("format.reindex=true" if why == "format.reindex=true" else
              "it is on a FUSE mount (fuse.s3fs), whose folder times need not change with its files")
    assert listings == [split] and any(record.getMessage().startswith(f"{split}: listed afresh, not from the index")
                                       and record.getMessage().endswith(reason) for record in caplog.records)


def test_an_index_that_cannot_be_kept_costs_the_next_run_a_listing_not_this_one(tmp_path, monkeypatch, caplog):
    split = tree(tmp_path / "train", classes=2, per_class=3)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the cache folder would be")
    index, _ = list_split(split)
    assert len(index) == 6 and any("could not keep the index" in record.getMessage() for record in caplog.records)


@pytest.mark.serial  # two listings timed in turn: another test's load would land on one more than the other
def test_listing_a_large_split_costs_no_more_than_imagefolders_scan(tmp_path):
    """20,000 files in 100 class folders, page cache warm, each listing timed three times in turn; the kept index
    is timed too. docs/benchmarks.md has the figures at 1.28M files (scripts/scale.py)."""
    make_dataset = pytest.importorskip("torchvision.datasets.folder").make_dataset
    split = tree(tmp_path / "train", classes=100, per_class=200)
    classes = sorted(path.name for path in split.iterdir())
    ours, theirs, kept = [], [], []
    for _ in range(3):
        for cache in KEPT.glob("*.npz"):
            cache.unlink()
        start = time.perf_counter()
        listed, _ = list_split(split)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        found = make_dataset(str(split), {name: label for label, name in enumerate(classes)}, (".jpeg",))
        theirs.append(time.perf_counter() - start)
        start = time.perf_counter()
        list_split(split)
        kept.append(time.perf_counter() - start)
    assert len(listed) == len(found) == 20_000
    assert min(ours) <= 1.0 * min(theirs), (ours, theirs)
    assert min(kept) <= 0.2 * min(ours), (kept, ours)


class RandomReads(Sampler):
    def __init__(self, size: int, reads: int):
        self.indices = random.Random(0).sample(range(size), reads)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class PathList(Store):
    """The index as format=folder kept it before: a Python list of Paths, one object per file."""

    def __init__(self, index: FileIndex):
        super().__init__(index.labels)
        self.paths = list(index)

    def payload(self, index: int) -> bytes:
        return self.paths[index].read_bytes()

    def name(self, index: int) -> str:
        return str(self.paths[index])


def private_dirty_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("Private_Dirty:"))


def growth_per_image_kb(store: Store, reads: int = 20_000, workers: int = 2) -> float:
    """Loader workers read `reads` random images of `store` through Images, as training does; the growth of their
    private memory (smaps_rollup's Private_Dirty) per image read, after the first eighth of the reads."""
    images = Images(store, transform=len, on_error="skip")
    batches = DataLoader(images, batch_size=100, sampler=RandomReads(len(store), reads), num_workers=workers,
                         collate_fn=len, prefetch_factor=1, persistent_workers=True)
    stream = iter(batches)
    pids = [worker.pid for worker in stream._workers]
    warm = len(batches) // 8
    for _ in range(warm):
        next(stream)
    before = sum(private_dirty_kb(pid) for pid in pids)
    for _ in stream:
        pass
    after = sum(private_dirty_kb(pid) for pid in pids)
    del stream, batches
    return (after - before) / (reads - warm * 100)


@pytest.mark.full  # a measurement of a worker's memory over a large index, 3.4 s
@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="reads /proc/<pid>/smaps_rollup (Linux)")
def test_a_workers_memory_stays_flat_as_it_reads_images_of_a_large_index(tmp_path):
    """200,000 entries (16 real files, each named over and over), 20,000 random reads by 2 workers. The list of Paths
    the index used to be is the control: its workers copy a page at each object they touch."""
    split = tree(tmp_path / "train", classes=4, per_class=4)
    small, _ = list_split(split)
    files = [small.path_bytes(index)[len(small.base):] for index in range(len(small))] * 12_500
    large = FileIndex.of(split, files, [0] * len(files))
    flat = growth_per_image_kb(ImageFiles(large))
    copied = growth_per_image_kb(PathList(large))
    assert flat <= 0.1, flat
    assert copied > 10 * max(flat, 0.1), (copied, flat)


def per_image_lists(store: Store) -> list[str]:
    """The attributes of a store (and of the store it wraps) that hold a Python object per image."""
    found = []
    for holder in (store, getattr(store, "store", None)):
        for name, value in getattr(holder, "__dict__", {}).items():
            if isinstance(value, (list, tuple, dict)) and len(value) == len(store) > 1:
                found.append(f"{type(holder).__name__}.{name}")
    return found


def test_no_formats_index_holds_a_python_object_per_image(packs, tiny_root):
    """Every format's stores keep their index in arrays, which workers read without copying pages."""
    from helpers.packs import open_pack

    stores = [folder.open_tree(tiny_root)[:2], *((opened.train, opened.val) for opened in
                                                 (open_pack(format, path) for format, path in packs.items()))]
    assert not [found for pair in stores for store in pair for found in per_image_lists(store)]
