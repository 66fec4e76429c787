#!/usr/bin/env python3
"""Mount a folder read-only as if it sat on a spinning disk or NFS: what would training be like there?

    python scripts/slowdisk.py /data/imagenet /mnt/slow --profile hdd    # until Ctrl-C or fusermount3 -u /mnt/slow
    python scripts/slowdisk.py /data/imagenet /mnt/slow --profile nfs --request-ms 5   # a farther server
    python -m {{ cookiecutter.package }}.bench data=folder data.root=/mnt/slow

A FUSE passthrough (libfuse 3 through mfusepy: `pip install mfusepy`, and Debian's or Ubuntu's `fuse3`; run as
root or with /dev/fuse usable) that charges, per profile:
- each open and each metadata call (getattr, readdir) a fixed latency;
- each read request a latency, and a seek when it does not continue a recent read of that file;
- each byte its share of one link's bandwidth, which all readers share;
- `in_flight` requests served at once: one for a disk with one head, 16 for NFS, whose requests overlap.
The kernel caches file pages. To model a data set larger than RAM, the cached pages of every open file are
dropped every `--evict-every` seconds (libfuse's fuse_invalidate_path), and a file's pages are dropped when it is
opened again. A model of a device, not a device: its figures show what latency and bandwidth do, nothing more.
The daemon is Python: past about 2,000 requests a second it is the limit itself; it prints the CPU it used.

Storage that fails, to see what a run does on it:
    kill -USR1 <daemon pid>    # every read from then on fails with --read-errno (EIO: a disk going bad)
    kill -STOP <daemon pid>    # the server stops answering: every request waits, as on a frozen network mount
    python scripts/slowdisk.py --abort /mnt/slow   # what fusectl does: waiting requests fail with ECONNABORTED,
                                                   # later ones with ENOTCONN ("Transport endpoint is not connected")
"""
import argparse
import ctypes
import errno
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class Profile:
    open_ms: float  # per open
    metadata_ms: float  # per getattr or readdir
    request_ms: float  # per read request
    seek_ms: float  # per read that does not continue a recent one of its file
    mb_s: float  # the link's bandwidth, shared by every reader
    in_flight: int  # requests served at once


PROFILES = {
    "hdd": Profile(open_ms=12.0, metadata_ms=8.0, request_ms=0.0, seek_ms=8.0, mb_s=150.0, in_flight=1),
    "nfs": Profile(open_ms=1.0, metadata_ms=0.5, request_ms=0.5, seek_ms=0.0, mb_s=110.0, in_flight=16),
}
RECENT_READS = 8  # ends of a file's last reads a new read may continue without a seek: readahead streams


class Link:
    """Bandwidth shared by every reader: each transfer waits its turn on the one wire."""

    def __init__(self, mb_s: float):
        self.seconds_per_byte, self.guard, self.free_at = 1 / (mb_s * 1e6), threading.Lock(), 0.0

    def transfer(self, nbytes: int) -> None:
        with self.guard:
            start = max(time.monotonic(), self.free_at)
            self.free_at = start + nbytes * self.seconds_per_byte
            done = self.free_at
        time.sleep(max(0.0, done - time.monotonic()))


def mount_entry(mountpoint: str) -> list[str] | None:
    """The /proc/self/mountinfo fields of `mountpoint`, read without touching the mount itself, which hangs while
    its daemon does not answer."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        entry = line.split()
        if entry[4] == os.path.abspath(mountpoint):
            return entry
    return None


def connection(entry: list[str]) -> Path:
    """A FUSE mount's folder in fusectl (`abort`, `waiting`, ...): its connection is numbered by the mount's device
    minor, from its mountinfo `entry`."""
    return Path("/sys/fs/fuse/connections") / entry[2].split(":")[1]


def abort(mountpoint: str) -> str | None:
    """End every request to a FUSE mount, waiting or to come, as `fusectl` does: its connection, numbered by the
    mount's device minor, is aborted. Why it could not be, or None."""
    entry = mount_entry(mountpoint)
    if entry is None:
        return f"{mountpoint} is not mounted"
    control = connection(entry) / "abort"
    if not control.exists():
        return (f"{control} does not exist: fusectl is not mounted (as root: mount -t fusectl fusectl "
                "/sys/fs/fuse/connections), or the mount is not FUSE's")
    try:
        control.write_text("1")
    except OSError as err:
        return f"could not write {control}: {err.strerror}"
    return None


def fail_reads_on_signal(failing: threading.Event, read_errno: int) -> None:
    """From SIGUSR1 on, `failing` is set. The main thread is inside libfuse's loop, where Python never runs a signal
    handler, so a thread of its own waits for the signal, which every other thread blocks; call it before any thread
    starts, since threads inherit the block."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def wait() -> None:
        signal.sigwait({signal.SIGUSR1})
        failing.set()
        print(f"slowdisk: SIGUSR1: every read fails with {errno.errorcode[read_errno]} from now on", flush=True)

    threading.Thread(target=wait, daemon=True, name="sigusr1").start()


def import_fuse():
    try:
        import mfusepy
    except (ImportError, OSError) as err:  # OSError: libfuse itself is missing
        raise SystemExit(f"error: slowdisk needs FUSE ({err}): pip install mfusepy, and apt install fuse3") from None
    return mfusepy


def slow_passthrough(mfusepy, source: str, profile: Profile, evict_every: float, failing: threading.Event,
                     read_errno: int):
    class SlowPassthrough(mfusepy.Operations):
        use_ns = True

        def __init__(self):
            self.source, self.profile = os.path.realpath(source), profile
            self.device = threading.BoundedSemaphore(profile.in_flight)
            self.link = Link(profile.mb_s)
            self.recent: dict[int, list[int]] = {}  # file handle -> ends of its recent reads
            self.open_paths: dict[int, str] = {}
            self.guard = threading.Lock()
            self.fuse = None

        def real(self, path: str) -> str:
            return os.path.join(self.source, path.lstrip("/"))

        def wait(self, milliseconds: float) -> None:
            if milliseconds:
                with self.device:
                    time.sleep(milliseconds / 1000)

        def init(self, path: str) -> None:
            # The FUSE session, for dropping cached pages from outside a request.
            self.fuse = ctypes.c_void_p(mfusepy._libfuse.fuse_get_context().contents.fuse)
            if evict_every > 0:
                threading.Thread(target=self.evict, daemon=True, name="evict").start()

        def evict(self) -> None:
            invalidate = mfusepy._libfuse.fuse_invalidate_path
            while True:
                time.sleep(evict_every)
                with self.guard:
                    paths = set(self.open_paths.values())
                for path in paths:
                    invalidate(self.fuse, path.encode())

        def getattr(self, path: str, fh=None) -> dict:
            self.wait(self.profile.metadata_ms)
            stat = os.lstat(self.real(path))
            return {key: getattr(stat, key) for key in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid",
                                                        "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}

        def readdir(self, path: str, fh) -> list[str]:
            self.wait(self.profile.metadata_ms)
            return [".", "..", *os.listdir(self.real(path))]

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise mfusepy.FuseOSError(errno.EROFS)
            self.wait(self.profile.open_ms)
            handle = os.open(self.real(path), os.O_RDONLY)
            with self.guard:
                self.open_paths[handle], self.recent[handle] = path, []
            return handle

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            if failing.is_set():
                raise mfusepy.FuseOSError(read_errno)
            with self.guard:
                ends = self.recent.setdefault(fh, [])
                continues = offset in ends
                if continues:
                    ends.remove(offset)
                ends.append(offset + size)
                del ends[:-RECENT_READS]
            with self.device:
                time.sleep((self.profile.request_ms + (0.0 if continues else self.profile.seek_ms)) / 1000)
                data = os.pread(fh, size, offset)
            self.link.transfer(len(data))
            return data

        def release(self, path: str, fh: int) -> int:
            with self.guard:
                self.open_paths.pop(fh, None)
                self.recent.pop(fh, None)
            os.close(fh)
            return 0

        def statfs(self, path: str) -> dict:
            stat = os.statvfs(self.real(path))
            return {key: getattr(stat, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                        "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    return SlowPassthrough()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="the folder to serve")
    parser.add_argument("mountpoint", nargs="?", help="an empty folder to mount it on")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="hdd")
    for field in fields(Profile):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=field.type, help="instead of the profile's")
    parser.add_argument("--evict-every", type=float, default=2.0,
                        help="seconds between dropping the cached pages of open files; 0 keeps them")
    parser.add_argument("--read-errno", choices=sorted(errno.errorcode.values()), default="EIO", metavar="ERRNO",
                        help="what every read returns once the daemon gets SIGUSR1 (default EIO)")
    parser.add_argument("--abort", metavar="MOUNTPOINT", help="abort a mount's FUSE connection, and do nothing else")
    args = parser.parse_args()
    if args.abort:
        reason = abort(args.abort)
        if reason:
            raise SystemExit(f"error: {reason}")
        return
    if args.source is None or args.mountpoint is None:
        parser.error("the source and mountpoint are required, unless --abort is given")
    if not os.path.isdir(args.source):
        parser.error(f"{args.source} is not a folder")
    profile = replace(PROFILES[args.profile], **{field.name: getattr(args, field.name) for field in fields(Profile)
                                                 if getattr(args, field.name) is not None})
    mfusepy = import_fuse()
    read_errno, failing = getattr(errno, args.read_errno), threading.Event()
    fail_reads_on_signal(failing, read_errno)
    print(f"slowdisk: {args.source} on {args.mountpoint} as {args.profile}: {profile}", flush=True)
    try:
        mfusepy.FUSE(slow_passthrough(mfusepy, args.source, profile, args.evict_every, failing, read_errno),
                     args.mountpoint, foreground=True, ro=True, fsname=f"slowdisk-{args.profile}")
    finally:
        used = resource.getrusage(resource.RUSAGE_SELF)
        print(f"slowdisk: daemon CPU {used.ru_utime + used.ru_stime:.1f} s", flush=True)


if __name__ == "__main__":
    main()
