"""scripts/slowdisk.py, the simulated spinning disk and NFS share, and what the run says on them: the storage
verdict where the loader's workers wait on reads, the decode verdict where they decode. The storage failures it
makes, and what a run does on them, are in test_failures.py."""
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from PIL import Image

from helpers.slow_disk import SCRIPT, connection, fusectl, missing_fuse, mount_entry, slow_disk

HDD_MS_PER_FILE = 12 + 8 + 8  # open, the getattr before it, and the seek of its first read (scripts/slowdisk.py)


def read_all(paths: list, readers: int) -> float:
    """Seconds to open and read every file whole, with `readers` at once."""
    start = time.perf_counter()
    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(lambda path: path.read_bytes(), paths))
    return time.perf_counter() - start


def test_the_disk_charges_each_open_and_seek_and_nfs_overlaps_requests_where_a_disk_head_cannot(tiny_root, tmp_path):
    files = sorted((tiny_root / "train").rglob("*.JPEG"))
    for profile, overlaps in (("hdd", False), ("nfs", True)):
        mountpoint = tmp_path / profile
        with slow_disk(tiny_root, mountpoint, profile):
            paths = [mountpoint / path.relative_to(tiny_root) for path in files]
            alone, together = read_all(paths, 1), read_all(paths, 8)
            assert [path.read_bytes() for path in paths[:3]] == [path.read_bytes() for path in files[:3]]
        assert mount_entry(mountpoint) is None
        if profile == "hdd":
            assert alone >= len(files) * HDD_MS_PER_FILE / 1000, alone
        assert (together < 0.5 * alone) == overlaps, (profile, alone, together)
        assert "daemon CPU" in (tmp_path / f"{profile}.log").read_text()


def test_without_fuse_the_tests_skip_with_the_reason(monkeypatch, tiny_root, tmp_path):
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda path: path != "/dev/fuse" and real_exists(path))
    assert missing_fuse() == "no /dev/fuse on this machine"
    with pytest.raises(pytest.skip.Exception, match="slow-disk tests need FUSE: no /dev/fuse"):
        with slow_disk(tiny_root, tmp_path / "never", "hdd"):
            pass
    assert mount_entry(tmp_path / "never") is None


@pytest.mark.full  # waits out the unmount on purpose
def test_a_frozen_daemon_is_aborted_and_never_hangs_the_test(tiny_root, tmp_path):
    mountpoint = tmp_path / "frozen"
    start = time.monotonic()
    with slow_disk(tiny_root, mountpoint, "nfs") as daemon:
        os.kill(daemon.pid, signal.SIGSTOP)
    assert mount_entry(mountpoint) is None and daemon.returncode is not None
    assert time.monotonic() - start < 40


def read_error(path: Path) -> int | None:
    """The errno reading `path` whole fails with; None if it reads."""
    try:
        path.read_bytes()
    except OSError as err:
        return err.errno
    return None


def test_after_sigusr1_every_read_fails_with_the_chosen_errno(tiny_root, tmp_path):
    files = sorted((tiny_root / "train").rglob("*.JPEG"))
    mountpoint = tmp_path / "failing"
    with slow_disk(tiny_root, mountpoint, "nfs", "--read-errno", "ETIMEDOUT") as daemon:
        paths = [mountpoint / path.relative_to(tiny_root) for path in files]
        assert read_error(paths[0]) is None
        daemon.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 20
        while "SIGUSR1" not in (tmp_path / "failing.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [read_error(path) for path in (paths[0], paths[1])] == [errno.ETIMEDOUT] * 2  # read before or not
        assert sorted(os.listdir(mountpoint / "train")) == sorted(os.listdir(tiny_root / "train"))  # reads alone fail


def test_an_aborted_mount_fails_the_read_waiting_on_it_and_every_one_after(tiny_root, tmp_path):
    """What `fusectl` does to a frozen mount, through `slowdisk.py --abort`: the read in flight gets ECONNABORTED,
    later ones ENOTCONN, "Transport endpoint is not connected"."""
    path = next((tiny_root / "train").rglob("*.JPEG")).relative_to(tiny_root)
    mountpoint = tmp_path / "frozen"
    with fusectl(), slow_disk(tiny_root, mountpoint, "nfs") as daemon:
        daemon.send_signal(signal.SIGSTOP)  # the server stops answering
        # The read must wait in the connection when the abort comes: a thread not yet scheduled on a busy machine
        # would read after it, and get ENOTCONN. A request the server had taken before it stopped waits there too,
        # so the reader's is the one past those.
        queued = connection(mount_entry(mountpoint)) / "waiting"
        before = int(queued.read_text())
        waiting = []
        reader = threading.Thread(target=lambda: waiting.append(read_error(mountpoint / path)))
        reader.start()
        deadline = time.monotonic() + 30
        while int(queued.read_text()) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        reader.join(timeout=1)
        assert int(queued.read_text()) > before and reader.is_alive()  # a frozen mount answers nothing
        aborted = subprocess.run([sys.executable, str(SCRIPT), "--abort", str(mountpoint)], capture_output=True,
                                 text=True, timeout=30)
        assert aborted.returncode == 0, aborted.stderr
        reader.join(timeout=10)
        assert waiting == [errno.ECONNABORTED] and read_error(mountpoint / path) == errno.ENOTCONN
        daemon.send_signal(signal.SIGCONT)  # it finds its connection gone, and exits
    again = subprocess.run([sys.executable, str(SCRIPT), "--abort", str(mountpoint)], capture_output=True, text=True,
                           timeout=30)
    assert again.returncode == 1 and again.stderr.strip() == f"error: {mountpoint} is not mounted"


def png_tree(tree: Path, out: Path) -> Path:
    """`tree` again with every image a PNG: no DCT scaling to shortcut the decode, so decoding costs what it says."""
    for path in tree.rglob("*.JPEG"):
        target = out / path.relative_to(tree).with_suffix(".png")
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.open(path).save(target)
    return out


@pytest.fixture
def one_compute_thread():
    """The training step on one thread, as decoding is: on a machine busy with other work, a step spread over every
    core waits for the slowest of its threads and slows far more than a decode does, which would turn a data-bound
    run compute-bound (seen with a load of 4 on 2 cores: ResNet-18's step on 32-pixel crops took 2 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.full  # it waits, by design, 250 ms on every file the slow disk opens
def test_a_data_bound_run_on_the_slow_disk_gets_the_storage_verdict_and_local_decoding_the_decode_one(
        train_in_process, tiny_root, tmp_path, one_compute_thread):
    """The same tiny tree, once on the simulated disk with every read slow, once local with decoding in the
    training process; both with a light step."""
    with slow_disk(tiny_root, tmp_path / "hdd", "hdd", "--open-ms", "250"):  # reads far slower than the step
        on_disk = train_in_process("data=folder", f"data.root={tmp_path / 'hdd'}", "loader.num_workers=1",
                                   "model.name=mobilenet_v3_small")
    assert on_disk.bound == "data", ("on the slow disk", on_disk.verdict, on_disk.system)
    assert "waiting on storage" in on_disk.verdict, on_disk.verdict
    keys = {suggestion["key"] for suggestion in on_disk.suggestions}
    assert {"staging", "format"} <= keys and "decoder" not in keys
    assert on_disk.system["loader/read_share"] > 50
    local = train_in_process("data=folder", f"data.root={png_tree(tiny_root, tmp_path / 'png')}", "decoder=pil",
                             "loader.num_workers=0", "model.name=mobilenet_v3_small", "train.batch_size=8",
                             "train.log_every=1")  # a light step and lossless files, so that decoding shows
    assert local.bound == "data" and "busy decoding" in local.verdict, ("local", local.verdict, local.system)
    assert not {"staging", "format"} & {suggestion["key"] for suggestion in local.suggestions
                                        if suggestion["value"] != "tensor"}
