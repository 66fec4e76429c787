"""The end-of-run answer to "is data loading the bottleneck?", and which switch to flip next, as data.

`diagnose` turns the measured split, the system load, the run's settings and this machine's `Hardware`
into a bound, a verdict and `Suggestion` records. The report's English, summary.json and tune all read
those records; each names the measurement or hardware fact that makes it apply here. A switch this
machine cannot profit from (bf16 where it is emulated) is not suggested; it is `withheld`, with its fact.
"""
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .. import options
from ..core.hardware import Hardware
from ..data.crops import TrainCrop
from ..loop.clock import Window
from ..loop.compile import GRAPHS_PASSED_ON
from .advice import Settings, Suggestion
from .ranks import RankTimes, straggler
from .storage import (device_decoding_limits, device_decoding_side, loader_cause, storage_limits, storage_side,
                      workers_decode)

NOTICEABLE = 0.10  # a share of the time below this, waiting for data or for the host, is noise
BOUND = 0.30  # from this share on, that wait sets the pace
CPU_SATURATED = 85.0  # percent of all cores
FEW_STEPS_PER_SYNC = 50  # train.log_every below this syncs often enough to show in a host-bound run
SIDES = ("data", "host", "compute")
EPOCH_START_SHARE = 0.03  # each epoch's wait for its first batch, from this share of the time on, is worth a switch


@dataclass
class Diagnosis:
    bound: str  # data | host | compute: what to fix first
    verdict: str
    suggestions: list[Suggestion]
    withheld: list[Suggestion]  # switches that would help elsewhere, not on this machine, with the fact why
    data_cost: float  # the share of the step data loading costs (see costs)

    @property
    def advice(self) -> list[str]:
        return [suggestion.line() for suggestion in self.suggestions]


def costs(total: Window, system: dict[str, float], hardware: Hardware) -> dict[str, float]:
    """The share of the step data loading and the host cost. On a GPU that is the time the device sat idle for
    them. On a CPU, where the step and the loader's workers share the cores, data loading also costs the share
    of the cores the workers took (sys/loader_cpu) from the time the step computed."""
    data = total.data_frac
    if not hardware.on_gpu:
        data += (1 - data) * system.get("sys/loader_cpu", 0.0) / 100
    return {"data": data, "host": total.host_frac}


def bound(shares: dict[str, float]) -> str:
    """`data` or `host` when that share is noticeable and the larger of the two; `compute` otherwise.

    Idle time is what a faster configuration can win back; compute time is the floor until the step
    itself gets cheaper.
    """
    share, name = max((shares["data"], "data"), (shares["host"], "host"))
    return name if share >= NOTICEABLE else "compute"


def diagnose(total: Window, system: dict[str, float], hardware: Hardware, settings: Settings,
             ranks: Sequence[RankTimes] = ()) -> Diagnosis:
    """The bound, a one-sentence verdict and the switches that fit, from the measured split, system load,
    options and hardware. The suggestions for the bound come first, then those for the other idle share if
    it is noticeable too. A rank that holds the others back (`ranks`: every rank's split) gets the verdict, and
    a look at its host instead of switches that act on every rank."""
    shares = costs(total, system, hardware)
    lagging = straggler(ranks)
    if lagging is not None:
        return Diagnosis(lagging.side, lagging.verdict(), [lagging.suggestion(), *epoch_start_side(total, settings)],
                         withheld(hardware, settings), shares["data"])
    first = bound(shares)
    data, host = f"{100 * total.data_frac:.0f}%", f"{100 * total.host_frac:.0f}%"
    strength = "the bottleneck" if shares.get(first, 0.0) >= BOUND else "a partial bottleneck"
    workers = system.get("sys/loader_cpu", 0.0)
    took = (f", and the loader's workers took {workers:.0f}% of the cores the step computes on"
            if not hardware.on_gpu and workers >= 100 * NOTICEABLE else "")
    if first == "data":
        verdict = (f"Data loading is {strength}: the {hardware.processor} waited for data {data} of the time{took}."
                   + loader_cause(system, hardware, settings))
    elif first == "host":
        verdict = (f"The host is {strength}: the GPU sat idle {host} of the time with the next batch ready, "
                   f"waiting for Python, kernel launches or syncs (data wait {data}).")
    else:
        verdict = f"Data loading is not the bottleneck: the {hardware.processor} waited for data {data} of the time."
        if hardware.on_gpu:
            verdict += f" The GPU computed {100 * total.compute_s / max(total.wall_s, 1e-9):.0f}% of the time."
    sides = [first, *(other for other, share in shares.items() if other != first and share >= NOTICEABLE)]
    suggestions = [suggestion for side in sides for suggestion in RULES[side](total, system, hardware, settings)]
    suggestions += epoch_start_side(total, settings)
    proven = [suggestion for suggestion in suggestions if suggestion.passed(hardware.device)]
    untested = [untested_here(suggestion, hardware) for suggestion in suggestions if suggestion not in proven]
    return Diagnosis(first, verdict, proven, withheld(hardware, settings) + untested, shares["data"])


def untested_here(suggestion: Suggestion, hardware: Hardware) -> Suggestion:
    """The suggestion withheld, with the devices its tests have passed on as the fact."""
    where = f"on {', '.join(suggestion.passed_on)} alone" if suggestion.passed_on else "on no device yet"
    return replace(suggestion, tunable=False, why=f"Not advised here until its tests pass on the {hardware.device} "
                   f"(pytest -m gpu): {suggestion.why[0].lower()}{suggestion.why[1:]}",
                   fact=f"its tests have passed {where}; {suggestion.fact}")


def data_side(total: Window, system: dict[str, float], hardware: Hardware, settings: Settings) -> list[Suggestion]:
    """The device waits for batches: read, decode or copy them faster."""
    cpu, cores = system.get("sys/cpu_util", 0.0), hardware.cores
    waited = f"the {hardware.processor} waited for data {100 * total.data_frac:.0f}% of the time"
    found = on_the_device(hardware, settings, waited)
    workers = system.get("sys/loader_cpu", 0.0)
    if device_decoding_limits(system, settings):
        found += device_decoding_side(system, hardware, settings, CPU_SATURATED)
    elif storage_limits(system, settings):
        found += storage_side(system, hardware, settings)
    elif not hardware.on_gpu and workers >= 100 * NOTICEABLE:
        found += lighter_decoding(settings, hardware, f"the loader's workers took {workers:.0f}% of the {cores} "
                                                      "cores the step computes on")
    elif cpu >= CPU_SATURATED:
        saturated = f"the CPU is saturated, {cpu:.0f}% of {cores} cores: decoding and cropping are the limit and " \
                    "more workers will not help"
        found += lighter_decoding(settings, hardware, saturated)
    else:
        headroom = f"{waited}, with the CPU {cpu:.0f}% busy on {cores} cores"
        if settings.num_workers < cores:
            work = "Decode" if workers_decode(settings) else "Read the files"  # a batch decoder's workers only read
            found.append(Suggestion(key="loader.num_workers", value=str(cores), side="data", fact=headroom,
                                    why=f"{work} in one process per core (now {settings.num_workers})"))
        if settings.prefetch_factor < 4:
            found.append(Suggestion(key="loader.prefetch_factor", value="4", side="data", fact=headroom,
                                    why=f"Smooth out slow batches (now {settings.prefetch_factor})"))
    if hardware.on_gpu and not settings.pin_memory:
        found.append(Suggestion(key="loader.pin_memory", value="true", why="Copy to the GPU from page-locked memory",
                                fact=f"{waited}, and its copies come from pageable memory", side="data"))
    if hardware.on_gpu and not settings.facts("prefetcher").overlaps_copy:
        found += [Suggestion(key="prefetcher", value=option, side="data", fact=waited,
                             why="Overlap each batch's copy with the previous step")
                  for option in options.having("prefetcher", "overlaps_copy")]
    return found


def on_the_device(hardware: Hardware, settings: Settings, waited: str) -> list[Suggestion]:
    """Hold the run's pixel pack in the device's memory and cut the batches there, where it fits."""
    if settings.pack_fits is None:
        return []
    staging = options.only("staging", "on_device")
    return [Suggestion(key="staging", value=staging, side="data", fact=f"{waited}; {settings.pack_fits}",
                       why="Hold the pack in the device's memory and cut each batch there, with no loader worker")]


def epoch_start_side(total: Window, settings: Settings) -> list[Suggestion]:
    """Keep the workers between epochs, when they start again at each and the wait for each epoch's first batch
    costs a share of the epoch.
    `total` leaves out the first window, so the first epoch's start (every worker's first start) is not counted."""
    restarting = not settings.persistent_workers and settings.num_workers > 0
    if not restarting or not total.epoch_starts or total.epoch_start_s < EPOCH_START_SHARE * total.wall_s:
        return []
    fact = (f"each epoch after the first waited {1000 * total.epoch_start_s / total.epoch_starts:.0f} ms for its "
            f"first batch, {100 * total.epoch_start_s / total.wall_s:.0f}% of the time")
    return [Suggestion(key="loader.persistent_workers", value="true", side="data", fact=fact,
                       why=f"Keep the {settings.num_workers} workers between epochs, instead of starting them again at "
                       "every epoch (or start fewer)")]


def lighter_decoding(settings: Settings, hardware: Hardware, saturated: str) -> list[Suggestion]:
    """Ways to spend less CPU per image, given what the run already uses."""
    if settings.facts("format").holds_pixels:
        return [Suggestion(key="data.crop_size", value=None, side="data", fact=saturated, tunable=False,
                           why="Nothing is decoded any more: only more cores per device, or smaller crops, will help")]
    found = []
    decoder, fastest = settings.facts("decoder"), options.fastest_cpu_decoder()
    if (decoder.decode_us or 0) > (least := options.facts("decoder", fastest).decode_us):
        found.append(Suggestion(key="decoder", value=fastest, side="data", why="Decode with the fastest CPU decoder",
                                fact=f"{saturated}; it takes {least:.0f} µs a training image where "
                                f"decoder={settings.option('decoder')} takes {decoder.decode_us:.0f}, one process "
                                "each (their facts' decode_us, measured by scripts/decode_cost.py)"))
    if hardware.on_gpu and not decoder.gpu:
        found += [Suggestion(key="decoder", value=option, side="data", why="Move decoding to the GPU",
                             fact=f"{saturated}; {hardware.gpu_fact}") for option in options.gpu_options("decoder")]
    side = TrainCrop(settings.crop_size).full_detail_side()
    pixels = options.only("format", "holds_pixels")
    found.append(Suggestion(
        key="format", value=pixels, side="data", fact=saturated, tunable=False,
        why=f"Decode once, offline: pack with `python -m {options.PACKAGE}.pack format={pixels} "
        f"pack.short_side={side}` (at that side the smallest random crop still has its {settings.crop_size} pixels; "
        "a smaller one saves disk at some detail)", also={"decoder": options.only("decoder", "takes_pixels")}))
    return found


def host_side(total: Window, system: dict[str, float], hardware: Hardware, settings: Settings) -> list[Suggestion]:
    """The GPU waits on the host between launches: fewer, bigger kernels and fewer syncs."""
    idle = f"the GPU sat idle {100 * total.host_frac:.0f}% of the time with the next batch ready"
    found = []
    if hardware.on_gpu and not settings.compile:
        found.append(Suggestion(key="model.compile", value="true", side="host", fact=idle,
                                why="Fuse the step's many small kernels into few, so the host launches less"))
    if hardware.on_gpu and not settings.cuda_graphs and settings.graphs_refused is None:
        found.append(Suggestion(key="model.compile_mode", value="reduce-overhead", side="host", fact=idle,
                                why="Record the step as CUDA graphs and replay it with one launch",
                                also={"model.compile": "true"}, passed_on=GRAPHS_PASSED_ON))
    found.append(Suggestion(key="train.batch_size", value=None, side="host", fact=idle, tunable=False,
                            why=f"Give each launch more work: raise train.batch_size (now {settings.batch_size}) while "
                            "memory allows, scaling optim.lr with it"))
    if hardware.tensor_cores and not settings.channels_last:
        found.append(Suggestion(key="model.channels_last", value="true", side="host",
                                why="Drop the layout conversions around each convolution",
                                fact=f"{idle}; {hardware.gpu_fact}: its tensor cores read NHWC"))
    if settings.precision == "fp16" and hardware.native_bf16:
        found.append(Suggestion(key="precision", value="bf16", side="host", fact=f"{idle}; {hardware.bf16_fact}",
                                why="fp16's loss scaler reads a flag from the GPU at every step, a sync; bf16 needs no "
                                "scaler"))
    if settings.log_every < FEW_STEPS_PER_SYNC:
        found.append(Suggestion(key="train.log_every", value=str(FEW_STEPS_PER_SYNC), side="host", fact=idle,
                                tunable=False, why=f"Sync the device less often (now every {settings.log_every} steps, "
                                "at each logging window's end)"))
    return found


def compute_switches(hardware: Hardware, settings: Settings, busy: str) -> list[Suggestion]:
    """The switches that make the step itself cheaper on this hardware and are not on yet; `busy` is the
    measurement that makes them worth it."""
    found = []
    faster = faster_precision(hardware)
    emulated = settings.precision == "bf16" and not hardware.native_bf16
    if settings.precision != faster and (settings.precision == "fp32" or emulated):
        fact = hardware.bf16_fact if faster == "bf16" else f"{hardware.gpu_fact}: fp16 tensor cores, no bf16 ones"
        if emulated:
            fact = f"{hardware.bf16_fact}; precision=bf16 is slower here than {faster}"
        found.append(Suggestion(key="precision", value=faster, side="compute", why=f"Compute in {faster}",
                                fact=f"{busy}; {fact}"))
    if hardware.tensor_cores:
        tensor_cores = f"{busy}; {hardware.gpu_fact}"
        if not settings.channels_last:
            found.append(Suggestion(key="model.channels_last", value="true", side="compute",
                                    why="Tensor-core convolutions want NHWC",
                                    fact=f"{tensor_cores}: tensor cores read NHWC"))
        if not settings.compile:
            found.append(Suggestion(key="model.compile", value="true", side="compute", why="Fuse element-wise kernels",
                                    fact=tensor_cores))
        if settings.cudnn == "default":
            found.append(Suggestion(key="cudnn", value="benchmark", side="compute",
                                    why="Let cuDNN time its convolution algorithms once per shape",
                                    fact=f"{tensor_cores}; every training batch has one shape ({settings.crop_size} "
                                    "pixels, full batches), so the timing is paid once"))
    return found


def faster_precision(hardware: Hardware) -> str:
    """The precision that computes fastest here: bf16 where native, fp16 on pre-Ampere tensor cores, else fp32."""
    if hardware.native_bf16:
        return "bf16"
    return "fp16" if hardware.tensor_cores else "fp32"


def compute_side(total: Window, system: dict[str, float], hardware: Hardware, settings: Settings) -> list[Suggestion]:
    """The device is busy: make each step cheaper."""
    busy = f"the {hardware.processor} computed {100 * total.compute_s / max(total.wall_s, 1e-9):.0f}% of the time"
    return [*compute_switches(hardware, settings, busy),
            Suggestion(key="train.batch_size", value=None, side="compute", fact=busy, tunable=False,
                       why="Compute sets the pace: raise train.batch_size while memory allows, pick a lighter "
                       "model.name, or add devices with torchrun")]


def withheld(hardware: Hardware, settings: Settings) -> list[Suggestion]:
    """Switches that pay off on other machines and would cost this one, with the fact why. (diagnose() adds those
    whose tests have not passed on this kind of device.)"""
    found = []
    if not (hardware.native_bf16 or settings.precision == "bf16"):
        found.append(Suggestion(key="precision", value="bf16", side="compute", fact=hardware.bf16_fact, tunable=False,
                                why=f"Not advised here: bf16 autocast is emulated, slower than "
                                f"{faster_precision(hardware)}"))
    return found


RULES = {"data": data_side, "host": host_side, "compute": compute_side}
