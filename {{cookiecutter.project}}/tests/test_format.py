"""Packed formats: a tiny tree packed, read back with the same labels and pixels; bad packs refused clearly."""
import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.errors import ClearError, ConfigError
from {{ cookiecutter.package }}.data.decoder.jpeg import pil_size
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.format import META, folder
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.staging import no_staging
from {{ cookiecutter.package }}.tools.pack import pack, shorter_side_to, write_order, writer

from helpers.machines import installed
from helpers.packs import TENSOR_SHORT_SIDE, open_pack
from helpers.paths import PACKAGE, PROJECT
from helpers.processes import QUIET
from helpers.runs import hydra_run

PACKED = installed("format", options.having("format", "packed"))


def largest_file(path):
    """A split's file, or the largest file of a split's folder."""
    return path if path.is_file() else max((file for file in path.rglob("*") if file.is_file()),
                                           key=lambda file: file.stat().st_size)


def original(tiny_root):
    source = sources.folder(str(tiny_root), 32, 36, "raise")
    return folder.Folder().stores(source, no_staging)


@pytest.mark.parametrize("format", PACKED)
def test_round_trip_keeps_labels_classes_and_pixels(format, packs, tiny_root):
    expected, packed = original(tiny_root), open_pack(format, packs[format])
    assert packed.classes == expected.classes
    for split in ("train", "val"):
        source, store = getattr(expected, split), getattr(packed, split)
        order = write_order(len(source), split)
        assert len(store) == len(source)
        assert [store.read(index)[1] for index in range(len(store))] == source.labels[order].tolist()
        assert split == "val" or source.labels[order].tolist() != source.labels.tolist()  # a mix of classes
        for record, index in enumerate(order):
            if options.facts("format", format).holds_pixels:  # pixels resized once at pack time, compared with an independent decode
                reference = np.asarray(Image.open(source.paths[index]).convert("RGB"))
                height, width = reference.shape[:2]
                pixels, _ = store.read(record)
                assert min(pixels.shape[:2]) == TENSOR_SHORT_SIDE
                assert abs(pixels.shape[1] / pixels.shape[0] - width / height) < 0.05
                resized = np.asarray(Image.fromarray(reference).resize(pixels.shape[1::-1], Image.BOX))
                assert np.abs(pixels.astype(int) - resized).mean() < 6  # heavy texture, 10x smaller
            else:  # the encoded formats keep each file's bytes as they were
                assert store.read(record)[0] == source.paths[index].read_bytes()


@pytest.mark.parametrize("format", installed("format", options.having("format", "reads_runs")))
def test_a_run_of_records_read_at_once_is_each_record_as_read_alone(format, packs):
    store = open_pack(format, packs[format]).train
    alone = [store.read(index)[0] for index in range(len(store))]
    for start, stop in ((0, 5), (3, 11), (len(store) - 4, len(store))):
        together = store.payloads(start, stop)
        assert len(together) == stop - start
        assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
                   for a, b in zip(together, alone[start:stop]))


@pytest.mark.parametrize("format", ["folder", *PACKED])
def test_each_store_names_the_local_files_its_images_are_read_from(format, packs, tiny_root):
    """What bench's storage probe drops from the page cache before it reads: the very bytes the images are."""
    store = (original(tiny_root) if format == "folder" else open_pack(format, packs[format])).train
    files = store.files([0, 5])
    assert files and all(path.is_file() for path in files)
    held = b"".join(path.read_bytes() for path in files)
    if not options.facts("format", format).holds_pixels:
        assert all(store.read(index)[0] in held for index in (0, 5))


@pytest.mark.parametrize("format", installed("format", ["hdf5", "lmdb", "litdata"]))
def test_resized_encoded_pack_stays_within_jpeg_tolerance(format, tiny_root, tmp_path):
    report = pack(tiny_root, format, tmp_path / "out", 48, 90, 1, False, "raise")
    store, source = open_pack(format, tmp_path / "out").val, original(tiny_root).val
    assert report["images"] == 36 and report["skipped"] == 0 and report["images_per_s"] > 0
    for index in range(len(source)):
        pixels = np.asarray(Image.open(io.BytesIO(store.read(index)[0])).convert("RGB"))
        data = source.paths[index].read_bytes()  # what pack encoded: the file decoded and resized
        reference = shorter_side_to(PilDecoder().decode(data, min(pil_size(data)) / 48), 48)
        assert pixels.shape == reference.shape and np.abs(pixels.astype(int) - reference).mean() < 5


@pytest.mark.parametrize("format", PACKED)
def test_a_missing_pack_is_refused_with_the_command_that_writes_it(format, tmp_path):
    with pytest.raises(ConfigError, match=rf"^format.path={tmp_path / 'nowhere'} .*does not exist; write it with "
                                          rf"python -m {PACKAGE}\.pack"):
        open_pack(format, tmp_path / "nowhere")


@pytest.mark.parametrize("format", PACKED)
def test_a_pack_path_at_a_file_is_refused_saying_a_folder_is_wanted(format, tmp_path):
    file = tmp_path / "train.h5"
    file.write_bytes(b"not a pack")
    prefix = "folder or s3:// prefix" if options.facts("format", format).remote else "folder"
    with pytest.raises(ConfigError) as refused:
        open_pack(format, file)
    assert str(refused.value) == f"format.path={file} is a file; pass the {prefix} pack wrote (its pack.out, which " \
                                 f"holds {META})"


@pytest.mark.parametrize("format", PACKED)
def test_truncated_pack_is_refused_before_training(format, packs, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(packs[format], copy)
    file = largest_file(copy / json.loads((copy / META).read_text())["splits"]["train"]["file"])
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="truncated"):
        open_pack(format, copy)


@pytest.mark.parametrize("format", installed("format", ["lmdb"]))
def test_an_lmdb_pack_damaged_while_a_run_reads_it_is_one_line_naming_the_file(format, packs, tmp_path):
    import lmdb

    pack_copy = shutil.copytree(packs[format], tmp_path / format)
    store = open_pack(format, pack_copy).train
    with lmdb.open(str(store.path), subdir=False, readonly=True, lock=False) as env:
        page = env.stat()["psize"]
    assert store.read(0)[0]
    with open(store.path, "r+b") as file:  # every page but LMDB's two meta pages, which say where the tree is
        file.seek(2 * page)
        file.write(b"\xff" * (store.path.stat().st_size - 2 * page))
    for read in (lambda: store.read(1), lambda: store.payloads(0, 4)):  # the second in the transaction the first broke
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(store.path))} is damaged \((Corrupted|PageNotFound|BadTxn)"
                                              r"Error: .*\): pack it again$"):
            read()


@pytest.mark.parametrize("format", PACKED)
def test_foreign_files_are_refused(format, packs, tiny_root, tmp_path):
    with pytest.raises(ConfigError, match="not a packed data set"):
        open_pack(format, tiny_root)
    other = next(name for name in packs if name != format)
    with pytest.raises(ConfigError, match=f"holds format={other}, not format={format}"):
        open_pack(format, packs[other])
    # The right names and sizes, the wrong contents: a stranger's file copied over ours.
    copy = tmp_path / "copy"
    shutil.copytree(packs[format], copy)
    for split in json.loads((copy / META).read_text())["splits"].values():
        file = largest_file(copy / split["file"])
        file.write_bytes(np.random.default_rng(0).bytes(file.stat().st_size))
    for index in copy.glob("*.index.npy"):
        index.write_bytes(b"not numpy")
    with pytest.raises(ConfigError, match="not a readable"):
        open_pack(format, copy)


@pytest.mark.parametrize("format", PACKED)
def test_failed_or_interrupted_pack_leaves_nothing_that_looks_valid(format, tiny_root, tmp_path, monkeypatch):
    kind = type(writer(format))
    real_write = kind.write

    def write_then_fail(self, path, records, chunk_mb, error):
        def some_then_fail():
            for count, record in enumerate(records):
                if count == 5:
                    raise error
                yield record

        real_write(self, path, some_then_fail(), chunk_mb)

    for error in (OSError(28, "No space left on device"), KeyboardInterrupt()):
        monkeypatch.setattr(kind, "write", lambda self, path, records, chunk_mb: write_then_fail(
            self, path, records, chunk_mb, error))
        with pytest.raises(ClearError if isinstance(error, OSError) else KeyboardInterrupt):
            pack(tiny_root, format, tmp_path / "out", TENSOR_SHORT_SIDE, 90, 1, False, "raise")
        assert list(tmp_path.iterdir()) == []


def test_a_validation_split_without_some_classes_keeps_the_training_labels(tiny_root, tmp_path):
    shutil.copytree(tiny_root, tmp_path / "tree")
    first, *others = sorted(path.name for path in (tmp_path / "tree" / "val").iterdir())
    shutil.rmtree(tmp_path / "tree" / "val" / first)
    train, val, classes = folder.open_tree(tmp_path / "tree")
    assert classes == [first, *others]
    assert sorted({label for _, label in (val.read(index) for index in range(len(val)))}) == [1, 2]
    assert {val.name(index).split(os.sep)[-2] for index in range(len(val))} == set(others)


def test_pack_refuses_what_it_cannot_do(tiny_root, tmp_path, tree_with_bad_files):
    with pytest.raises(ConfigError, match="pack.short_side"):
        pack(tiny_root, "tensor", tmp_path / "t", None, 90, 1, False, "raise")
    with pytest.raises(ConfigError, match="cannot be packed"):
        pack(tiny_root, "folder", tmp_path / "f", None, 90, 1, False, "raise")
    (tmp_path / "exists").mkdir()
    with pytest.raises(ConfigError, match="pack.overwrite=true"):
        pack(tiny_root, "hdf5", tmp_path / "exists", None, 90, 1, False, "raise")
    with pytest.raises(ConfigError, match="unreadable image .*(zero|truncated|text).JPEG"):
        pack(tree_with_bad_files, "hdf5", tmp_path / "bad", None, 90, 1, False, "raise")
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("short_side", [None, 48])
def test_pack_leaves_out_unreadable_files_and_says_so(short_side, tree_with_bad_files, tmp_path):
    report = pack(tree_with_bad_files, "hdf5", tmp_path / "out", short_side, 90, 2, False, "skip")
    assert report["skipped"] == 3 and report["images"] == 16
    assert len(open_pack("hdf5", tmp_path / "out").train) == 8


@pytest.mark.full
def test_pack_command_line_reports_once_and_refuses_to_overwrite(tiny_root, tmp_path):
    command = [sys.executable, "-m", f"{PACKAGE}.pack", f"data.root={tiny_root}", "format=lmdb",
               f"pack.out={tmp_path / 'lmdb'}", f"hydra.run.dir={tmp_path / 'log'}"]

    def run():
        return subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **QUIET})

    first, again = run(), run()
    assert first.returncode == 0, first.stderr[-2000:]
    assert "packed 36 images (0 left out as unreadable)" in first.stdout and "images/s" in first.stdout
    assert again.returncode == 1 and again.stderr.strip().splitlines()[-1].startswith("error: pack.out=")


@pytest.mark.parametrize("format", PACKED)
def test_packed_files_are_opened_in_the_workers_not_in_the_parent(format, packs):
    from torch.utils.data import DataLoader

    store = open_pack(format, packs[format]).train
    payloads = list(DataLoader(range(len(store)), batch_size=None, num_workers=2,
                               collate_fn=lambda index: store.read(index)))
    assert len(payloads) == len(store)
    assert getattr(store, "_pid", None) is None  # a store that opens files had opened none in this process
    assert not any(key.startswith("_") and key != "_pid" for key in vars(store))


@pytest.mark.parametrize("format", PACKED)
def test_a_store_read_in_the_parent_before_its_workers_start_is_read_again_in_each(format, packs):
    """loader.num_workers=auto times no workers first, then workers forked from the process that read: each gets a
    handle of its own (LMDB refuses a second environment on a file while one is open, HDF5's must not cross fork)."""
    from torch.utils.data import DataLoader

    def contents(read: list) -> list[tuple[bytes, int]]:
        return [(np.asarray(payload).tobytes(), label) for payload, label in read]

    store = open_pack(format, packs[format]).train
    in_parent = contents(store.read(index) for index in range(len(store)))
    in_workers = contents(DataLoader(range(len(store)), batch_size=None, num_workers=2,
                                     collate_fn=lambda index: store.read(index)))
    assert in_workers == in_parent and len(set(in_parent)) == len(store)


@pytest.mark.parametrize("format", PACKED)
def test_a_second_reader_of_a_pack_reads_while_the_first_still_holds_it_open(format, packs):
    """An earlier loader's store, dropped but not yet collected, still holds the file open in this process (the next
    bench row, the evaluation after training): LMDB refuses a second environment on a file in one process."""
    first = open_pack(format, packs[format]).train
    held = [(np.asarray(payload).tobytes(), label) for payload, label in (first.read(index) for index in (0, 1))]
    second = open_pack(format, packs[format]).train
    assert [(np.asarray(payload).tobytes(), label) for payload, label in (second.read(0), first.read(1))] == held
    second.close()
    assert (np.asarray(first.read(0)[0]).tobytes(), first.read(0)[1]) == held[0], "the first reads on"


def test_pack_refuses_a_disk_too_small_with_the_numbers(tiny_root, small_disk, tmp_path, monkeypatch):
    import {{ cookiecutter.package }}.tools.pack as packing

    disk = small_disk(1)
    if disk is None:  # no tmpfs without root: the same free space, as the disk would report it
        disk = tmp_path / "disk"
        monkeypatch.setattr(packing, "free_bytes", lambda path: 1 << 20)
    with pytest.raises(ConfigError, match=r"the pack needs about [\d.]+ MiB and its disk has [\d.]+ MiB free"):
        pack(tiny_root, "hdf5", disk / "out", None, 90, 2, False, "skip")
    assert not disk.exists() or not list(disk.iterdir())


@pytest.mark.parametrize("format", PACKED)
def test_a_disk_that_fills_during_pack_gives_one_line_and_no_pack(format, tiny_root, small_disk, tmp_path,
                                                                 monkeypatch):
    """The native writers can crash their process on a full disk (LMDB: SIGBUS; HDF5: a segfault on close)."""
    import {{ cookiecutter.package }}.tools.pack as packing

    monkeypatch.setattr(packing, "estimated_bytes", lambda stores, convert: 0)  # the check before is passed
    disk = small_disk(1)
    if disk is None:  # no tmpfs without root: the failure raised where the format's writer writes
        disk = tmp_path / "disk"
        def full_disk(self, path, records, chunk_mb):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(type(writer(format)), "write", full_disk)
    short_side = 320 if format == "tensor" else None  # 36 decoded images of that size overfill 1 MiB
    with pytest.raises(ClearError, match=r"^pack failed, nothing written: .*MiB free on its disk"):
        pack(tiny_root, format, disk / "out", short_side, 90, 2, False, "skip")
    assert not list(disk.iterdir())


@pytest.mark.full
def test_pack_on_a_full_disk_from_the_command_line_is_one_line(tiny_root, small_disk):
    disk = small_disk(1)
    if disk is None:
        pytest.skip("mounting a small tmpfs needs root; test_a_disk_that_fills_during_pack covers it by injection")
    result = subprocess.run([sys.executable, "-m", f"{PACKAGE}.pack", f"data.root={tiny_root}", "format=hdf5",
                             f"pack.out={disk / 'out'}", f"hydra.run.dir={disk / 'log'}"], cwd=PROJECT,
                            capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: pack.out={disk / 'out'}: the pack needs about")


def test_pack_onto_a_folder_that_cannot_be_written_is_one_line_saying_so(tiny_root, read_only_folder):
    out = read_only_folder / "packed"
    with pytest.raises(ClearError, match=rf"^pack failed, nothing written at {re.escape(str(out))}: \[Errno \d+\] "
                                         r"(Read-only file system|Permission denied): .*; pick a folder this user can "
                                         r"write$"):
        pack(tiny_root, "hdf5", out, None, 90, 2, False, "skip")


def test_pack_refuses_a_key_no_option_reads(tiny_root, tmp_path):
    from {{ cookiecutter.package }}.pack import pack_command

    with hydra_run("pack", [f"data.root={tiny_root}", "pack.out=/packed", "+pack.short=256"], tmp_path) as cfg, \
            pytest.raises(ConfigError) as refused:
        pack_command(cfg)
    assert str(refused.value) == "+pack.short: no such key; did you mean pack.short_side?"


def test_pack_without_pack_out_is_one_line_saying_what_to_give(tiny_root, tmp_path):
    from {{ cookiecutter.package }}.core.failures import one_line
    from {{ cookiecutter.package }}.pack import pack_command

    with hydra_run("pack", [f"data.root={tiny_root}"], tmp_path) as cfg, pytest.raises(SystemExit) as exited:
        one_line(lambda: pack_command(cfg))
    assert exited.value.code == ("error: pack.out has no value: pass pack.out=..., the folder to write, or "
                                 "s3://bucket/prefix for litdata and webdataset, under a temporary name renamed when "
                                 "complete")


def test_every_documented_command_that_trains_from_a_pack_names_a_data_option_that_is_not_built_in():
    """Without one, training builds the default data set (synthetic) first: minutes writing images it never reads,
    and data: synthetic in summary.json."""
    pages = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages if page.exists())
    commands = [command for command in text.replace("\\\n", " ").splitlines()
                if f"-m {PACKAGE}.train" in command and "format.path=" in command and "|" not in command]
    picked = [re.search(r"(?:^| )data=(\w+)", command) for command in commands]
    assert all(found and found[1] not in options.having("data", "built_in") for found in picked), commands
