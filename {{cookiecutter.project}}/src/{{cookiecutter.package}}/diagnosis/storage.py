"""Storage or decode: when data loading sets the pace, were the loader's workers waiting on reads or busy decoding,
or, with a decoder that decodes whole batches in the training process, was that process decoding?

The workers time each image's read from the store apart from its decode and crop (`data.images.ReadTimes`):
`loader/read_share` is the percentage of their time per image spent reading. iowait says the same for local
disks, but waits on FUSE, NFS or object storage barely raise it, so the workers' own figure decides first.

That figure says something only where the workers decode. A decoder whose facts say `gpu` (nvjpeg, dali) decodes
whole batches where they are uploaded, in the training process; its workers only read the bytes and walk the
headers, so their read share is about 90% even from the page cache. For it, the training process's own figure
decides (`data.device.UploadTimes`): `loader/upload_share` is the percentage of the time it took to get each batch
spent uploading, that is decoding, it rather than waiting for the workers' batch.
"""
from .. import options
from ..core.hardware import Hardware
from .advice import Settings, Suggestion

READS_DOMINATE = 50.0  # percent of a worker's time per image spent reading: from here on, storage sets the pace
IOWAIT_HIGH = 10.0  # percent of CPU time stalled on disk
READERS_PER_CORE = (2, 4)  # workers that mostly wait on reads take little CPU: 2-4x the cores keeps reads in flight
DEVICE_DECODING_DOMINATES = 50.0  # percent of the time to get a batch spent decoding it: from here on, that decides


def workers_decode(settings: Settings) -> bool:
    """Whether the loader's workers decode: not for a decoder whose facts say `gpu`, which decodes whole batches in
    the training process (on the GPU, or on the CPU in its on_cpu mode)."""
    return not settings.facts("decoder").gpu


def storage_limits(system: dict[str, float], settings: Settings) -> bool:
    reading = workers_decode(settings) and system.get("loader/read_share", 0.0) >= READS_DOMINATE
    return reading or system.get("sys/iowait", 0.0) >= IOWAIT_HIGH


def device_decoding_limits(system: dict[str, float], settings: Settings) -> bool:
    return not workers_decode(settings) and system.get("loader/upload_share", 0.0) >= DEVICE_DECODING_DOMINATES


def reading_fact(system: dict[str, float], settings: Settings) -> str:
    share, iowait = system.get("loader/read_share", 0.0), system.get("sys/iowait", 0.0)
    if workers_decode(settings) and share >= READS_DOMINATE:
        return (f"the loader's workers spent {share:.0f}% of each image's time reading it "
                f"({system['loader/read_ms']:.1f} ms a read, {system['loader/decode_ms']:.1f} ms decoding)")
    return f"the CPU stalled on disk reads {iowait:.0f}% of the time (iowait {iowait:.0f}%)"


def device_decoding_fact(system: dict[str, float], hardware: Hardware) -> str:
    share = system["loader/upload_share"]
    return (f"the training process spent {share:.0f}% of the time it took to get each batch decoding it on the "
            f"{hardware.processor} ({system['loader/upload_ms']:.1f} ms a batch) and {100 - share:.0f}% waiting for "
            "the loader's workers")


def loader_cause(system: dict[str, float], hardware: Hardware, settings: Settings) -> str:
    """The verdict's second sentence: what the workers, or with a batch decoder the training process, were doing,
    where they measured it."""
    if not workers_decode(settings):
        if not system.get("loader/upload_ms", 0.0):
            return ""
        share, upload_ms = system["loader/upload_share"], system["loader/upload_ms"]
        if device_decoding_limits(system, settings):
            return (f" The training process was decoding: {share:.0f}% of the time it took to get each batch went to "
                    f"decoding it on the {hardware.processor} ({upload_ms:.1f} ms a batch), {100 - share:.0f}% to "
                    "waiting for the loader's workers.")
        return (f" The training process was waiting for the loader's workers, which only read the files for "
                f"decoder={settings.option('decoder')}: {100 - share:.0f}% of the time it took to get each batch, "
                f"{share:.0f}% decoding it on the {hardware.processor} ({upload_ms:.1f} ms a batch).")
    if "loader/read_share" not in system or not system.get("loader/read_ms", 0.0) + system.get("loader/decode_ms", 0.0):
        return ""
    if storage_limits(system, settings):
        return f" The loader's workers were waiting on storage: {reading_fact(system, settings)}."
    return (f" The loader's workers were busy decoding: decoding and cropping took "
            f"{100 - system['loader/read_share']:.0f}% of each image's time ({system['loader/decode_ms']:.1f} ms an "
            f"image, {system['loader/read_ms']:.1f} ms reading).")


def device_decoding_side(system: dict[str, float], hardware: Hardware, settings: Settings,
                         cpu_saturated: float) -> list[Suggestion]:
    """Decode less where the batches are decoded, or decode in the workers, where the CPU has cores to spare
    (below `cpu_saturated` percent busy). Never storage's switches: reading faster would not shorten the wait."""
    fact, found = device_decoding_fact(system, hardware), []
    if hardware.on_gpu and not settings.facts("decoder").region_decode:
        found += [Suggestion(key="decoder", value=option, why="Decode only what each crop keeps, on the GPU",
                             fact=f"{fact}; decoder={option} decodes only the crop's region", side="data")
                  for option in options.gpu_options("decoder")
                  if options.facts("decoder", option).region_decode and not options.facts("decoder", option).missing()]
    cpu = system.get("sys/cpu_util")
    if cpu is not None and cpu < cpu_saturated:
        found.append(Suggestion(key="decoder", value=options.fastest_cpu_decoder(), side="data",
                                why="Decode in the loader's workers instead, with the fastest CPU decoder installed "
                                "here",
                                fact=f"{fact}, with the CPU {cpu:.0f}% busy on {hardware.cores} cores"))
    return found


def storage_side(system: dict[str, float], hardware: Hardware, settings: Settings) -> list[Suggestion]:
    """Read from RAM, read in bigger pieces, keep more reads in flight, or read less often."""
    fact, found = reading_fact(system, settings), []
    streams = settings.facts("format").streams  # nothing for a staging option to copy: say where its chunks go
    if streams:
        found.append(Suggestion(key="format.cache_dir", value=None, side="data", fact=fact, tunable=False,
                                why=f"Read the chunks from RAM: format={settings.option('format')} {streams}"))
    elif not settings.facts("staging").copies_to_ram:
        found += [Suggestion(key="staging", value=option, side="data", fact=fact,
                             why="Copy the data into RAM once, if it fits")
                  for option in options.having("staging", "copies_to_ram")]
    if settings.facts("format").reads_runs and not settings.facts("order").in_runs:
        found += [Suggestion(key="order", value=option, side="data", fact=fact,
                             why="Read big and shuffle in memory: runs of consecutive records, one request each")
                  for option in options.having("order", "in_runs")]
    more = next((factor * hardware.cores for factor in READERS_PER_CORE
                 if settings.num_workers < factor * hardware.cores), None)
    if more:  # after RAM, which takes the reads away; more readers only queue more of them
        found.append(Suggestion(key="loader.num_workers", value=str(more), side="data", fact=fact,
                                why=f"Keep more reads in flight: workers waiting on reads take little CPU, so {more} "
                                f"fit on {hardware.cores} cores (now {settings.num_workers})"))
    if not settings.facts("format").packed:
        packs = options.having("format", "packed_for_storage")
        # Read at random, a pack still pays a request per image, and more than the image where its reads are
        # larger (an HDF5 chunk): slower than the files on the simulated NFS share (docs/benchmarks.md).
        runs = {"order": options.only("order", "in_runs")} if options.facts("format", packs[0]).reads_runs else {}
        found.append(Suggestion(
            key="format", value=packs[0], why="Turn many small reads into a few long ones: pack once with "
            f"`python -m {options.PACKAGE}.pack format={packs[0]}`"
            + "".join(f" (or format={other})" for other in packs[1:])
            + (" and read it in runs" if runs else "")
            + f"; `python -m {options.PACKAGE}.bench` measures how fast each format reads from this storage",
            fact=fact, side="data", tunable=False, also=runs))
    if settings.prefetch_factor < 4:
        found.append(Suggestion(key="loader.prefetch_factor", value="4", side="data", fact=fact,
                                why="Queue more batches ahead of the step"))
    return found
