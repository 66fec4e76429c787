"""Slurm for real, on a Slurm started on this machine (tests/helpers/slurm.py), through both of docs/distributed.md's
launches: scripts/slurm.sh submitted with sbatch, and hydra/launcher=slurm (submitit). Each job is preempted with
`scontrol requeue`, then warned of its time limit with the signal Slurm sends ahead of it, and each time it stops at
its window, comes back under its job id and carries on from its checkpoint."""
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.paths import PACKAGE, PROJECT
from helpers.processes import CPU_ONLY, stop
from helpers.runs import logged_windows, summary, tiny
from helpers.slurm import Slurm, unavailable

pytestmark = pytest.mark.full

IMAGES = 480  # 3 classes of 160: 60 steps of 4 images an epoch for each of two processes, so that both cuts land mid-run
SIZES = ("logger=jsonl", "data.train_per_class=160", "train.epochs=2")
STOPPED = re.compile(r"stopped by (SIG\w+) at step (\d+)")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if reason := unavailable():
        pytest.skip(reason)
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.close()


def preempted_then_warned(slurm: Slurm, job: str, run_dir: Path, warn: Callable[[], None]) -> dict[str, str]:
    """Preempt `job` once its run has logged a window, then, once the requeued job has logged a window past that
    stop, `warn` it of its time limit; `scontrol show job`'s fields once it has completed. Slurm holds a requeued job
    back for two minutes, which the test does not wait out."""
    slurm.wait(lambda: logged_windows(run_dir), "the job's first window", timeout=300)
    slurm.command("scontrol", "requeue", job)  # what preemption does with PreemptMode=REQUEUE
    slurm.start_requeued_now(job)
    ((_, first_stop),) = STOPPED.findall((run_dir / "train.log").read_text())
    slurm.wait_for_state(job, "RUNNING")
    slurm.wait(lambda: max(window["step"] for window in logged_windows(run_dir)) > int(first_stop),
               "a window after the resume", timeout=300)
    warn()
    slurm.start_requeued_now(job)
    return slurm.wait_for_state(job, "COMPLETED", timeout=600)


def check_stops_and_coverage(run_dir: Path, signals: list[str]) -> None:
    """The run stopped by `signals` in turn, at rising steps before its end, and trained every image once an epoch
    across the stops."""
    log = (run_dir / "train.log").read_text()
    stops = STOPPED.findall(log)
    assert [name for name, _ in stops] == signals, log[-3000:]
    steps = [int(step) for _, step in stops]
    assert steps == sorted(set(steps)) and steps[-1] < summary(run_dir).steps, log[-3000:]
    epochs = summary(run_dir).coverage
    assert all(entry["checked"] and entry["trained"] + entry["trained_before_resume"] + entry["left_out"] == IMAGES
               for entry in epochs), epochs
    assert epochs[0]["trained_before_resume"] > 0


@pytest.fixture
def project(tmp_path):
    """A folder to submit from, as a user's checkout: this project's scripts and sources, and outputs/ of its own."""
    for name in ("scripts", "src"):
        (tmp_path / name).symlink_to(PROJECT / name)
    return tmp_path


def test_the_sbatch_script_preempted_then_warned_of_its_time_limit_resumes_under_its_job_id(slurm, project, cache_dir,
                                                                                             tiny_root):
    job = slurm.submit(project, PROJECT / "scripts/slurm.sh", *tiny(SIZES, cache_dir, tiny_root),
                       env={**CPU_ONLY, "NPROC": "2", "PYTHON": sys.executable})
    run_dir = project / f"outputs/torchrun-slurm-{job}"
    # What `#SBATCH --signal=B:USR1@180` has Slurm send to the script three minutes before the time limit.
    finished = preempted_then_warned(slurm, job, run_dir, lambda: slurm.command("scancel", "--batch", "--signal=USR1",
                                                                                 job))
    assert (finished["Restarts"], finished["ExitCode"]) == ("2", "0:0")
    check_stops_and_coverage(run_dir, ["SIGTERM", "SIGTERM"])  # the script's requeue stops it as preemption does
    job_output = (project / f"slurm-{job}.out").read_text()
    assert "slurm.sh: the time limit is near: requeued" in job_output, job_output[-3000:]
    assert [line for line in job_output.splitlines() if line.startswith("slurm.sh: job")] == [
        f"slurm.sh: job {job}, start {start}, on {finished['NodeList']}: outputs/torchrun-slurm-{job}"
        for start in (1, 2, 3)]


def test_the_slurm_launcher_preempted_then_warned_of_its_time_limit_resumes_in_its_folder(slurm, tmp_path, cache_dir,
                                                                                           tiny_root):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", f"{PACKAGE}.train", "--multirun", "hydra/launcher=slurm",
               f"hydra.sweep.dir={sweep}", "hydra.launcher.tasks_per_node=2", "hydra.launcher.gpus_per_node=null",
               "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=null", *tiny(SIZES, cache_dir, tiny_root)]
    # One thread for each of the two tasks, as torchrun sets it: this test's Slurm binds no task to its own cores.
    launcher = subprocess.Popen(command, cwd=tmp_path, env={**slurm.env, **CPU_ONLY, "OMP_NUM_THREADS": "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        slurm.wait(lambda: list(sweep.glob(".submitit/[0-9]*")), "the submission")
        (job,) = [folder.name for folder in sweep.glob(".submitit/[0-9]*")]  # the folder submitit names by the job id
        # submitit's time-limit warning, as its own job._interrupt() sends it: USR2 to every task.
        finished = preempted_then_warned(slurm, job, sweep / "0",
                                         lambda: slurm.command("scancel", "--signal=USR2", job))
    finally:
        stop(launcher)
    assert finished["Restarts"] == "2"
    check_stops_and_coverage(sweep / "0", ["SIGTERM", "SIGUSR2"])  # rank 1's lines are in a log of its own
    assert STOPPED.search((sweep / "0/train-rank1.log").read_text())
    log = (sweep / "0/train.log").read_text()
    assert log.index("stopped by SIGUSR2") < log.index(f"Requeued job {job}"), log[-3000:]  # submitit's line
