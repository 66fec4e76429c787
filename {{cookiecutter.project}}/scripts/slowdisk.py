#!/usr/bin/env python3
"""Mount a folder read-only as if it sat on a spinning disk or NFS: what would training be like there?

    python scripts/slowdisk.py /data/imagenet /mnt/slow --profile hdd    # until Ctrl-C or fusermount3 -u /mnt/slow
    python scripts/slowdisk.py /data/imagenet /mnt/slow --profile nfs --request-ms 5   # a farther server
    python -m {{ cookiecutter.package }}.bench data=imagenet data.root=/mnt/slow

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
"""
import argparse
import ctypes
import errno
import os
import resource
import threading
import time
from dataclasses import dataclass, fields, replace


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


def import_fuse():
    try:
        import mfusepy
    except (ImportError, OSError) as err:  # OSError: libfuse itself is missing
        raise SystemExit(f"error: slowdisk needs FUSE ({err}): pip install mfusepy, and apt install fuse3") from None
    return mfusepy


def slow_passthrough(mfusepy, source: str, profile: Profile, evict_every: float):
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
            # The session, for dropping cached pages from outside a request.
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
    parser.add_argument("source", help="the folder to serve")
    parser.add_argument("mountpoint", help="an empty folder to mount it on")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="hdd")
    for field in fields(Profile):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=field.type, help="instead of the profile's")
    parser.add_argument("--evict-every", type=float, default=2.0,
                        help="seconds between dropping the cached pages of open files; 0 keeps them")
    args = parser.parse_args()
    if not os.path.isdir(args.source):
        parser.error(f"{args.source} is not a folder")
    profile = replace(PROFILES[args.profile], **{field.name: getattr(args, field.name) for field in fields(Profile)
                                                 if getattr(args, field.name) is not None})
    mfusepy = import_fuse()
    print(f"slowdisk: {args.source} on {args.mountpoint} as {args.profile}: {profile}", flush=True)
    try:
        mfusepy.FUSE(slow_passthrough(mfusepy, args.source, profile, args.evict_every),
                     args.mountpoint, foreground=True, ro=True, fsname=f"slowdisk-{args.profile}")
    finally:
        used = resource.getrusage(resource.RUSAGE_SELF)
        print(f"slowdisk: daemon CPU {used.ru_utime + used.ru_stime:.1f} s", flush=True)


if __name__ == "__main__":
    main()
