"""The report's figures all come from the process the others waited for, and its text shows what was held back."""
import math
from dataclasses import replace

import torch

from {{ cookiecutter.package }}.diagnosis.report import format_report, run_totals
from {{ cookiecutter.package }}.diagnosis.sysmon import SystemMonitor
from {{ cookiecutter.package }}.loop.clock import Window

from helpers.runs import a_summary

CPU = torch.device("cpu")


def window(steps: int, wall_s: float, data_s: float, host_s: float = 0.0) -> Window:
    """A logging window of `steps` steps of 8 images each."""
    return Window(steps=steps, images=8 * steps, wall_s=wall_s, data_s=data_s, host_s=host_s)


class Ranks:
    """Stands in for a World of several processes: gather() returns the rows the processes would send."""

    def __init__(self, rows: list[list[float]]):
        self.rows = rows

    def gather(self, values: list[float]) -> list[list[float]]:
        assert len(values) == len(self.rows[0])
        return self.rows


def test_every_timing_figure_comes_from_the_process_the_others_waited_for():
    from {{ cookiecutter.package }}.core.distributed import World

    windows = [(window(5, 9.0, 9.0), {"sys/cpu_util": 1.0}),  # start-up: left out
               (window(10, 2.0, 0.5, 0.1), {"sys/cpu_util": 50.0}),
               (window(10, 2.0, 0.3, 0.1), {"sys/cpu_util": 70.0})]
    total, system, rank, splits = run_totals(windows, World(0, 0, 1, CPU))
    assert (total.steps, total.images, total.wall_s, total.data_s, total.host_s, rank) == (20, 160, 4.0, 0.8, 0.2, 0)
    assert system == {"sys/cpu_util": 60.0} and splits == [total]
    others = [math.nan] * (len(SystemMonitor.FIGURES) - 1)  # after sys/cpu_util, the first
    rows = [[20, 160, 4.0, 0.8, 0.2, 0, 0, 60.0, *others], [20, 160, 4.1, 1.5, 0.4, 0, 0, 90.0, *others],
            [20, 160, 4.0, 1.6, 0.1, 0, 0, 10.0, *others]]
    total, system, rank, splits = run_totals(windows, Ranks(rows))
    assert rank == 1 and (total.wall_s, total.data_s, total.host_s) == (4.1, 1.5, 0.4) and system == {
        "sys/cpu_util": 90.0}
    assert [split.data_s for split in splits] == [0.8, 1.5, 1.6]


def test_a_figure_the_system_monitor_stopped_giving_midway_is_left_out_not_a_crash():
    from {{ cookiecutter.package }}.core.distributed import World

    windows = [(window(5, 9.0, 9.0), {"sys/cpu_util": 1.0, "sys/gpu_util": 80.0}),
               (window(10, 2.0, 0.5, 0.1), {"sys/cpu_util": 50.0, "sys/gpu_util": 90.0}),
               (window(10, 2.0, 0.3, 0.1), {"sys/cpu_util": 70.0})]  # NVML failed: gpu_util is gone from here on
    _, system, _, _ = run_totals(windows, World(0, 0, 1, CPU))
    assert system == {"sys/cpu_util": 60.0}


class AllReduce:
    """Stands in for a World of several processes: each process's `gather` adds its row into a table of all of them,
    as the all-reduce does, and fails as NCCL or gloo would on rows of different lengths (they hang or error)."""

    def __init__(self, processes: int):
        self.size, self.sent = processes, []

    def at(self, rank: int) -> "AllReduce":
        self.rank = rank
        return self

    def gather(self, values: list[float]) -> list[list[float]]:
        self.sent.append(values)
        assert len({len(row) for row in self.sent}) == 1, "the processes' rows differ in length"
        return [row if index == self.rank else [0.0] * len(row) for index, row in enumerate(self.sent)]


def test_a_process_whose_nvml_failed_midway_gathers_rows_the_others_can_add_to():
    """faults.nvml_fails_after on one process: its sys/gpu_util stops after the first window, the other's does not."""
    healthy = [(window(5, 2.0, 0.5), {"sys/cpu_util": 40.0, "sys/gpu_util": 90.0})] * 3
    lost = healthy[:1] + [(window(5, 2.0, 0.9), {"sys/cpu_util": 40.0})] * 2
    job = AllReduce(2)
    run_totals(healthy, job.at(0))
    _, system, rank, _ = run_totals(lost, job.at(1))
    assert rank == 1 and system == {"sys/cpu_util": 40.0}  # the figure it lost is left out, not guessed


def test_the_report_lists_the_suggestions_then_what_this_machine_should_not_flip():
    figures = {"images_per_s": 50.0, "steps": 30, "data_ms": 10.0, "data_frac": 0.02, "host_ms": 0.0, "host_frac": 0.0,
               "compute_ms": 500.0, "bound": "compute", "system": {"sys/cpu_util": 90.0}, "val_top1": 50.0,
               "hardware": {"device": "cpu"}, "classes": 10,
               "val_top5": 90.0, "skipped_files": 0, "verdict": "Data loading is not the bottleneck.",
               "advice": ["Compute sets the pace: raise train.batch_size (the CPU computed 98% of the time)."],
               "withheld": [{"key": "precision", "value": "bf16", "why": "Not advised here: bf16 autocast is emulated",
                             "fact": "AMD EPYC has no native bf16"}]}
    summary = a_summary(**figures)
    text = format_report(summary)
    assert text.index("next:") < text.index("Compute sets the pace") < text.index("not for this machine:")
    assert "  - precision=bf16: Not advised here: bf16 autocast is emulated (AMD EPYC has no native bf16)." in text


def test_a_report_of_several_processes_gives_each_shares_range_and_every_epochs_start():
    figures = {"images_per_s": 50.0, "steps": 30, "data_ms": 10.0, "data_frac": 0.41, "host_ms": 0.0, "host_frac": 0.0,
               "compute_ms": 5.0, "bound": "data", "system": {}, "val_top1": 50.0, "val_top5": 90.0, "hardware": {"device": "cpu"},
               "classes": 10,
               "skipped_files": 0, "verdict": "Rank 1 on host b holds the others back.", "advice": [],
               "processes": 2, "timing_rank": 1, "epoch_start_ms": [900.0, 35.0],
               "ranks": [{"rank": 0, "host": "a", "data_frac": 0.03, "host_frac": 0.0},
                         {"rank": 1, "host": "b", "data_frac": 0.41, "host_frac": 0.01}],
               "setup": {"total_s": 21.9, "data_s": 16.6, "workers_s": 3.1, "first_batch_s": 0.9}}
    summary = a_summary(**figures)
    text = format_report(summary)
    assert "ranks        data wait 3-41% (highest: rank 1 on b), host 0-1% (highest: rank 1 on b)" in text
    assert "epoch start  900 / 35 ms to each epoch's first batch" in text
    assert ("setup        21.9 s before the first step: 16.6 s opening the data (listing it, or reading its kept "
            "index), 3.1 s picking the loader's workers; its first batch 0.9 s after") in text


def report_line(text: str, name: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith(f"{name} ")]
    return line


def test_the_report_names_the_device_it_ran_on_and_gives_each_system_figure_its_unit():
    figures = {"images_per_s": 900.0, "steps": 100, "data_ms": 0.5, "data_frac": 0.01, "host_ms": 2.0,
               "host_frac": 0.03, "compute_ms": 60.0, "bound": "compute", "val_top1": 50.0, "val_top5": 90.0,
               "skipped_files": 0, "verdict": "", "advice": [], "hardware": {"device": "cuda"}, "classes": 10,
               "system": {"sys/cpu_util": 41.26, "sys/iowait": 0.04, "sys/disk_read_mb_s": 12.34,
                          "sys/loader_cpu": 30.6, "sys/gpu_util": 97.0, "loader/read_ms": 0.213,
                          "loader/decode_ms": 1.305, "loader/read_share": 14.0, "loader/upload_ms": 3.21,
                          "loader/upload_share": 55.0}}
    summary = a_summary(**figures)
    on_a_gpu = format_report(summary)
    assert report_line(on_a_gpu, "host") == "host         2.0 ms/step (3%: the GPU idle with the batch ready)"
    assert report_line(on_a_gpu, "system") == (
        "system       CPU 41% busy, iowait 0.0%, disk reads 12.3 MB/s, loader workers 31% of all cores, GPU 97% busy, "
        "reading 0.21 ms/image, decoding 1.30 ms/image, 14% of a worker's time reading, uploading 3.2 ms/batch, "
        "55% of each batch's wait uploading")
    on_a_cpu = format_report(replace(summary, hardware={"device": "cpu"}, system={"sys/cpu_util": 99.4}))
    assert report_line(on_a_cpu, "host") == ("host         none on the CPU: the step runs on the host, so its Python "
                                             "time counts as compute")
    assert report_line(on_a_cpu, "system") == "system       CPU 99% busy"


def test_the_report_gives_validation_top1_beside_chance_top5_only_past_5_classes_and_training_top1():
    figures = {"images_per_s": 50.0, "steps": 30, "data_ms": 10.0, "data_frac": 0.02, "host_ms": 0.0, "host_frac": 0.0,
               "compute_ms": 500.0, "bound": "compute", "system": {}, "skipped_files": 0, "verdict": "", "advice": [],
               "hardware": {"device": "cpu"}, "val_top1": 71.25, "val_top5": 93.5, "classes": 8, "train_top1": 64.0}
    summary = a_summary(**figures)
    text = format_report(summary)
    assert report_line(text, "validation") == "validation   top-1 71.2% (chance 12.5%)  top-5 93.5%"
    assert report_line(text, "training") == "training     top-1 64.0% on the last epoch's training batches (augmented)"
    five = format_report(replace(summary, classes=5, val_top5=None, train_top1=None))
    assert report_line(five, "validation") == "validation   top-1 71.2% (chance 20.0%)"
    assert "training " not in five  # a resumed run with no step left trained no batch
