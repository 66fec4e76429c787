"""The end-of-run answer to "is data loading the bottleneck?", and which switch to flip next."""
import os
import platform
from dataclasses import astuple, dataclass, field
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import torch

from . import options
from .clock import Window
from .data import TrainCrop
from .distributed import World

NOTICEABLE = 0.10  # a share of the time below this, waiting for data or for the host, is noise
BOUND = 0.30  # from this share on, that wait sets the pace
CPU_SATURATED = 85.0  # percent of all cores
IOWAIT_HIGH = 10.0  # percent of CPU time stalled on disk
FEW_STEPS_PER_SYNC = 50  # train.log_every below this syncs often enough to show in a host-bound run


@dataclass
class Settings:
    """The options the advice refers to, so that it names only switches not flipped already."""
    num_workers: int
    prefetch_factor: int
    pin_memory: bool
    persistent_workers: bool
    batch_size: int = 64
    log_every: int = 20
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    cudnn: str = "default"
    crop_size: int = 224
    choices: dict[str, str] = field(default_factory=dict)  # group -> option picked


@dataclass
class Diagnosis:
    bound: str  # data | host | compute: what to fix first
    verdict: str
    advice: list[str]


def bound(total: Window) -> str:
    """`data` or `host` when that idle share is noticeable and the larger of the two; `compute` otherwise.

    Idle time is what a faster configuration can win back; compute time is the floor until the step
    itself gets cheaper.
    """
    share, name = max((total.data_frac, "data"), (total.host_frac, "host"))
    return name if share >= NOTICEABLE else "compute"


def diagnose(total: Window, system: dict[str, float], device: torch.device, settings: Settings,
             cores: int | None = None) -> Diagnosis:
    """The bound, a one-sentence verdict and the switches that fit, from the measured split, system load and options.

    The advice for the bound comes first, then that for the other idle share if it is noticeable too.
    """
    cores = cores or os.cpu_count() or 1
    first, shares = bound(total), {"data": total.data_frac, "host": total.host_frac}
    data, host = f"{100 * total.data_frac:.0f}%", f"{100 * total.host_frac:.0f}%"
    strength = "the bottleneck" if shares.get(first, 0.0) >= BOUND else "a partial bottleneck"
    if first == "data":
        verdict = f"Data loading is {strength}: the {device.type} waited for data {data} of the time."
    elif first == "host":
        verdict = (f"The host is {strength}: the GPU sat idle {host} of the time with the next batch ready, "
                   f"waiting for Python, kernel launches or syncs (data wait {data}).")
    else:
        verdict = f"Data loading is not the bottleneck: the {device.type} waited for data {data} of the time."
        if device.type == "cuda":
            verdict += f" The GPU computed {100 * total.compute_s / max(total.wall_s, 1e-9):.0f}% of the time."
    advice = ADVICE[first](system, device, settings, cores)
    for other, share in shares.items():
        if other != first and share >= NOTICEABLE:
            advice += ADVICE[other](system, device, settings, cores)
    return Diagnosis(first, verdict, advice)


def _data_advice(system: dict[str, float], device: torch.device, settings: Settings, cores: int) -> list[str]:
    cpu, iowait = system.get("sys/cpu_util", 0.0), system.get("sys/iowait", 0.0)
    choices, advice = settings.choices, []
    if iowait >= IOWAIT_HIGH:
        advice.append(f"The CPU is stalled on disk reads (iowait {iowait:.0f}%): raise loader.prefetch_factor=4 "
                      "so reads overlap compute.")
        if choices.get("staging", "none") == "none":
            advice.append("Copy the data into RAM once with staging=tmpfs, if it fits.")
        if choices.get("format", "folder") == "folder":
            advice.append("Turn millions of small reads into a few long ones: pack once with "
                          "`python -m {{ cookiecutter.package }}.pack` and train with format=lmdb or format=hdf5.")
    elif cpu >= CPU_SATURATED:
        advice.append(f"The CPU is saturated ({cpu:.0f}% of {cores} cores): decoding and cropping are the limit, "
                      "so more workers will not help.")
        advice.extend(_lighter_decoding(choices, device, settings.crop_size))
    else:
        if settings.num_workers < cores:
            advice.append(f"The CPU has headroom ({cpu:.0f}% of {cores} cores): raise "
                          f"loader.num_workers={cores} (now {settings.num_workers}).")
        if settings.prefetch_factor < 4:
            advice.append(f"Smooth out slow batches with loader.prefetch_factor=4 (now {settings.prefetch_factor}).")
    if not settings.persistent_workers and settings.num_workers > 0:
        advice.append("Workers restart every epoch: set loader.persistent_workers=true to keep them.")
    if device.type == "cuda" and not settings.pin_memory:
        advice.append("Host-to-GPU copies are from pageable memory: set loader.pin_memory=true.")
    if device.type == "cuda" and choices.get("prefetcher", "none") == "none":
        advice.append("Overlap each batch's copy with the previous step: prefetcher=cuda_stream.")
    return advice


def _host_advice(system: dict[str, float], device: torch.device, settings: Settings, cores: int) -> list[str]:
    """The GPU waits on the host between launches: fewer, bigger kernels and fewer syncs."""
    advice = []
    if not settings.compile:
        advice.append("Fuse the step's many small kernels into few, so the host launches less: model.compile=true.")
    advice.append(f"Give each launch more work: raise train.batch_size (now {settings.batch_size}) while memory "
                  "allows, scaling optim.lr with it.")
    if not settings.channels_last:
        advice.append("Drop the layout conversions around each convolution: model.channels_last=true.")
    if settings.precision == "fp16":
        advice.append("fp16's loss scaler reads a flag from the GPU at every step, a sync: precision=bf16 needs none.")
    if settings.log_every < FEW_STEPS_PER_SYNC:
        advice.append(f"Each logging window ends with a device sync: raise train.log_every (now {settings.log_every}).")
    return advice


def _compute_advice(system: dict[str, float], device: torch.device, settings: Settings, cores: int) -> list[str]:
    """The device is busy: make each step cheaper."""
    advice = []
    if settings.precision == "fp32":
        advice.append("Compute in bfloat16 (tensor cores on GPUs, AVX-512 bf16 on recent CPUs): precision=bf16.")
    if device.type == "cuda":
        if not settings.channels_last:
            advice.append("Tensor-core convolutions want NHWC: model.channels_last=true.")
        if not settings.compile:
            advice.append("Fuse element-wise kernels: model.compile=true.")
        if settings.cudnn == "default":
            advice.append("Let cuDNN time its convolution algorithms once per shape: cudnn=benchmark.")
    advice.append("Compute sets the pace: raise train.batch_size while memory allows, pick a lighter model.name, "
                  "or add devices with torchrun.")
    return advice


ADVICE = {"data": _data_advice, "host": _host_advice, "compute": _compute_advice}


def _lighter_decoding(choices: dict[str, str], device: torch.device, crop_size: int) -> list[str]:
    """Ways to spend less CPU per image, given what the run already uses."""
    if choices.get("format") == "tensor":
        return ["Nothing is decoded any more (format=tensor): only more cores per device, or smaller crops "
                "(data.crop_size), will help."]
    advice = []
    if choices.get("decoder", "turbojpeg") in ("pil", "torchcodec"):  # slower per image than libjpeg-turbo
        advice.append("Decode with libjpeg-turbo's DCT scaling: decoder=turbojpeg (or decoder=opencv).")
    on_the_gpu = options.gpu_options("decoder")
    if device.type == "cuda" and choices.get("decoder") not in on_the_gpu:
        advice.append(f"Move decoding to the GPU: {' or '.join(f'decoder={name}' for name in on_the_gpu)}.")
    side = TrainCrop(crop_size).full_detail_side()
    advice.append(f"Decode once, offline: pack with `python -m {{ cookiecutter.package }}.pack format=tensor "
                  f"pack.short_side={side}` and train with format=tensor decoder=none (at that side the smallest random "
                  f"crop still has its {crop_size} pixels; a smaller one saves disk at some detail).")
    return advice


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def environment(device: torch.device) -> dict[str, str]:
    """Library versions and hardware, so a figure can be traced to where it was measured."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    libraries = ("torch", "torchvision", "hydra-core", "omegaconf", "numpy", "pillow", "opencv-python-headless",
                 "simplejpeg", "h5py", "lmdb", "nvidia-dali-cuda130")
    return {"python": platform.python_version(), **{lib: _version(lib) for lib in libraries},
            "device": f"{device.type}: {name}", "cpu_cores": str(os.cpu_count())}


def run_totals(windows: list[tuple[Window, dict[str, float]]], world: World) -> tuple[Window, dict[str, float], int]:
    """The run's split and system figures, all from one process, and its rank.

    That process is the one whose device sat idle longest (data stall plus host overhead): under DDP the
    others wait for it at every gradient all-reduce. The first window (worker start-up, allocator warm-up)
    is left out when there are more.
    """
    measured = windows[1:] or windows
    total = sum((window for window, _ in measured), Window())
    tags = sorted(measured[0][1]) if measured else []
    system = [float(np.mean([values[tag] for _, values in measured])) for tag in tags]
    rows = world.gather([*astuple(total), *system])
    rank = max(range(len(rows)), key=lambda index: rows[index][3] + rows[index][4])  # data_s + host_s
    steps, images, *seconds = rows[rank][:5]
    return Window(int(steps), int(images), *seconds), dict(zip(tags, rows[rank][5:])), rank


def format_report(summary: dict) -> str:
    system = "  ".join(f"{tag.removeprefix('sys/')} {value:.1f}" for tag, value in summary["system"].items())
    processes = summary.get("processes", 1)
    lines = [
        "",
        "==== where the time went ====",
        f"throughput   {summary['images_per_s']:.1f} images/s over {summary['steps']} steps"
        + (f" (per process, {processes} processes; timings of process {summary['timing_rank']}, the one "
           "the others waited for)" if processes > 1 else ""),
        f"data wait    {summary['data_ms']:.1f} ms/step ({100 * summary['data_frac']:.0f}% of step time)",
        f"host         {summary['host_ms']:.1f} ms/step ({100 * summary['host_frac']:.0f}%: GPU idle with the "
        "batch ready; on the CPU, counted as compute)",
        f"compute      {summary['compute_ms']:.1f} ms/step",
        f"bound        {summary['bound']}",
        f"system       {system}",
        f"validation   top-1 {summary['val_top1']:.1f}%  top-5 {summary['val_top5']:.1f}%",
        f"skipped      {summary['skipped_files']} unreadable files",
        f"verdict      {summary['verdict']}",
        "next:",
        *(f"  - {line}" for line in summary["advice"]),
    ]
    return "\n".join(lines)
