"""scripts/slowdisk.py mounted for a test, and always taken down: unmounted, and its daemon killed when it is stuck,
which ends the mount's connection as an abort through fusectl does. Never `stat`s the mount point, which hangs on a
frozen daemon."""
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.paths import PROJECT

SCRIPT = PROJECT / "scripts" / "slowdisk.py"
MOUNT_TIMEOUT_S = 20
FUSECTL = Path("/sys/fs/fuse/connections")


def script():
    """scripts/slowdisk.py as a module: the tests find and abort a mount with the user's code."""
    spec = importlib.util.spec_from_file_location("slowdisk", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slowdisk = script()
mount_entry, abort, connection = slowdisk.mount_entry, slowdisk.abort, slowdisk.connection


def missing_fuse() -> str | None:
    """Why FUSE cannot be used here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not usable by this user (run as root, or join the fuse group)"
    if not shutil.which("fusermount3"):
        return "fusermount3 is missing: apt install fuse3"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as err:
        return f"mfusepy cannot load libfuse ({err}): pip install mfusepy, apt install fuse3"
    return None


@contextlib.contextmanager
def fusectl():
    """FUSE's control file system on /sys/fs/fuse/connections, where a mount is aborted, or the test skips with the
    reason. Mounted where the machine has not (systemd mounts it at boot), and left mounted, as systemd leaves it:
    unmounted after one test, it would be gone under another test process aborting a mount through it."""
    if not mount_entry(FUSECTL):
        done = subprocess.run(["mount", "-t", "fusectl", "fusectl", str(FUSECTL)], capture_output=True, text=True,
                              timeout=30)
        if done.returncode and not mount_entry(FUSECTL):  # not another test process's mount in the meantime
            pytest.skip(f"aborting a FUSE mount needs fusectl on {FUSECTL}, and mounting it was refused: "
                        f"{done.stderr.strip()}")
    yield


@contextlib.contextmanager
def slow_disk(source: Path, mountpoint: Path, profile: str, *options: str):
    """`source` served read-only on `mountpoint` as the `profile` disk, for the duration of the block, which gets
    the daemon's process."""
    reason = missing_fuse()
    if reason:
        pytest.skip(f"slow-disk tests need FUSE: {reason}")
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = mountpoint.parent / f"{mountpoint.name}.log"
    with log.open("w") as output:
        daemon = subprocess.Popen([sys.executable, str(SCRIPT), str(source), str(mountpoint), "--profile", profile,
                                   *options], stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not mount_entry(mountpoint):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slowdisk did not mount {mountpoint}: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield daemon
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True, timeout=10)
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)
