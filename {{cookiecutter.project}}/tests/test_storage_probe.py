"""bench's storage probe: read rates from the data set's own storage, cold, and the side that limits the loader.
The slow disk is scripts/slowdisk.py; the fast storage is this machine's; RAM is a tmpfs the test mounts."""
import shutil

import pytest

from {{ cookiecutter.package }}.data.format.folder import open_tree
from {{ cookiecutter.package }}.tools.bench.storage_probe import drop_cached, storage_rows

from helpers.slow_disk import slow_disk

HDD_READS_PER_S = 1000 / (12 + 8)  # at most, one head: an open and a seek per file (its getattr may be cached)


def probe_folder(root, readers, ceiling):
    train, _, _ = open_tree(root)
    return {row["num_workers"]: row for row in storage_rows({"folder": train}, readers,
                                                            {count: ceiling * count for count in readers})}


@pytest.mark.full  # it waits, by design, on a disk of 50 reads a second
@pytest.mark.serial  # local reads must outrun the slow disk 5 times: other tests' load once held them to 158/s
def test_reads_from_a_slow_disk_are_counted_cold_and_limit_the_loader_where_local_reads_do_not(tiny_root, tmp_path):
    ceiling = 80.0  # decodes/s per worker: above the disk's reads (at most 50/s, one head), well below local ones
    local = probe_folder(tiny_root, [1, 2], ceiling)
    with slow_disk(tiny_root, tmp_path / "hdd", "hdd"):
        on_disk = probe_folder(tmp_path / "hdd", [1, 2], ceiling)
    for readers in (1, 2):
        assert on_disk[readers]["images_per_s"] <= 1.1 * HDD_READS_PER_S, on_disk[readers]
        assert local[readers]["images_per_s"] > 5 * on_disk[readers]["images_per_s"], (local, on_disk)
        assert on_disk[readers]["limit"] == "storage" and "storage limits" in on_disk[readers]["note"]
        assert local[readers]["limit"] == "decode"
        assert on_disk[readers]["page_cache"].startswith("cold")


def test_dropping_the_cache_is_checked_where_the_file_system_can_tell(tiny_root, tmp_path):
    """Where RWF_NOWAIT works (local file systems), a dropped file must read as not cached: files just written, whose
    pages are not yet on disk, and that no other test's loader can be reading."""
    files = []
    for source in sorted((tiny_root / "train").rglob("*.JPEG")):
        files.append(tmp_path / f"{len(files)}.JPEG")
        files[-1].write_bytes(source.read_bytes())
    state = drop_cached(files)
    assert state.startswith("cold"), state


def test_a_data_set_on_tmpfs_is_read_warm_never_cold(tiny_root, small_disk):
    """tmpfs holds its files in RAM: dropping their pages does nothing, and a read that must not wait may be refused
    there, which read as a file system that cannot confirm the drop."""
    disk = small_disk(16)
    if disk is None:
        pytest.skip("mounting a tmpfs is refused here: mount -t tmpfs needs root or CAP_SYS_ADMIN")
    root = shutil.copytree(tiny_root, disk / "tree")
    state = probe_folder(root, [1], 80.0)[1]["page_cache"]
    assert state.startswith("warm") and "tmpfs" in state, state
