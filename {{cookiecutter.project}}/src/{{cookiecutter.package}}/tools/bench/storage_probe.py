"""bench's storage probe: how fast the data set's own storage serves the reads each format makes, and whether
storage or decoding limits the loader.

For each format: random reads of whole images the way training reads them (the format's store, in 1 and in N
worker processes), and the sequential rate of its largest file. Cold where the OS lets this process drop the
files' cached pages (posix_fadvise DONTNEED), verified with a read that must not wait (RWF_NOWAIT); marked warm
otherwise, and always on a file system that holds its files in RAM (tmpfs, ramfs). A read rate below the decode
ceiling at the same worker count means storage limits the loader: the region-decode ceiling for a decoder that
decodes only the crop's region, the full-decode one otherwise.
"""
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from torch.utils.data import DataLoader, Dataset

from ... import options
from ...contracts import Store
from ...core import failures
from ...core.errors import ClearError
from ...core.files import file_systems
from .results import BenchCsv
from .ceilings import Ceiling, Ceilings, cores_for

log = logging.getLogger(__name__)

PROBE_READS = 200  # random images read per probe, at most
BATCH = 8  # images a worker reads per message back, as a loader's batch: the probe times reads, not messages
SEQUENTIAL_BYTES = 256 << 20  # read from the largest file, at most
CHUNK = 8 << 20


class Payloads(Dataset):
    """A store's images at `indices`, read whole; what crosses back is their size."""

    def __init__(self, store: Store, indices: list[int]):
        self.store, self.indices = store, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> int:
        payload, _ = self.store.read(self.indices[position])
        return len(payload) if isinstance(payload, bytes) else int(payload.nbytes)


RAM_FILE_SYSTEMS = {"tmpfs", "ramfs"}  # their files are their pages: nothing to drop, no read from a disk
# A drop asked again, after a pause, where the first left the pages cached: the kernel drops only the pages no CPU's
# batch of newly cached pages still holds, and on a busy machine some may be held a moment longer (0.15 s of asking
# was too short for a fast tier beside other jobs on 2 cores).
DROP_ATTEMPTS, DROP_WAIT_S = 6, 0.2  # at most a second, spent only where a drop did not take


def drop_cached(files: list[Path]) -> str:
    """Ask the OS to forget the files' cached pages; say whether the first one is now cold, checked by a read
    that fails rather than wait for the disk."""
    if not files:
        return "warm: not in local files"
    # Checked first: dropping a tmpfs file's pages does nothing, and a read that must not wait is refused there on
    # some kernels, which would read as a file system that cannot confirm the drop.
    if in_ram := sorted(file_systems(files) & RAM_FILE_SYSTEMS):
        return f"warm: on {' and '.join(in_ram)}, which holds its files in RAM"
    if not hasattr(os, "posix_fadvise"):
        return "warm: this OS cannot drop a file's cached pages"
    probe = next((file for file in files if file.stat().st_size), files[0])
    for attempt in range(DROP_ATTEMPTS):
        for file in files if attempt == 0 else [probe]:
            with open(file, "rb") as handle:
                os.fdatasync(handle.fileno())  # pages not yet written back (a data set just written) cannot be dropped
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        with open(probe, "rb", buffering=0) as handle:
            try:
                served = os.preadv(handle.fileno(), [bytearray(4096)], 0, os.RWF_NOWAIT)
            except BlockingIOError:
                return "cold (dropped with posix_fadvise, checked with RWF_NOWAIT)"
            except (OSError, AttributeError):  # AttributeError: no RWF_NOWAIT on this OS or Python
                return "cold (dropped with posix_fadvise; this file system cannot confirm it)"
        if not served:
            return "cold (dropped with posix_fadvise)"
        time.sleep(DROP_WAIT_S)
    return "warm: the OS kept the pages cached"


def read_rate(store: Store, indices: list[int], readers: int) -> tuple[float, float, float]:
    """(images/s, MB/s, seconds to the first batches) of whole-image random reads through `store` by `readers`
    worker processes (1: this one), BATCH to a message. Each worker's first batch, which includes its start and
    the opening of the format's files (format=tensor reads its whole file then), is timed apart."""
    workers = readers if readers > 1 else 0
    batch = max(1, min(BATCH, len(indices) // (4 * max(1, workers))))  # a small data set: several batches per reader
    loader = DataLoader(Payloads(store, indices), batch_size=batch, collate_fn=list, num_workers=workers,
                        prefetch_factor=4 if workers else None)
    began = time.perf_counter()
    batches = iter(loader)
    for _ in range(max(1, workers)):
        next(batches)
    start = time.perf_counter()
    timed = [size for batch in batches for size in batch]
    elapsed = max(time.perf_counter() - start, 1e-9)
    return len(timed) / elapsed, sum(timed) / 1e6 / elapsed, start - began


def sequential_mb_s(files: list[Path]) -> tuple[float, str]:
    """MB/s reading the largest of `files` from its start in CHUNK requests, and which file that was."""
    if not files:
        return 0.0, "no local files"
    largest = max(files, key=lambda file: file.stat().st_size)
    read, start = 0, time.perf_counter()
    with open(largest, "rb", buffering=0) as handle:
        while read < SEQUENTIAL_BYTES and (chunk := handle.read(CHUNK)):
            read += len(chunk)
    return read / 1e6 / max(time.perf_counter() - start, 1e-9), f"{largest.name}, {read / 1e6:.1f} MB"


def storage_rows(stores: dict[str, Store], readers: list[int], ceilings: dict[int, float],
                 region: bool = False) -> Iterator[dict]:
    """bench rows for each format's training store, each as soon as it is measured: random reads at each reader
    count, with the side that limits a loader of as many workers, whose decoder's ceiling is `ceilings[workers]`
    (the region-decode one where `region`, else the full-decode one), and the sequential rate of the largest file
    the reads touch."""
    decodes, share = ("region decodes/s", "vs_region_ceiling") if region else ("full decodes/s", "vs_ceiling")
    for format, store in stores.items():
        indices = random.Random(0).sample(range(len(store)), min(PROBE_READS, len(store)))
        files = store.files(indices)
        drop_cached(files)
        sequential, which = sequential_mb_s(files)
        # The most readers first: a store read in this process cannot be opened again in workers forked from it
        # (LMDB refuses an environment inherited through fork).
        for count in sorted(readers, reverse=True):
            cache = drop_cached(files)
            rate, mb_s, opening = read_rate(store, indices, count)
            ceiling = ceilings[count]
            limit = (f"storage limits a {count}-worker loader: {rate:.0f} reads/s < {ceiling:.0f} {decodes}"
                     if rate < ceiling else f"decoding limits a {count}-worker loader: {ceiling:.0f} {decodes} <= "
                     f"{rate:.0f} reads/s")
            yield {"decoder": "storage", "format": format, "num_workers": count, "images_per_s": rate,
                   share: rate / ceiling, "read_mb_s": mb_s, "sequential_mb_s": sequential,
                   "page_cache": cache, "reference": True, "unreadable": "",
                   "limit": "storage" if rate < ceiling else "decode", "first_batch_s": opening,
                   "note": f"random whole-image reads as format={format} reads them, after a first batch per "
                           f"reader in {opening:.2f} s (start, opening); {limit}; sequential: the largest file "
                           f"({which})"}


def training_decoder() -> str:
    """The decoder a training run here decodes with when none is named: the default, or the fastest CPU decoder
    installed where the default is not (as the loader assembly's check_fit does)."""
    default = options.default("decoder")
    return options.fastest_cpu_decoder() if options.facts("decoder", default).missing() else default


def probe_ceiling(references: Ceilings) -> tuple[Ceiling, bool]:
    """What the probe compares reads with, and whether it is the region-decode ceiling: that one where the decoder
    training uses here decodes only the crop's region (its facts say region_decode) and bench measured a region
    ceiling, the full-decode one otherwise."""
    decoder = training_decoder()
    regional = options.facts("decoder", decoder).region_decode
    if regional and references.region is None:
        log.warning("decoder=%s, which training uses here, decodes regions, and bench.decoders has no decoder that "
                    "does: the storage probe compares reads with the full-decode ceiling", decoder)
    if regional and references.region is not None:
        return references.region, True
    return references.full, False


class ProbeFailed(ClearError):
    """The storage probe failed; the rows measured before it are in bench.csv."""


def probe(formats: list[str], train_split: Callable[[str], Store], readers: list[int], references: Ceilings,
          written: BenchCsv) -> None:
    """The probe's rows for each of `formats` (`train_split(format)`: its training store), into `written` as each is
    measured, beside the ceiling of the decoder training uses here."""
    ceiling, region = probe_ceiling(references)
    ceilings = {count: ceiling.rate * cores_for(count) for count in readers}
    for format in formats:
        try:
            for row in storage_rows({format: train_split(format)}, readers, ceilings, region):
                written.add([row], probed=True)
        except Exception as err:  # noqa: BLE001 - whatever failed in it, the user's way on is the same
            # The probe is a measurement beside the rows, which are on disk already: one line, and the traceback in
            # the run's log.
            said = failures.worker_message(str(err)).splitlines()
            why = said[0][:300] if said else "no message"
            raise ProbeFailed(f"the storage probe failed on format={format} ({type(err).__name__}: {why}); the "
                              f"{len(written.measured) + len(written.probed)} rows measured before it are in "
                              f"{written.path}; bench.probe_storage=false leaves the probe out") from err
