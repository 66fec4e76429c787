"""The end-of-run report: the run's figures from the process the others waited for, rendered as text with the
verdict and the suggestions of diagnosis.py."""
import dataclasses
import math
import os
import platform
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import torch
from omegaconf import DictConfig

from ..core.distributed import World
from ..core.hardware import cpu_description
from ..loop.clock import Window
from ..loop.compile import graphs_refused, uses_graphs
from ..loop.run import Run
from .ranks import RankTimes
from .summary import Summary
from .sysmon import SystemMonitor
from .verdict import Settings, diagnose


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def environment(device: torch.device) -> dict[str, str]:
    """Library versions and hardware, so a figure can be traced to where it was measured."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_description()[0]
    libraries = ("torch", "torchvision", "hydra-core", "omegaconf", "numpy", "pillow", "opencv-python-headless",
                 "turbojpeg", "h5py", "lmdb", "nvidia-dali-cuda130")
    return {"python": platform.python_version(), **{lib: _version(lib) for lib in libraries},
            "device": f"{device.type}: {name}", "cpu_cores": str(os.cpu_count())}


def run_totals(windows: list[tuple[Window, dict[str, float]]],
               world: World) -> tuple[Window, dict[str, float], int, list[Window]]:
    """The run's split and system figures, all from one process, its rank, and every rank's split.

    That process is the one whose device sat idle longest (data stall plus host overhead): under DDP the
    others wait for it at every gradient all-reduce. The first window (worker start-up, allocator warm-up)
    is left out when there are more. A system figure missing from any window (NVML that stopped answering) is
    left out; every process gathers every figure the monitor knows, NaN where it has none, so that the rows
    match across processes whatever each one lost.
    """
    measured = windows[1:] or windows
    total = sum((window for window, _ in measured), Window())
    system = [float(np.mean([values[tag] for _, values in measured]))
              if measured and all(tag in values for _, values in measured) else math.nan
              for tag in SystemMonitor.FIGURES]
    fields = [field.name for field in dataclasses.fields(Window)]
    rows = world.gather([*dataclasses.astuple(total), *system])
    splits = [Window.from_row(row[:len(fields)]) for row in rows]
    rank = max(range(len(splits)), key=lambda index: splits[index].data_s + splits[index].host_s)
    figures = {tag: value for tag, value in zip(SystemMonitor.FIGURES, rows[rank][len(fields):])
               if not math.isnan(value)}
    return splits[rank], figures, rank, splits


def spread(ranks: list[dict], share: str) -> str:
    """The range of a share across the ranks, with the rank at its top."""
    top = max(ranks, key=lambda times: times[share])
    return (f"{100 * min(times[share] for times in ranks):.0f}-{100 * top[share]:.0f}% (highest: rank {top['rank']} on "
            f"{top['host']})")


def setup_line(setup: dict[str, float]) -> str:
    first = f"; its first batch {setup['first_batch_s']:.1f} s after" if "first_batch_s" in setup else ""
    return (f"setup        {setup['total_s']:.1f} s before the first step: {setup['data_s']:.1f} s opening the data "
            f"(listing it, or reading its kept index), {setup['workers_s']:.1f} s picking the loader's workers"
            f"{first}")


def host_line(summary: Summary) -> str:
    if summary.hardware["device"] != "cuda":  # the step runs on the host itself: no device to wait for it
        return "host         none on the CPU: the step runs on the host, so its Python time counts as compute"
    return (f"host         {summary.host_ms:.1f} ms/step ({100 * summary.host_frac:.0f}%: the GPU idle with the "
            "batch ready)")


def accuracy_line(summary: Summary) -> str:
    """Validation top-1 beside what guessing scores, and top-5 where there are more than 5 classes."""
    top5 = f"  top-5 {summary.val_top5:.1f}%" if summary.val_top5 is not None else ""
    return f"validation   top-1 {summary.val_top1:.1f}% (chance {100 / summary.classes:.1f}%){top5}"


def time_to_accuracy_line(summary: Summary) -> str:
    """When validation first reached each level, and the best top-1 with its time."""
    reached = ", ".join(f"{level}% at {seconds:.0f} s" for level, seconds in summary.time_to_top1_s.items())
    best = summary.best_top1
    return (f"to top-1     {reached or 'no level of train.top1_levels reached'}; best {best['top1']:.1f}% at "
            f"{best['at_s']:.0f} s (epoch {best['epoch']}), from the run's start")


def format_report(summary: Summary) -> str:
    system = ", ".join(SystemMonitor.FIGURES[tag].format(value) for tag, value in summary.system.items())
    processes = summary.processes
    lines = [
        "",
        "==== where the time went ====",
        f"throughput   {summary.images_per_s:.1f} images/s over {summary.steps} steps"
        + (f" (per process, {processes} processes; timings of process {summary.timing_rank}, the one "
           "the others waited for)" if processes > 1 else ""),
        f"data wait    {summary.data_ms:.1f} ms/step ({100 * summary.data_frac:.0f}% of step time)",
        host_line(summary),
        f"compute      {summary.compute_ms:.1f} ms/step",
        f"bound        {summary.bound}",
        f"system       {system}",
        *([f"ranks        data wait {spread(summary.ranks, 'data_frac')}, host {spread(summary.ranks, 'host_frac')}"]
          if processes > 1 else []),
        *([f"epoch start  {' / '.join(f'{ms:.0f}' for ms in summary.epoch_start_ms)} ms to each epoch's first batch"]
          if summary.epoch_start_ms else []),
        *([setup_line(summary.setup)] if summary.setup else []),
        accuracy_line(summary),
        *([time_to_accuracy_line(summary)] if summary.best_top1 else []),
        *([f"training     top-1 {summary.train_top1:.1f}% on the last epoch's training batches (augmented)"]
          if summary.train_top1 is not None else []),
        f"skipped      {summary.skipped_files} unreadable files",
        f"verdict      {summary.verdict}",
        "next:",
        *(f"  - {line}" for line in summary.advice),
        *(["not for this machine:"] if summary.withheld else []),
        *(f"  - {held['key']}={held['value']}: {held['why']} ({held['fact']})." for held in summary.withheld),
    ]
    return "\n".join(lines)


def setup_record(run: Run) -> dict[str, float]:
    """This run's seconds before its first step, by stage, and from its first epoch's start to its first batch (the
    loader workers starting and decoding it)."""
    started = [window for window, _ in run.windows[run.windows.resumed:] if window.epoch_starts]
    first_batch = {"first_batch_s": started[0].epoch_start_s / started[0].epoch_starts} if started else {}
    return {**run.setup, **first_batch}


def summarize(run: Run, cfg: DictConfig, top1: float, top5: float | None, hydra_cfg: DictConfig) -> Summary:
    """The run's figures, every timing one from the same process (see run_totals), with the verdict; `hydra_cfg`
    says which options were picked and with which overrides."""
    total, system, timing_rank, splits = run_totals(run.windows, run.world)
    ranks = [RankTimes(rank, host, split) for rank, (host, split) in enumerate(zip(run.world.hosts(), splits))]
    choices = {group: option for group, option in hydra_cfg.runtime.choices.items()
               if not group.startswith("hydra") and option is not None}  # experiment: null, no recipe
    settings = Settings(num_workers=run.loaders.num_workers, prefetch_factor=cfg.loader.prefetch_factor,
                        pin_memory=cfg.loader.pin_memory, persistent_workers=cfg.loader.persistent_workers,
                        batch_size=cfg.train.batch_size, log_every=cfg.train.log_every, precision=cfg.precision,
                        channels_last=cfg.model.channels_last, compile=cfg.model.compile, cudnn=cfg.cudnn,
                        cuda_graphs=cfg.model.compile and uses_graphs(cfg.model.compile_mode),
                        graphs_refused=graphs_refused("reduce-overhead", cfg.train.accumulate,
                                                      len(run.loaders.crop_sizes(cfg.train.epochs))),
                        crop_size=run.loaders.train_crop_size, pack_fits=run.loaders.pack_fits, choices=choices)
    diagnosis = diagnose(total, system, run.hardware, settings, ranks)
    return Summary(
        images_per_s=total.images_per_s, data_ms=total.data_ms, host_ms=total.host_ms, compute_ms=total.compute_ms,
        data_frac=total.data_frac, host_frac=total.host_frac, data_cost=diagnosis.data_cost, bound=diagnosis.bound,
        verdict=diagnosis.verdict, advice=diagnosis.advice,
        suggestions=[suggestion.record() for suggestion in diagnosis.suggestions],
        withheld=[suggestion.record() for suggestion in diagnosis.withheld], hardware=run.hardware.record(),
        system=system, val_top1=top1, val_top5=top5, classes=len(run.loaders.classes),
        train_top1=run.meter.epoch_top1(run.world), **run.accuracy.record(), steps=run.progress.step,
        skipped_files=run.loaders.skipped_files(run.world), skipped_steps=int(run.precision.skipped),
        processes=run.world.size, timing_rank=timing_rank, ranks=[times.record() for times in ranks],
        epoch_start_ms=[1000 * window.epoch_start_s / window.epoch_starts for window, _ in run.windows
                        if window.epoch_starts],
        coverage=run.coverage.epochs, setup=setup_record(run), choices=choices,
        overrides=list(hydra_cfg.overrides.task), env=environment(run.device))
