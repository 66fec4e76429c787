"""`loader.num_workers=auto`: time a short sweep of worker counts once per machine and data set, keep the fastest."""
import json
import logging
import platform
import time
from collections.abc import Callable, Iterable

import torch

from ..contracts import Decoder
from ..core.errors import ConfigError
from ..core.files import WriteError, user_cache, write_atomic
from ..core.hardware import cores_per_process, synchronize

log = logging.getLogger(__name__)

CACHE = user_cache() / "num_workers.json"
WARMUP_BATCHES = 2  # worker start-up and first file reads, not counted
# Batches a worker makes before it reuses its batch buffers (batch_memory.py), not counted where the data set allows:
# a larger count would be timed at the first allocations' cost.
WARMUP_PER_WORKER = 3
TIMED_BATCHES = 8
CLOSE_ENOUGH = 0.05  # a smaller count within 5% of the fastest wins: fewer processes, less memory


def candidates(cores: int, decodes_beside: bool) -> list[int]:
    """1, 2, 4, ... up to the cores this process may use, and that count itself; and 0 for a decoder that decodes
    beside the training process, which then reads the files while it decodes (any other decoder would decode in
    the training step's place)."""
    counts, count = {cores} | ({0} if decodes_beside else set()), 1
    while count < cores:
        counts.add(count)
        count *= 2
    return sorted(counts)


def images_per_s(loader, batch_size: int, device: torch.device, warmup: int = WARMUP_BATCHES) -> float:
    batches = iter(loader)
    for _ in zip(range(warmup), batches):
        pass
    synchronize(device)
    start, timed = time.perf_counter(), 0
    for timed, _ in enumerate(batches, start=1):
        if timed == TIMED_BATCHES:
            break
    synchronize(device)  # a GPU decoder's batches are queued work until then
    return timed * batch_size / (time.perf_counter() - start)


def read_cache(setting: str) -> dict:
    """The measured worker counts, or none when the cache is missing or unreadable: they are measured again."""
    try:
        return json.loads(CACHE.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("%s=auto: ignoring the unreadable cache %s (%s)", setting, CACHE, err)
        return {}


def work_of(decoder: Decoder, crop_size: int, transform: Callable | None = None) -> str:
    """What the workers and the decoder do to each image, as the cache of measured counts tells them apart;
    `transform`: the training split's, where an augmentation policy wraps the decoder's."""
    return f"{type(decoder).__module__}.{type(decoder).__name__}|crop {crop_size}|decoded" + (
        f"|{transform!r}" if transform is not None else "")


def check_worker_count(value, setting: str) -> None:
    """Refuse, in one line, a `setting` that is neither a count of workers nor auto."""
    if value != "auto" and not (isinstance(value, int) and value >= 0):
        raise ConfigError(f"{setting}={value!r}: pass a count (0 = load in the training process) or auto")


def pick_num_workers(value: int | str, dataset, batch_size: int, work: str,
                     loader_with: Callable[[int], Iterable], decodes_beside: bool = False,
                     device: torch.device = torch.device("cpu"), setting: str = "loader.num_workers",
                     data: str | None = None) -> int:
    """The worker count to use: `value` as given, or for `auto` the fastest of a sweep of `loader_with(count)`
    (batches as the device receives them, decoded), measured once per machine, data set and `work` (what the
    workers and the decoder do to each image); `decodes_beside`: see `candidates`; `setting`: the key a line names;
    `data`: the data set's name for the cache, where its first file's name changes between runs (a copy in a
    temporary folder)."""
    check_worker_count(value, setting)
    if value != "auto":
        return value
    cores = cores_per_process()
    key = f"{platform.node()}|{cores} cores|{data or dataset.store.name(0)}|{len(dataset)}|{work}|batch {batch_size}"
    cache = read_cache(setting)
    if key in cache:
        log.info("%s=auto: %d (measured before, cached in %s)", setting, cache[key], CACHE)
        return cache[key]
    batches = len(dataset) // batch_size
    if batches < WARMUP_BATCHES + TIMED_BATCHES:  # too few to time; an epoch this short is over in moments anyway
        workers = max(1, min(cores, batches))
        log.info("%s=auto: the training set has %d batches, fewer than the %d a sweep times; using %d, a worker per "
                 "core this process may use (%d) and no more than the batches", setting, batches,
                 WARMUP_BATCHES + TIMED_BATCHES, workers, cores)
        return workers
    rates, spare = {}, batches - TIMED_BATCHES
    for count in candidates(cores, decodes_beside):
        warmup = min(max(WARMUP_BATCHES, WARMUP_PER_WORKER * count), spare)
        rates[count] = images_per_s(loader_with(count), batch_size, device, warmup)
    best = max(rates.values())
    workers = min(count for count, rate in rates.items() if rate >= (1 - CLOSE_ENOUGH) * best)
    log.info("%s=auto: %s images/s by worker count; using %d", setting,
             ", ".join(f"{count}: {rate:.0f}" for count, rate in rates.items()), workers)
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(CACHE, lambda path: path.write_text(json.dumps({**cache, key: workers}, indent=1)))
    except (OSError, WriteError) as err:
        log.warning("%s=auto: could not cache the measurement in %s (%s); the next run measures again", setting,
                    CACHE, err)
    return workers
