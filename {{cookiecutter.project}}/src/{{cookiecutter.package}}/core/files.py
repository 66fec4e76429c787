"""Files written so that nothing half-written looks valid; what a failed read or write of the run's storage
reports (the path, the errno, the free space); and the run's log file, which ends at its last whole line when
its disk fills."""
import errno
import fcntl
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .errors import ClearError, ConfigError

log = logging.getLogger(__name__)


def user_cache() -> Path:
    """The folder this project keeps what it measured or listed in, for later runs: $XDG_CACHE_HOME/<package>."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "{{ cookiecutter.package }}"


class WriteError(ClearError):
    """A run file could not be written (a full disk, say)."""


# How torch.save reports a failed write: a RuntimeError from its C++ stream writer, not an OSError.
WRITE_FAILED = re.compile(r"inline_container|PytorchStreamWriter|file write failed|basic_ios|iostream error")

# What a read returns when the disk, the mount or the server under the file failed, not the file: an I/O error, a
# network mount that is gone (ENOTCONN; ECONNABORTED for a request a FUSE mount still had in flight when it was
# aborted, or a server that dropped it), a stale NFS handle, a server that did not answer.
STORAGE_FAILED = frozenset({errno.EIO, errno.ENOTCONN, errno.ECONNABORTED, errno.ESTALE, errno.ETIMEDOUT})


def file_systems(files: list[Path]) -> set[str]:
    """The types of the file systems that hold `files`, by the longest mount point above each in /proc/mounts (the
    last mounted where two share one); empty where the OS has no /proc/mounts."""
    try:
        table = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return set()
    mounts = {}
    for fields in (line.split() for line in table):
        if len(fields) >= 3:  # device, mount point, type, options...
            # /proc/mounts writes a space in a mount point as \040 (a tab as \011, and so on).
            mounts[re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), fields[1])] = fields[2]
    found = set()
    for real in {os.path.realpath(file) for file in files}:
        point = max((point for point in mounts if real == point or real.startswith(point.rstrip("/") + "/")),
                    key=len, default=None)
        if point is not None:
            found.add(mounts[point])
    return found


def errno_name(err: OSError) -> str:
    """ENOSPC, EIO, ...: the errno's name, which a search for the failure finds."""
    return errno.errorcode.get(err.errno, str(err.errno))


def nearest_existing(path: Path) -> Path:
    """`path`, or the closest folder above it that exists: where a file or folder not made yet would be made."""
    while not path.exists():
        path = path.parent
    return path


def check_writable(folder: Path, key: str, next_step: str) -> None:
    """Refuse, in one line naming `key` and the `next_step`, a folder this user cannot write, or make where it does
    not exist yet (a read-only file system, a folder of another user), before any work that would be lost."""
    existing = nearest_existing(folder)
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ConfigError(f"{key}={folder}: {existing} cannot be written ({err.strerror}); {next_step}") from None


def version(path: Path) -> str:
    """What changes when the file at `path` is written again: its size, mtime, ctime and inode. A file rewritten at the
    same size with its old mtime put back (cp -p, rsync -t, tar) still gets a new ctime, and one replaced by a rename
    a new inode."""
    status = path.stat()
    return f"{status.st_size}.{status.st_mtime_ns}.{status.st_ctime_ns}.{status.st_ino}"


def free_bytes(path: Path) -> int:
    """Free space on the disk that holds `path`, or would once it is made."""
    return shutil.disk_usage(nearest_existing(path)).free


def bytes_in(path: Path) -> int:
    """A file's size, or the sum of a folder's files."""
    return path.stat().st_size if path.is_file() else sum(file.stat().st_size for file in path.rglob("*")
                                                          if file.is_file())


def disk_space(path: Path) -> str:
    """The free space beside `path`, as a failed write's message gives it."""
    free = free_bytes(path) / 2**20
    return f"{free:.1f} MiB free on its disk{': it is full' if free < 1 else ''}"


def write_failure(path: Path, err: BaseException) -> str:
    """Why writing `path` failed: the OS's reason with its errno where there is one, and the space left."""
    # torch.save writing into a Python file keeps the file's OSError as its RuntimeError's context.
    failed = next((cause for cause in (err, err.__context__) if isinstance(cause, OSError) and cause.errno), None)
    if failed is None:
        return f"{str(err).splitlines()[0]} ({disk_space(path)})"
    return f"{failed.strerror} ({errno_name(failed)}; {disk_space(path)})"


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """write(temporary path), then rename over `path`, which readers therefore see whole or not at all."""
    temporary = path.with_name(f".{path.name}.partial-{os.getpid()}")  # ranks may race
    try:
        write(temporary)
        os.replace(temporary, path)
    except (OSError, RuntimeError) as err:
        temporary.unlink(missing_ok=True)
        if isinstance(err, RuntimeError) and not WRITE_FAILED.search(str(err)):
            raise  # not a write that failed: a bug
        raise WriteError(f"could not write {path}: {write_failure(path, err)}; any earlier {path.name} is "
                         "intact") from err


@contextmanager
def one_process_at_a_time(folder: Path) -> Iterator[None]:
    """The folder `folder` locked (flock) while the block runs, made first where it is not there: processes that would
    make the same file in it (the processes of a node indexing the same data) come in one after another, and the
    later ones find what the first made. Where it cannot be made or locked (a read-only place; a network file system
    may refuse a lock), each comes in at once."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        descriptor = None
    try:
        if descriptor is not None:
            with suppress(OSError):
                fcntl.flock(descriptor, fcntl.LOCK_EX)  # released when the descriptor closes, or its process ends
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Around writes into `path` that add to a file as the run goes: a failed one (a full disk) raises WriteError
    naming the path and the errno."""
    try:
        yield
    except OSError as err:
        raise WriteError(f"could not write {path}: {write_failure(path, err)}") from err


class LogFile(logging.FileHandler):
    """The run's log file: Hydra's `file` handler (conf/train.yaml). Once a write to it fails (a full disk), it ends at
    its last whole line and takes no more, and the console, which has every line too, says so once. Logging's own
    handler would print an 80-line "--- Logging error ---" on stderr for that line and each one after."""

    def __init__(self, filename, *args, **kwargs):
        super().__init__(filename, *args, **kwargs)
        self.whole = os.path.getsize(self.baseFilename) if os.path.exists(self.baseFilename) else 0
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed:
            return
        super().emit(record)  # which flushes, or calls handleError
        if not self.failed and self.stream is not None:
            self.whole = os.fstat(self.stream.fileno()).st_size

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if not isinstance(err, OSError):
            super().handleError(record)  # a logging call of ours that is wrong: a bug, shown as one
            return
        self.failed = True
        stream, self.stream = self.stream, None
        with suppress(OSError):
            stream.close()  # its buffered rest may or may not reach the disk
        with suppress(OSError):
            os.truncate(self.baseFilename, self.whole)  # cutting the file frees space: it works on a full disk
        log.warning("could not write %s: %s; it ends at its last whole line, and the console has the rest",
                    self.baseFilename, write_failure(Path(self.baseFilename), err))
