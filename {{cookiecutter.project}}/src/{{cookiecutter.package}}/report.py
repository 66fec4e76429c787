"""The end-of-run answer to "is data loading the bottleneck?", and which switch to flip next."""
import os
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch

from .clock import Window

DATA_BOUND = 0.30  # share of step time spent waiting for data above which loading sets the pace
DATA_NOTICEABLE = 0.10  # below this, waiting for data is noise
CPU_SATURATED = 85.0  # percent of all cores
IOWAIT_HIGH = 10.0  # percent of CPU time stalled on disk
GPU_UNDERUSED = 70.0  # percent of time a kernel ran, per NVML


@dataclass
class Loader:
    """The loader settings the advice refers to."""
    num_workers: int
    prefetch_factor: int
    pin_memory: bool
    persistent_workers: bool


def diagnose(total: Window, system: dict[str, float], device: torch.device, loader: Loader,
             choices: dict[str, str] | None = None, cores: int | None = None) -> tuple[str, list[str]]:
    """A one-sentence verdict and the switches that fit it, from the measured split, system load and options."""
    cores = cores or os.cpu_count() or 1
    choices = choices or {}
    waiting = f"{100 * total.data_frac:.0f}%"
    cpu, iowait = system.get("sys/cpu_util", 0.0), system.get("sys/iowait", 0.0)
    advice = []
    if total.data_frac < DATA_NOTICEABLE:
        verdict = f"Data loading is not the bottleneck: the {device.type} waited for data {waiting} of the time."
        gpu = system.get("sys/gpu_util")
        if gpu is not None and gpu < GPU_UNDERUSED:
            advice.append(f"The GPU is busy only {gpu:.0f}% of the time although data is ready: kernels are too "
                          "small to hide launch overhead; raise train.batch_size.")
        advice.append("Compute sets the pace: raise train.batch_size while memory allows, or pick a lighter "
                      "model.name.")
        return verdict, advice

    strength = "the bottleneck" if total.data_frac >= DATA_BOUND else "a partial bottleneck"
    verdict = f"Data loading is {strength}: the {device.type} waited for data {waiting} of the time."
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
        advice.extend(_lighter_decoding(choices, device))
    else:
        if loader.num_workers < cores:
            advice.append(f"The CPU has headroom ({cpu:.0f}% of {cores} cores): raise "
                          f"loader.num_workers={cores} (now {loader.num_workers}).")
        if loader.prefetch_factor < 4:
            advice.append(f"Smooth out slow batches with loader.prefetch_factor=4 (now {loader.prefetch_factor}).")
    if not loader.persistent_workers and loader.num_workers > 0:
        advice.append("Workers restart every epoch: set loader.persistent_workers=true to keep them.")
    if device.type == "cuda" and not loader.pin_memory:
        advice.append("Host-to-GPU copies are from pageable memory: set loader.pin_memory=true.")
    if device.type == "cuda" and choices.get("prefetcher", "none") == "none":
        advice.append("Overlap each batch's copy with the previous step: prefetcher=cuda_stream.")
    return verdict, advice


def _lighter_decoding(choices: dict[str, str], device: torch.device) -> list[str]:
    """Ways to spend less CPU per image, given what the run already uses."""
    if choices.get("format") == "tensor":
        return ["Nothing is decoded any more (format=tensor): only more cores per device, or smaller crops "
                "(data.crop_size), will help."]
    advice = []
    if choices.get("decoder", "turbojpeg") in ("pil", "torchvision"):
        advice.append("Decode with libjpeg-turbo's DCT scaling: decoder=turbojpeg (or decoder=opencv).")
    if device.type == "cuda" and choices.get("decoder") not in ("nvjpeg", "dali"):
        advice.append("Move decoding to the GPU: decoder=nvjpeg or decoder=dali.")
    advice.append("Decode once, offline: pack with `python -m {{ cookiecutter.package }}.pack format=tensor "
                  "pack.short_side=256` and train with format=tensor.")
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


def format_report(summary: dict) -> str:
    system = "  ".join(f"{tag.removeprefix('sys/')} {value:.1f}" for tag, value in summary["system"].items())
    lines = [
        "",
        "==== where the time went ====",
        f"throughput   {summary['images_per_s']:.1f} images/s over {summary['steps']} steps",
        f"data wait    {summary['data_ms']:.1f} ms/step ({100 * summary['data_frac']:.0f}% of step time)",
        f"compute      {summary['compute_ms']:.1f} ms/step",
        f"system       {system}",
        f"validation   top-1 {summary['val_top1']:.1f}%  top-5 {summary['val_top5']:.1f}%",
        f"skipped      {summary['skipped_files']} unreadable files",
        f"verdict      {summary['verdict']}",
        "next:",
        *(f"  - {line}" for line in summary["advice"]),
    ]
    return "\n".join(lines)
