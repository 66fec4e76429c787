"""The verdict follows the measured three-way split and the system load, and names switches that exist."""
import pytest
import torch

from {{ cookiecutter.package }}.clock import Window
from {{ cookiecutter.package }}.report import Settings, bound, diagnose, run_totals

CPU, GPU = torch.device("cpu"), torch.device("cuda")
DEFAULTS = Settings(num_workers=2, prefetch_factor=2, pin_memory=True, persistent_workers=False)


def window(data_frac: float, host_frac: float = 0.0) -> Window:
    return Window(steps=10, images=640, wall_s=1.0, data_s=data_frac, host_s=host_frac)


def settings(**changes) -> Settings:
    return Settings(**{**vars(DEFAULTS), **changes})


@pytest.mark.parametrize(("data", "host", "expected"), [
    (0.02, 0.0, "compute"), (0.09, 0.09, "compute"), (0.12, 0.05, "data"), (0.05, 0.15, "host"),
    (0.6, 0.2, "data"), (0.2, 0.25, "host")])
def test_bound_is_the_larger_noticeable_idle_share(data, host, expected):
    assert bound(window(data, host)) == expected


def test_compute_bound():
    diagnosis = diagnose(window(0.02), {"sys/cpu_util": 50.0}, CPU, DEFAULTS, cores=8)
    assert diagnosis.bound == "compute"
    assert diagnosis.verdict.startswith("Data loading is not the bottleneck") and "2%" in diagnosis.verdict
    assert any("train.batch_size" in line for line in diagnosis.advice)


def test_compute_bound_gpu_names_the_compute_switches_not_yet_on():
    advice = diagnose(window(0.02, 0.01), {}, GPU, DEFAULTS, cores=8).advice
    for switch in ("precision=bf16", "model.channels_last=true", "model.compile=true", "cudnn=benchmark"):
        assert any(switch in line for line in advice), switch
    tuned = settings(precision="bf16", channels_last=True, compile=True, cudnn="benchmark")
    advice = diagnose(window(0.02, 0.01), {}, GPU, tuned, cores=8).advice
    assert len(advice) == 1 and "Compute sets the pace" in advice[0]


def test_host_bound_gpu_asks_for_fewer_launches_and_syncs_not_for_loader_switches():
    diagnosis = diagnose(window(0.03, 0.55), {"sys/cpu_util": 20.0}, GPU, settings(precision="fp16"), cores=8)
    assert diagnosis.bound == "host"
    assert diagnosis.verdict.startswith("The host is the bottleneck: the GPU sat idle 55% of the time")
    for switch in ("model.compile=true", "train.batch_size", "model.channels_last=true", "precision=bf16",
                   "train.log_every"):
        assert any(switch in line for line in diagnosis.advice), switch
    assert not any("loader." in line or "decoder=" in line or "prefetcher=" in line for line in diagnosis.advice)
    compiled = diagnose(window(0.03, 0.2), {}, GPU, settings(compile=True, log_every=100), cores=8)
    assert "a partial bottleneck" in compiled.verdict
    assert not any("model.compile" in line or "train.log_every" in line for line in compiled.advice)


def test_both_idle_shares_noticeable_gives_both_kinds_of_advice_the_bound_first():
    advice = diagnose(window(0.2, 0.3), {"sys/cpu_util": 30.0}, GPU, DEFAULTS, cores=16).advice
    host_line = next(i for i, line in enumerate(advice) if "model.compile" in line)
    data_line = next(i for i, line in enumerate(advice) if "loader.num_workers=16" in line)
    assert host_line < data_line


def test_data_bound_with_idle_cores_asks_for_workers():
    diagnosis = diagnose(window(0.6), {"sys/cpu_util": 30.0, "sys/iowait": 0.0}, GPU, DEFAULTS, cores=16)
    assert diagnosis.bound == "data"
    assert diagnosis.verdict.startswith("Data loading is the bottleneck") and "60%" in diagnosis.verdict
    assert any("loader.num_workers=16" in line for line in diagnosis.advice)
    assert any("loader.persistent_workers=true" in line for line in diagnosis.advice)
    assert not any("model.compile" in line for line in diagnosis.advice)


def test_data_bound_on_saturated_cpu_does_not_ask_for_workers():
    advice = diagnose(window(0.6), {"sys/cpu_util": 97.0, "sys/iowait": 0.0}, GPU, DEFAULTS, cores=16).advice
    assert any("saturated" in line for line in advice)
    assert not any("loader.num_workers" in line for line in advice)


def test_disk_bound_points_at_storage():
    advice = diagnose(window(0.5), {"sys/cpu_util": 30.0, "sys/iowait": 40.0}, GPU, DEFAULTS, cores=16).advice
    assert "iowait 40%" in advice[0]


def test_partial_bottleneck_and_pageable_copies():
    loader = settings(pin_memory=False, persistent_workers=True)
    diagnosis = diagnose(window(0.2), {"sys/cpu_util": 30.0}, GPU, loader, cores=4)
    assert "a partial bottleneck" in diagnosis.verdict
    assert any("loader.pin_memory=true" in line for line in diagnosis.advice)
    assert not any("persistent_workers" in line for line in diagnosis.advice)


def test_saturated_cpu_points_at_lighter_decoding_that_the_run_does_not_use_yet():
    busy = {"sys/cpu_util": 97.0, "sys/iowait": 0.0}
    advice = diagnose(window(0.6), busy, GPU, settings(choices={"decoder": "pil", "format": "folder"}), cores=16).advice
    assert any("decoder=turbojpeg" in line for line in advice)
    assert any("decoder=nvjpeg" in line for line in advice)
    assert any("format=tensor" in line for line in advice)
    tensor = settings(choices={"decoder": "turbojpeg", "format": "tensor"})
    advice = diagnose(window(0.6), busy, CPU, tensor, cores=2).advice
    assert not any("decoder=" in line for line in advice) and any("Nothing is decoded" in line for line in advice)


def test_disk_bound_points_at_staging_and_packing_unless_already_used():
    disk = {"sys/cpu_util": 30.0, "sys/iowait": 40.0}
    advice = diagnose(window(0.5), disk, GPU, settings(choices={"staging": "none", "format": "folder"}), cores=16).advice
    assert any("staging=tmpfs" in line for line in advice) and any("format=lmdb" in line for line in advice)
    advice = diagnose(window(0.5), disk, GPU, settings(choices={"staging": "tmpfs", "format": "lmdb"}), cores=16).advice
    assert not any("staging=tmpfs" in line or "format=lmdb" in line for line in advice)


class Ranks:
    """Stands in for a World of several processes: gather() returns the rows the processes would send."""

    def __init__(self, rows: list[list[float]]):
        self.rows = rows

    def gather(self, values: list[float]) -> list[list[float]]:
        assert len(values) == len(self.rows[0])
        return self.rows


def test_every_timing_figure_comes_from_the_process_the_others_waited_for():
    from {{ cookiecutter.package }}.distributed import World

    windows = [(Window(5, 40, 9.0, 9.0, 0.0), {"sys/cpu_util": 1.0}),  # start-up: left out
               (Window(10, 80, 2.0, 0.5, 0.1), {"sys/cpu_util": 50.0}),
               (Window(10, 80, 2.0, 0.3, 0.1), {"sys/cpu_util": 70.0})]
    total, system, rank = run_totals(windows, World(0, 0, 1, CPU))
    assert (total.steps, total.images, total.wall_s, total.data_s, total.host_s, rank) == (20, 160, 4.0, 0.8, 0.2, 0)
    assert system == {"sys/cpu_util": 60.0}
    rows = [[20, 160, 4.0, 0.8, 0.2, 60.0], [20, 160, 4.1, 1.5, 0.4, 90.0], [20, 160, 4.0, 1.6, 0.1, 10.0]]
    total, system, rank = run_totals(windows, Ranks(rows))
    assert rank == 1 and (total.wall_s, total.data_s, total.host_s) == (4.1, 1.5, 0.4) and system == {
        "sys/cpu_util": 90.0}


def test_every_switch_the_advice_names_exists():
    """Every group=option and key=value in any advice line is a real option file or config key."""
    import re

    from conftest import CONF
    from omegaconf import OmegaConf

    keys = OmegaConf.merge(OmegaConf.load(CONF / "train.yaml"), OmegaConf.load(CONF / "pack.yaml"),
                           {"model": OmegaConf.load(CONF / "model/torchvision.yaml"),
                            "optim": OmegaConf.load(CONF / "optim/sgd.yaml")})
    cases = [window(0.02), window(0.6), window(0.02, 0.6), window(0.6)]
    systems = [{}, {"sys/cpu_util": 30.0}, {"sys/cpu_util": 97.0}, {"sys/iowait": 50.0}]
    starting = Settings(1, 2, False, False, precision="fp16")
    lines = [line for total in cases for system in systems for device in (CPU, GPU)
             for line in diagnose(total, system, device, starting, cores=8).advice]
    named = set(re.findall(r"\b([a-z_]+(?:\.[a-z_]+)?)=", " ".join(lines)))
    assert {"decoder", "format", "staging", "prefetcher", "loader.num_workers", "model.compile",
            "model.channels_last", "precision", "cudnn"} <= named
    for name in named:
        group, _, key = name.partition(".")
        if (CONF / group).is_dir() and not key:
            options = {path.stem for path in (CONF / group).glob("*.yaml")}
            chosen = re.findall(rf"\b{group}=([a-z_0-9]+)", " ".join(lines))
            assert set(chosen) <= options, (group, set(chosen) - options)
        else:
            assert OmegaConf.select(keys, name, default="absent") != "absent", name
    for key in ("train.batch_size", "train.log_every", "optim.lr"):  # named without a value
        assert key in " ".join(lines) and OmegaConf.select(keys, key, default="absent") != "absent", key
