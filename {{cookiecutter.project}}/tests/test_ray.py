"""Ray Train for real: `python -m <package>.ray_train` on a Ray cluster it starts on this machine, two CPU workers
running the training command unchanged. It trains, and a job stopped mid-run carries its run on when started
again under its name."""
import os
import re
import subprocess
import sys

import pytest

from helpers.paths import PACKAGE
from helpers.processes import CPU_ONLY, stop, wait_for
from helpers.runs import summary, tiny

pytestmark = pytest.mark.full

IMAGES, EPOCHS = 240, 4  # 30 steps of 4 images an epoch for each of two workers: the stop lands before the last


def test_a_ray_job_trains_on_two_workers_and_once_stopped_resumes_under_its_name(tmp_path, cache_dir, tiny_root):
    pytest.importorskip("ray.train.torch", reason="pip install -e '.[ray]'")
    command = [sys.executable, "-m", f"{PACKAGE}.ray_train", "--workers", "2", "--storage", str(tmp_path / "runs"),
               "--name", "exp1", "--", *tiny(("data.train_per_class=80", f"train.epochs={EPOCHS}"), cache_dir,
                                             tiny_root)]
    run_dir = tmp_path / "runs/exp1"
    job = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, **CPU_ONLY}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(lambda: (run_dir / "last.pt").exists(), job, timeout=600)  # the first epoch saved
    stop(job)  # the job cancelled: its driver, and the Ray cluster it started, killed
    assert not (run_dir / "summary.json").exists(), "the run had ended before the stop"

    resumed = subprocess.run(command, cwd=tmp_path, env={**os.environ, **CPU_ONLY}, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    found = re.search(r"resumed from .*last\.pt at epoch (\d+)", (run_dir / "train.log").read_text())
    assert found and 1 <= int(found[1]) < EPOCHS, "resumed from a checkpoint of the stopped run"
    result = summary(run_dir)
    assert result.processes == 2 and len(result.coverage) == EPOCHS
    assert all(entry["checked"] and entry["trained"] + entry["trained_before_resume"] + entry["left_out"] == IMAGES
               for entry in result.coverage), result.coverage
