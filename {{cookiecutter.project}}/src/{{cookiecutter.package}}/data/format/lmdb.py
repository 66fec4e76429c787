"""`format=lmdb`: encoded bytes in an LMDB key-value file, memory-mapped and read without locks."""
import itertools
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ...core.errors import ConfigError
from . import Packed, PackedFile

LABELS = b"__labels__"


def _key(index: int) -> bytes:
    return f"{index:09d}".encode()


def _environment(path: Path, **options):
    import lmdb  # the extra, checked where the option is built (its _facts_) and by pack
    # lock=False: the file is read-only from here on. readahead=True: without it the map is MADV_RANDOM and an image
    # is read one 4 KB page fault at a time, each a request to the storage; on the simulated NFS share
    # (scripts/slowdisk.py --profile nfs) that read 43 images/s against 271 with readahead (docs/benchmarks.md).
    return lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=True, meminit=False,
                     max_readers=1024, **options)


# LMDB refuses to open a file a second time in one process while the first environment lives ("already open in this
# process"): a reader dropped but not yet collected, say an earlier loader's, would fail the next one. Each process
# keeps one environment per file, counted by its users, keyed by the process that opened it.
_OPEN: dict[tuple[int, str], list] = {}


def acquired(key: tuple[int, str]):
    """The environment of `key` (this process's id, the file), opened on first use; give it back with `released`.
    Environments of the file inherited from the process this one was forked from are closed first."""
    if key not in _OPEN:
        for inherited in [other for other in _OPEN if other[1] == key[1] and other[0] != key[0]]:
            _OPEN.pop(inherited)[0].close()
        _OPEN[key] = [_environment(Path(key[1])), 0]
    _OPEN[key][1] += 1
    return _OPEN[key][0]


def released(key: tuple[int, str]) -> None:
    """One user fewer; the last closes it. In a process forked from the one that opened it, it is closed at once:
    its handles must not cross fork, and the file cannot be opened again here while it lives."""
    if key not in _OPEN:  # an inherited one, closed already when this process opened the file itself
        return
    _OPEN[key][1] -= 1
    if _OPEN[key][1] == 0 or key[0] != os.getpid():
        _OPEN.pop(key)[0].close()


@contextmanager
def reading(path: Path):
    """LMDB's errors while a run reads the pack, as one line naming the file: pages damaged or replaced since pack
    wrote it (the file's size is checked when it is opened)."""
    import lmdb
    try:
        yield
    except lmdb.Error as err:
        raise ConfigError(f"{path} is damaged ({err.__class__.__name__}: {err}): pack it again") from None


class LmdbImages(Packed):
    def __init__(self, path: Path, split: dict):
        import lmdb
        key = (os.getpid(), str(path))
        try:
            with acquired(key).begin() as txn:
                labels = np.frombuffer(txn.get(LABELS), np.int64).copy()
        except (lmdb.Error, TypeError) as err:
            raise ConfigError(f"{path} is not a readable LMDB pack (written by pack): {err}") from None
        finally:
            if key in _OPEN:  # not where opening it failed
                released(key)
        super().__init__(path, labels)

    def open(self) -> None:
        self._held = (os.getpid(), str(self.path))
        self._txn = acquired(self._held).begin(buffers=False)

    def close(self) -> None:
        if self._held[0] == os.getpid():
            self._txn.abort()  # its reader slot, for the environment's other users
        released(self._held)

    def payload(self, index: int) -> bytes:
        with reading(self.path):
            return self._txn.get(_key(index))

    def payloads(self, start: int, stop: int) -> list[bytes]:
        """Walked with a cursor in key order: the records lie on consecutive pages, which readahead reads in long
        requests."""
        with reading(self.path), self._txn.cursor() as cursor:
            cursor.set_key(_key(start))
            return [value for _, value in itertools.islice(cursor, stop - start)]


class Lmdb(PackedFile):
    kind = "lmdb"
    reader = LmdbImages
    suffix = ".lmdb"

    def write(self, path: Path, records, chunk_mb: float) -> None:
        import lmdb
        labels = []
        # A sparse map: the file grows only as far as it is written.
        with lmdb.open(str(path), subdir=False, map_size=1 << 40, lock=True, sync=True) as env:
            txn = env.begin(write=True)
            for index, (data, label) in enumerate(records):
                txn.put(_key(index), data)
                labels.append(label)
                if index % 1000 == 999:
                    txn.commit()
                    txn = env.begin(write=True)
            txn.put(LABELS, np.array(labels, dtype=np.int64).tobytes())
            txn.commit()
        Path(f"{path}-lock").unlink(missing_ok=True)  # readers open with lock=False; a stale lock file would be copied
