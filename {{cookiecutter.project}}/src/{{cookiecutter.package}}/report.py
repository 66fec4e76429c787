"""The end-of-run report: the run's figures from the process the others waited for, rendered as text with the
verdict and the suggestions of diagnosis.py."""
import os
import platform
from dataclasses import astuple
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import torch

from .clock import Window
from .distributed import World
from .hardware import cpu_description


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def environment(device: torch.device) -> dict[str, str]:
    """Library versions and hardware, so a figure can be traced to where it was measured."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_description()[0]
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
        *(["not for this machine:"] if summary.get("withheld") else []),
        *(f"  - {held['key']}={held['value']}: {held['why']} ({held['fact']})." for held in summary.get("withheld", [])),
    ]
    return "\n".join(lines)
