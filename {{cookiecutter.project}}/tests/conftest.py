"""The real config, composed once and shrunk: CPU, a tiny synthetic data set, a few steps, output under tmp_path."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

PROJECT = Path(__file__).resolve().parents[1]
CONF = PROJECT / "conf"
PACKAGE = "{{ cookiecutter.package }}"

# A run that takes seconds on two CPU cores and still goes through every stage.
TINY_DATA = ["data.num_classes=3", "data.train_per_class=8", "data.val_per_class=4",
             "data.crop_size=32", "data.val_resize=36"]
TINY_RUN = ["model.name=resnet18", "train.batch_size=4", "train.epochs=1", "train.log_every=2",
            "loader.num_workers=0"]
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}  # the same runs on any machine
TINY_OPTIONS = {"profiler=torch": ["profiler.wait=1", "profiler.warmup=1", "profiler.active=1"]}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """Where data=synthetic writes its files; shared by the session so they are made once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_root(cache_dir) -> Path:
    """A tiny ImageNet-style tree (3 classes), for data=imagenet."""
    from {{ cookiecutter.package }}.synth import write_dataset

    return write_dataset(cache_dir / "tiny-tree", num_classes=3, train_per_class=8, val_per_class=4, workers=2)


def tiny(overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path) -> list[str]:
    """The user's overrides on top of those that shrink the run and point the chosen data option at tiny data."""
    data = ([f"data.root={tiny_root}", "data.crop_size=32", "data.val_resize=36"] if "data=imagenet" in overrides
            else [f"data.cache_dir={cache_dir}", *TINY_DATA])
    options = [shrink for choice, shrinks in TINY_OPTIONS.items() if choice in overrides for shrink in shrinks]
    return [*data, *TINY_RUN, *options, *overrides]


@pytest.fixture
def compose_tiny(cache_dir, tiny_root):
    """compose(overrides) -> the shrunk training config with those overrides on top."""

    def composed(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("train", tiny(overrides, cache_dir, tiny_root))

    return composed


@pytest.fixture
def train_cli(cache_dir, tiny_root):
    """train_cli(run_dir, *overrides) runs `python -m PACKAGE.train` as a user would, on tiny data."""

    def run(run_dir: Path, *overrides: str, check: bool = True,
            launcher: tuple[str, ...] = (sys.executable,)) -> subprocess.CompletedProcess:
        command = [*launcher, "-m", f"{PACKAGE}.train", f"hydra.run.dir={run_dir}",
                   *tiny(overrides, cache_dir, tiny_root)]
        result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=600,
                                env={**os.environ, **CPU_ONLY})
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
        return result

    return run
