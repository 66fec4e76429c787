"""scripts/slowdisk.py mounted for a test, and always taken down: unmounted, or aborted through fusectl when its
daemon is stuck. Never `stat`s the mount point, which hangs on a frozen daemon."""
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slowdisk.py"
MOUNT_TIMEOUT_S = 20


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


def mount_entry(mountpoint: Path) -> list[str] | None:
    """The /proc/self/mountinfo fields of `mountpoint`, read without touching the mount itself."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mountpoint):
            return fields
    return None


def abort(mountpoint: Path) -> None:
    """End every request to a stuck FUSE mount: its connection, numbered by the device's minor, is aborted."""
    fields = mount_entry(mountpoint)
    if fields:
        minor = fields[2].split(":")[1]
        with contextlib.suppress(OSError):
            Path(f"/sys/fs/fuse/connections/{minor}/abort").write_text("1")


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
            abort(mountpoint)
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)
