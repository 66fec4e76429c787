"""Every failure ends the run within seconds: one `error:` line, the traceback in the log file, no process
left behind, and the last completed step saved for resume=auto."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from helpers.full_disk import fill
from helpers.paths import PACKAGE, PROJECT
from helpers.processes import (QUIET, cli_command, error_line, finish, start_cli, stop, stopped_after_first_checkpoint,
                               wait_for)
from helpers.runs import LONGER, summary
from helpers.slow_disk import SCRIPT, fusectl, slow_disk

pytestmark = pytest.mark.full  # subprocesses, torchrun or the clock: make test-full

SECONDS_TO_EXIT = 30


def left_behind(run_dir: Path) -> list[int]:
    """Processes still running for this run folder (its loader workers share the command line)."""
    return [process.pid for process in psutil.process_iter(["cmdline"])
            if any(str(run_dir) in part for part in process.info["cmdline"] or [])]


def saved_step(run_dir: Path) -> int:
    return torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)["progress"]["step"]


def run_patched(patch: str, command: list[str]) -> str:
    """A script that applies `patch` (code; {package} is the package), then runs `command` as python -m would."""
    return (f"import runpy, sys\n{patch.format(package=PACKAGE)}sys.argv = {['train', *command[3:]]!r}\n"
            f"runpy.run_module('{PACKAGE}.train', run_name='__main__', alter_sys=True)\n")


def test_a_worker_that_raises_ends_the_run_with_one_line_and_its_last_step_saved(tmp_path, train_cli):
    run_dir = tmp_path / "run"
    began = time.monotonic()
    result = train_cli(run_dir, *LONGER, "loader.num_workers=2", "faults.worker_error_at=60", check=False)
    assert time.monotonic() - began < 2 * SECONDS_TO_EXIT  # start-up included
    assert result.returncode == 1 and not left_behind(run_dir)
    line = error_line(result.stderr)
    assert line.startswith("error: faults.worker_error_at=60: the loader worker reading training image number 60 "
                           "of this run raised, as asked (in loader worker ")
    step = saved_step(run_dir)
    assert 0 < step < 30 and line.endswith(f"; resume=auto continues from step {step}")
    assert "Traceback" in (run_dir / "train.log").read_text()  # the details are kept, in the log


def test_a_worker_killed_like_the_oom_killer_does_ends_the_run_within_seconds(tmp_path, cache_dir, tiny_root):
    run_dir = tmp_path / "run"
    process = start_cli(run_dir, (*LONGER, "train.epochs=8", "loader.num_workers=2"), cache_dir, tiny_root, env=QUIET)
    workers = []
    wait_for(lambda: (run_dir / "last.pt").exists() and workers.extend(psutil.Process(process.pid).children())
             or workers, process)  # past the first epoch, with workers running
    worker = workers[0]
    worker.kill()
    killed = time.monotonic()
    stderr = finish(process, timeout=120)
    assert time.monotonic() - killed < SECONDS_TO_EXIT and process.returncode == 1
    line = error_line(stderr)
    assert re.match(rf"error: a loader worker \(pid {worker.pid}\) (died|was killed by a signal \(Killed\)), most "
                    r"likely out of memory: lower loader.num_workers or loader.prefetch_factor; resume=auto continues "
                    r"from step \d+$", line), line
    assert line.endswith(f"step {saved_step(run_dir)}") and saved_step(run_dir) >= 30
    assert not left_behind(run_dir)


def test_workers_do_not_outlive_a_training_process_killed_outright(tmp_path, cache_dir, tiny_root):
    """SIGKILL (torchrun giving up on a rank, the OOM killer) leaves no handler to run: the workers, which
    ignore SIGTERM, notice their parent is gone (torch's worker loop checks every 5 s) and leave."""
    run_dir = tmp_path / "run"
    process = start_cli(run_dir, (*LONGER, "loader.num_workers=2", "loader.persistent_workers=true"), cache_dir,
                        tiny_root, env=QUIET)
    workers = []
    wait_for(lambda: (run_dir / "last.pt").exists() and workers.extend(psutil.Process(process.pid).children())
             or workers, process)
    process.kill()
    finish(process, timeout=30)
    gone, alive = psutil.wait_procs(workers, timeout=15)
    assert len(gone) == len(workers) >= 2 and not alive


def test_a_bug_in_a_worker_keeps_its_traceback_and_still_ends_the_run(tmp_path, cache_dir, tiny_root):
    run_dir = tmp_path / "run"
    command = cli_command(run_dir, ("loader.num_workers=2",), cache_dir, tiny_root)
    script = run_patched("from {package}.data import crops\n"
                         "crops.TrainCrop.__call__ = lambda self, width, height: 1 / 0  # a bug in our own code\n",
                         command)
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, **QUIET})
    assert time.monotonic() - began < 2 * SECONDS_TO_EXIT and result.returncode == 1
    assert "ZeroDivisionError" in result.stderr  # not an unreadable image to skip: a bug, shown as one
    assert "skipping unreadable image" not in (run_dir / "train.log").read_text()
    assert not left_behind(run_dir)


def test_a_checkpoint_of_another_model_is_refused_before_anything_loads(tmp_path, train_cli):
    train_cli(tmp_path / "resnet18", "model.name=resnet18")
    result = train_cli(tmp_path / "run", "model.name=resnet34", f"resume={tmp_path / 'resnet18/last.pt'}",
                       check=False)
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(
        f"error: resume={tmp_path / 'resnet18/last.pt'} holds resnet18 with 3 classes, and this run builds resnet34 "
        "with 3 classes: ")
    assert {path.name for path in (tmp_path / "run").iterdir()} <= {".hydra", "train.log"}


def test_a_data_set_half_unreadable_stops_the_run_in_one_line(tmp_path, tiny_root, train_cli):
    root = shutil.copytree(tiny_root, tmp_path / "data")
    for path in sorted((root / "train").rglob("*.JPEG"))[::2]:
        path.write_bytes(b"not an image")
    result = train_cli(tmp_path / "run", "data=folder", f"data.root={root}", "loader.num_workers=2", check=False)
    assert result.returncode == 1
    assert re.match(r"error: 1[12] of the 24 training images are unreadable, more than data.max_bad_fraction=0.01 allows "
                    r"\(10\): is this the data set you meant\?", error_line(result.stderr)), result.stderr[-1000:]
    assert not left_behind(tmp_path / "run")


def test_a_full_disk_during_training_is_one_line_and_leaves_no_half_checkpoint(tmp_path, small_disk, cache_dir,
                                                                                 tiny_root):
    disk = small_disk(6)  # room for the logs and TensorBoard, not for a ResNet-18 checkpoint (45 MB)
    run_dir = (disk or tmp_path) / "run"
    command = cli_command(run_dir, ("model.name=resnet18",), cache_dir, tiny_root)
    inject = "" if disk else (  # no tmpfs without root: the same failure, raised where torch.save writes
        "import torch; torch.save = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("
        "'[enforce fail at inline_container.cc:671] . unexpected pos 576 vs 534'))\n")
    script = run_patched(inject, command)
    result = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, **QUIET})
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert line.startswith(f"error: could not write {run_dir / 'last.pt'}: ") and "; any earlier last.pt is intact" \
        in line
    assert not [path for path in run_dir.iterdir() if path.name.endswith(".pt") or ".partial" in path.name]


def test_a_disk_that_fills_mid_run_ends_it_in_one_line_with_the_log_and_the_checkpoint_whole(tmp_path, small_disk,
                                                                                               cache_dir, tiny_root):
    """Another program takes the run folder's last bytes: TensorBoard's writer, the checkpoint and the log file all
    fail to write, and stderr has the one line, no "--- Logging error ---" or thread traceback before it."""
    disk = small_disk(32)  # room for the checkpoints of a small model, until the disk is filled
    if disk is None:
        pytest.skip(small_disk.refused)
    run_dir = disk / "run"
    # optim.lr=0.01: at the default 0.1 this model's loss turns NaN at step 43, before the disk is filled
    process = start_cli(run_dir, (*LONGER, "train.epochs=50", "model.name=mobilenet_v3_small", "optim.lr=0.01"),
                        cache_dir, tiny_root, env=QUIET)
    wait_for(lambda: (run_dir / "last.pt").exists(), process)
    before = saved_step(run_dir)
    fill(disk)
    filled = time.monotonic()
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end on a full disk:\n{stop(process)[-4000:]}") from None
    assert process.returncode == 1 and time.monotonic() - filled < SECONDS_TO_EXIT
    assert "--- Logging error ---" not in stderr and "Exception in thread" not in stderr, stderr[-3000:]
    line = error_line(stderr)
    failed = re.fullmatch(rf"error: could not write {re.escape(str(run_dir))}/\S+: No space left on device \(ENOSPC; "
                          r"[^)]+\)(; any earlier last.pt is intact)?; resume=auto continues from step (?P<step>\d+)",
                          line)
    assert failed, line
    assert int(failed["step"]) == saved_step(run_dir) >= before  # whole: it loads
    assert f"could not write {run_dir / 'train.log'}: No space left on device (ENOSPC" in stdout  # it failed too
    assert (run_dir / "train.log").read_text().endswith("\n")  # at its last whole line
    assert not [path for path in run_dir.iterdir() if ".partial" in path.name] and not left_behind(run_dir)


ON_A_MOUNT = ("train.epochs=50", "model.name=mobilenet_v3_small", "data=folder", "loader.num_workers=2")
STORAGE_FAILED = (r"error: could not read {mount}/(train|val)/\S+: {reason}: the storage failed, not the image: check "
                  r"the disk, the mount or the server it is on \(in loader worker [01]\); resume=auto continues from "
                  r"step (?P<step>\d+)")


def test_a_disk_that_fails_reads_ends_the_run_in_one_line_naming_the_file_and_the_errno(tmp_path, cache_dir,
                                                                                       tiny_root):
    """EIO on every read from some point on: not an unreadable image to skip (data.on_error=skip), the disk."""
    mountpoint, run_dir = tmp_path / "data", tmp_path / "run"
    with slow_disk(tiny_root, mountpoint, "nfs") as daemon:
        process = start_cli(run_dir, (*ON_A_MOUNT, f"data.root={mountpoint}", "data.on_error=skip"), cache_dir,
                            tiny_root, env=QUIET)
        wait_for(lambda: (run_dir / "last.pt").exists(), process)
        before = saved_step(run_dir)
        daemon.send_signal(signal.SIGUSR1)
        failed = time.monotonic()
        stderr = finish(process, timeout=120)
        seconds = time.monotonic() - failed
    assert process.returncode == 1 and seconds < SECONDS_TO_EXIT
    line = error_line(stderr)
    read = re.fullmatch(STORAGE_FAILED.format(mount=re.escape(str(mountpoint)), reason=r"Input/output error \(EIO\)"),
                        line)
    assert read, line
    assert int(read["step"]) == saved_step(run_dir) >= before
    assert torch.load(run_dir / "last.pt", weights_only=False)["unreadable"] == {"train": [], "val": []}
    assert "skipping unreadable image" not in (run_dir / "train.log").read_text() and not left_behind(run_dir)


def test_a_mount_that_freezes_gets_its_stall_reported_then_once_aborted_ends_the_run_in_one_line(tmp_path, cache_dir,
                                                                                                tiny_root):
    """A network mount stops answering (its daemon stopped): the stall's warning and stacks come after
    distributed.stall_min, and the run waits, since the mount may come back. Aborted through fusectl, it fails the
    reads waiting on it (ECONNABORTED) and those after (ENOTCONN)."""
    mountpoint, run_dir = tmp_path / "data", tmp_path / "run"
    log = run_dir / "train.log"
    with fusectl(), slow_disk(tiny_root, mountpoint, "nfs") as daemon:
        process = start_cli(run_dir, (*ON_A_MOUNT, f"data.root={mountpoint}", "distributed.stall_min=0.1"), cache_dir,
                            tiny_root, env=QUIET)
        wait_for(lambda: (run_dir / "last.pt").exists(), process)
        before, stalls = saved_step(run_dir), log.read_text().count("no progress for")
        daemon.send_signal(signal.SIGSTOP)
        wait_for(lambda: log.read_text().count("no progress for") > stalls, process, timeout=120)
        assert (run_dir / "stacks-rank0.txt").exists() and process.poll() is None
        aborted = subprocess.run([sys.executable, str(SCRIPT), "--abort", str(mountpoint)], capture_output=True,
                                 text=True, timeout=30)
        assert aborted.returncode == 0, aborted.stderr + stop(process)[-2000:]  # the run, left waiting, is ended
        began = time.monotonic()
        stderr = finish(process, timeout=120)
        seconds = time.monotonic() - began
        daemon.send_signal(signal.SIGCONT)  # it finds its connection gone, and exits
    assert process.returncode == 1 and seconds < SECONDS_TO_EXIT
    line = error_line(stderr)
    read = re.fullmatch(STORAGE_FAILED.format(
        mount=re.escape(str(mountpoint)),
        reason=r"(Software caused connection abort \(ECONNABORTED\)|Transport endpoint is not connected \(ENOTCONN\))"),
        line)
    assert read, line
    assert int(read["step"]) == saved_step(run_dir) >= before and not left_behind(run_dir)


def test_sigterm_still_stops_at_the_window_and_leaves_no_worker(tmp_path, cache_dir, tiny_root):
    run_dir = tmp_path / "run"
    stopped_after_first_checkpoint(run_dir, (*LONGER, "loader.num_workers=2", "loader.persistent_workers=true"),
                                   cache_dir, tiny_root)
    assert "stopped by SIGTERM" in (run_dir / "train.log").read_text() and not left_behind(run_dir)
    assert not (run_dir / "summary.json").exists() and summary  # resume=auto finishes it (test_train)


EXACT = (*LONGER, "train.epochs=4", "cudnn=deterministic", "loader.num_workers=2")  # 120 steps


def final_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)["model"]


def killed_a_child(process: subprocess.Popen) -> bool:
    """SIGKILL to one of the run's loader workers alive now, if it has one: a worker listed a moment earlier may
    have ended with its epoch, whose next one starts new workers."""
    for child in psutil.Process(process.pid).children():
        try:
            child.kill()
            return True
        except psutil.NoSuchProcess:
            continue
    return False


def test_three_interruptions_resume_to_the_weights_of_an_uninterrupted_run(tmp_path, cache_dir, tiny_root,
                                                                          train_cli):
    """SIGTERM, an exception in a loader worker, a worker killed: each time resume=auto, and the same bits."""
    train_cli(tmp_path / "straight", *EXACT)
    run_dir = tmp_path / "interrupted"
    log = run_dir / "train.log"

    stopped_after_first_checkpoint(run_dir, EXACT, cache_dir, tiny_root)
    stops = [saved_step(run_dir)]

    failed = train_cli(run_dir, *EXACT, "resume=auto", "faults.worker_error_at=40", check=False)
    assert failed.returncode == 1 and "faults.worker_error_at=40" in error_line(failed.stderr)
    stops.append(saved_step(run_dir))

    process = start_cli(run_dir, (*EXACT, "resume=auto"), cache_dir, tiny_root, env=QUIET)
    wait_for(lambda: log.read_text().count("resumed from") == 2, process)
    time.sleep(1.0)  # some steps past the checkpoint it resumed from
    wait_for(lambda: killed_a_child(process), process)
    assert (finish(process, timeout=120), process.returncode)[1] == 1
    stops.append(saved_step(run_dir))

    train_cli(run_dir, *EXACT, "resume=auto")
    assert 0 < stops[0] < stops[1] < stops[2] < 120, stops  # each interruption kept the progress before it
    assert summary(run_dir).steps == summary(tmp_path / "straight").steps == 120
    expected, resumed = final_weights(tmp_path / "straight"), final_weights(run_dir)
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), [
        name for name in expected if not torch.equal(expected[name], resumed[name])][:5]


def test_ctrl_c_then_the_line_it_prints_resume_to_the_weights_of_an_uninterrupted_run(tmp_path, cache_dir, tiny_root,
                                                                                      train_cli):
    """SIGINT to the run's process group, as Ctrl-C in a terminal sends it, part-way through epoch 1; then exactly the
    command the run printed, which names no override of the run's: it composes them again from the run's record."""
    train_cli(tmp_path / "straight", *EXACT)
    run_dir = tmp_path / "interrupted"
    process = subprocess.Popen(cli_command(run_dir, EXACT, cache_dir, tiny_root), cwd=PROJECT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, **QUIET}, start_new_session=True)
    wait_for(lambda: (run_dir / "last.pt").exists(), process)  # epoch 0 is done
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-3000:]
    record = (run_dir / ".hydra/overrides.yaml").read_text()
    printed = re.search(r"checkpoint saved: continue with (.+)$", stdout + stderr, re.MULTILINE)
    assert printed, (stdout + stderr)[-3000:]
    resumed = subprocess.run(shlex.split(printed[1]), cwd=PROJECT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, **QUIET})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_dir / ".hydra/overrides.yaml").read_text() == record, "the record stays the run's own"
    assert "resume: the run's own overrides from" in (run_dir / "train.log").read_text()
    assert summary(run_dir).steps == summary(tmp_path / "straight").steps == 120
    expected, resumed_weights = final_weights(tmp_path / "straight"), final_weights(run_dir)
    assert all(torch.equal(expected[name], resumed_weights[name]) for name in expected)


def test_a_stalled_run_asked_to_end_on_a_stall_ends_in_one_line_naming_its_stacks(tmp_path, cache_dir, tiny_root):
    """Each forward pass sleeps 4 s; distributed.stall_min allows 1.2 s, and distributed.stall_exit ends the run."""
    run_dir = tmp_path / "run"
    began = time.monotonic()
    process = start_cli(run_dir, ("faults.host_delay_ms=4000", "distributed.stall_min=0.02",
                                  "distributed.stall_exit=true"), cache_dir, tiny_root)
    stderr = finish(process, timeout=120)
    assert process.returncode == 1
    stacks = run_dir / "stacks-rank0.txt"
    assert error_line(stderr) == (f"error: rank 0 stalled, no progress for 1 s (distributed.stall_min=0.02): "
                                  f"distributed.stall_exit=true ends it; every thread's stack is in {stacks}")
    assert "time.sleep(host_delay_ms / 1000)" in stacks.read_text()
    assert left_behind(run_dir) == [] and time.monotonic() - began < 60
