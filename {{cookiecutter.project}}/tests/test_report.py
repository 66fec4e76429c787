"""The verdict follows the measured split and system load, and names switches that exist."""
import torch

from {{ cookiecutter.package }}.clock import Window
from {{ cookiecutter.package }}.report import Loader, diagnose

CPU, GPU = torch.device("cpu"), torch.device("cuda")
DEFAULT_LOADER = Loader(num_workers=2, prefetch_factor=2, pin_memory=True, persistent_workers=False)


def window(data_frac: float) -> Window:
    return Window(steps=10, images=640, wall_s=1.0, data_s=data_frac)


def test_compute_bound():
    verdict, advice = diagnose(window(0.02), {"sys/cpu_util": 50.0}, CPU, DEFAULT_LOADER, cores=8)
    assert verdict.startswith("Data loading is not the bottleneck") and "2%" in verdict
    assert any("train.batch_size" in line for line in advice)


def test_idle_gpu_despite_ready_data_says_so():
    _, advice = diagnose(window(0.02), {"sys/cpu_util": 20.0, "sys/gpu_util": 35.0}, GPU, DEFAULT_LOADER, cores=8)
    assert "35%" in advice[0]


def test_data_bound_with_idle_cores_asks_for_workers():
    verdict, advice = diagnose(window(0.6), {"sys/cpu_util": 30.0, "sys/iowait": 0.0}, GPU, DEFAULT_LOADER, cores=16)
    assert verdict.startswith("Data loading is the bottleneck") and "60%" in verdict
    assert any("loader.num_workers=16" in line for line in advice)
    assert any("loader.persistent_workers=true" in line for line in advice)


def test_data_bound_on_saturated_cpu_does_not_ask_for_workers():
    _, advice = diagnose(window(0.6), {"sys/cpu_util": 97.0, "sys/iowait": 0.0}, GPU, DEFAULT_LOADER, cores=16)
    assert any("saturated" in line for line in advice)
    assert not any("loader.num_workers" in line for line in advice)


def test_disk_bound_points_at_storage():
    _, advice = diagnose(window(0.5), {"sys/cpu_util": 30.0, "sys/iowait": 40.0}, GPU, DEFAULT_LOADER, cores=16)
    assert "iowait 40%" in advice[0]


def test_partial_bottleneck_and_pageable_copies():
    loader = Loader(num_workers=2, prefetch_factor=2, pin_memory=False, persistent_workers=True)
    verdict, advice = diagnose(window(0.2), {"sys/cpu_util": 30.0}, GPU, loader, cores=4)
    assert "a partial bottleneck" in verdict
    assert any("loader.pin_memory=true" in line for line in advice)
    assert not any("persistent_workers" in line for line in advice)


def test_saturated_cpu_points_at_lighter_decoding_that_the_run_does_not_use_yet():
    busy = {"sys/cpu_util": 97.0, "sys/iowait": 0.0}
    _, advice = diagnose(window(0.6), busy, GPU, DEFAULT_LOADER, {"decoder": "pil", "format": "folder"}, cores=16)
    assert any("decoder=turbojpeg" in line for line in advice)
    assert any("decoder=nvjpeg" in line for line in advice)
    assert any("format=tensor" in line for line in advice)
    _, advice = diagnose(window(0.6), busy, CPU, DEFAULT_LOADER, {"decoder": "turbojpeg", "format": "tensor"}, cores=2)
    assert not any("decoder=" in line for line in advice) and any("Nothing is decoded" in line for line in advice)


def test_disk_bound_points_at_staging_and_packing_unless_already_used():
    disk = {"sys/cpu_util": 30.0, "sys/iowait": 40.0}
    _, advice = diagnose(window(0.5), disk, GPU, DEFAULT_LOADER, {"staging": "none", "format": "folder"}, cores=16)
    assert any("staging=tmpfs" in line for line in advice) and any("format=lmdb" in line for line in advice)
    _, advice = diagnose(window(0.5), disk, GPU, DEFAULT_LOADER, {"staging": "tmpfs", "format": "lmdb"}, cores=16)
    assert not any("staging=tmpfs" in line or "format=lmdb" in line for line in advice)


def test_every_switch_the_advice_names_exists():
    """Every group=option and key=value in any advice line is a real option file or config key."""
    import re

    from conftest import CONF
    from omegaconf import OmegaConf

    keys = OmegaConf.merge(OmegaConf.load(CONF / "train.yaml"), OmegaConf.load(CONF / "pack.yaml"))
    cases = [(window(0.02), {"sys/gpu_util": 10.0}), (window(0.6), {"sys/cpu_util": 30.0}),
             (window(0.6), {"sys/cpu_util": 97.0}), (window(0.6), {"sys/iowait": 50.0})]
    lines = [line for frac, system in cases for device in (CPU, GPU)
             for line in diagnose(frac, system, device, Loader(1, 2, False, False), {}, cores=8)[1]]
    named = set(re.findall(r"\b([a-z_]+(?:\.[a-z_]+)?)=", " ".join(lines)))
    assert {"decoder", "format", "staging", "prefetcher", "loader.num_workers"} <= named
    for name in named:
        group, _, key = name.partition(".")
        if (CONF / group).is_dir() and not key:
            options = {path.stem for path in (CONF / group).glob("*.yaml")}
            chosen = re.findall(rf"\b{group}=([a-z_0-9]+)", " ".join(lines))
            assert set(chosen) <= options, (group, set(chosen) - options)
        else:
            assert OmegaConf.select(keys, name, default="absent") != "absent" or (CONF / group).is_dir(), name
