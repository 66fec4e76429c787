"""Launching: one run folder for all ranks, a log per rank, scripts/launch.sh, and the Slurm launcher's config."""
import os
import subprocess
import sys

import pytest
from conftest import CONF, CPU_ONLY, PROJECT, tiny
from hydra import compose, initialize_config_dir

from {{ cookiecutter.package }}.distributed import rank_suffix, run_name


def test_every_rank_resolves_the_same_run_folder(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "3f2a")
    assert run_name() == "torchrun-3f2a"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's value when no id was given
    assert run_name().count("/") == 1
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert run_name().count("-") == 4  # <date>/<time>
    monkeypatch.setenv("RANK", "3")
    assert rank_suffix() == "-rank3"
    monkeypatch.setenv("RANK", "0")
    assert rank_suffix() == ""


def test_launch_script_runs_torchrun_into_one_folder(tmp_path, cache_dir, tiny_root, packs):
    env = {**os.environ, **CPU_ONLY, "NPROC": "2",
           "PYTHONPATH": os.pathsep.join([str(PROJECT / "src"), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    result = subprocess.run(["bash", str(PROJECT / "scripts/launch.sh"), *tiny(("train.epochs=1",), cache_dir,
                                                                                 tiny_root)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs").iterdir()
    assert run_dir.name.startswith("torchrun-")
    assert {"summary.json", "last.pt", "train.log", "train-rank1.log"} <= {p.name for p in run_dir.iterdir()}
    assert len(list((run_dir / "tb").glob("events.*"))) == 1


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", ["hydra/launcher=slurm", "hydra.launcher.nodes=2"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.nodes == 2 and launcher.tasks_per_node == launcher.gpus_per_node == 8
