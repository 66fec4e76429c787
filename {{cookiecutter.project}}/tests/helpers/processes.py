"""Command lines the tests start: the training command on tiny data, in the foreground or the background, stopped,
waited for and read."""
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.paths import PACKAGE, PROJECT
from helpers.runs import logged_windows, tiny

QUIET = {"PYTHONWARNINGS": "ignore"}
CPU_ONLY = {**QUIET, "CUDA_VISIBLE_DEVICES": ""}  # for the tests that are about a machine without a GPU


def torchrun(processes: int) -> tuple[str, ...]:
    """The launcher for `processes` processes on this machine: this interpreter's torchrun, standalone."""
    return (sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}")


def cli_command(run_dir: Path, overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path,
                launcher: tuple[str, ...] = (sys.executable,)) -> list[str]:
    """`python -m PACKAGE.train` (or `launcher` ... -m PACKAGE.train) on tiny data, writing into `run_dir`."""
    return [*launcher, "-m", f"{PACKAGE}.train", f"hydra.run.dir={run_dir}", *tiny(overrides, cache_dir, tiny_root)]


def error_line(stderr: str) -> str:
    """The last line a failed command printed, which must be its one line: no traceback anywhere before it."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[-1]


def start_cli(run_dir: Path, overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path,
              launcher: tuple[str, ...] = (sys.executable,), env: dict[str, str] | None = None) -> subprocess.Popen:
    """The training command line in the background, as train_cli would run it."""
    command = cli_command(run_dir, overrides, cache_dir, tiny_root, launcher)
    return subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **QUIET, **(env or {})}, start_new_session=True)


def stop(process: subprocess.Popen) -> str:
    """Kill `process` and every process it started; its stderr, where it was piped. Its process group goes too, where
    it leads one (start_cli's): a process started while the tree was being killed would hold the pipes open."""
    import psutil
    import signal

    if process.poll() is None:
        for child in psutil.Process(process.pid).children(recursive=True):
            child.kill()
        process.kill()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # no group of its own, or none of it left
        pass
    try:
        return process.communicate(timeout=60)[1] or ""
    except subprocess.TimeoutExpired:
        return "(its output pipes were still held open 60 s after it was killed, by a process outside its group)"


def wait_for(condition, *processes: subprocess.Popen, timeout: float = 300) -> None:
    """Return once `condition()` holds; fail, stopping `processes`, if one of them ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [process.returncode for process in processes if process.poll() is not None]
        if ended or time.monotonic() > deadline:
            stderr = "".join(stop(process) for process in processes)
            reason = f"ended with {ended} before the condition held" if ended else f"timed out after {timeout} s"
            raise AssertionError(f"{reason}\n{stderr[-4000:]}")
        time.sleep(0.2)


def stop_one_rank(job: subprocess.Popen, run_dir: Path, rank: str, timeout: float = 600):
    """Once a torchrun `job` (logger=jsonl) has logged its first window, SIGTERM its process of `rank` alone: every
    process stops at the next window's end, and rank 0 saves the step. The log's line that says where it stopped,
    with the step and the images of the epoch as its groups."""
    import psutil
    import re
    import signal

    wait_for(lambda: logged_windows(run_dir), job, timeout=timeout)
    processes = {process.environ()["RANK"]: process for process in psutil.Process(job.pid).children()}
    processes[rank].send_signal(signal.SIGTERM)
    stderr = finish(job, timeout=300)
    assert job.returncode == 0, stderr[-4000:]
    log = (run_dir / "train.log").read_text()
    stopped = re.search(r"stopped by a signal to another rank at step (\d+) \(epoch 0, (\d+) images into it\)", log)
    assert stopped, log[-3000:]
    return stopped


def stopped_after_first_checkpoint(run_dir: Path, overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path) -> str:
    """Train in the background, SIGTERM it once last.pt exists, and check it stopped cleanly; its stderr."""
    import signal

    process = start_cli(run_dir, overrides, cache_dir, tiny_root, env=QUIET)
    wait_for(lambda: (run_dir / "last.pt").exists(), process)
    process.send_signal(signal.SIGTERM)
    stderr = finish(process, timeout=120)
    assert process.returncode == 0, stderr[-2000:]
    return stderr


TRAINING_IMAGES_SCRIPT = """
import atexit, json, os, sys, zlib
import torch
from hydra import compose, initialize_config_dir
from {{ cookiecutter.package }}.contracts import Decoder
from {{ cookiecutter.package }}.core.distributed import setup
from {{ cookiecutter.package }}.core.failures import end_workers
from {{ cookiecutter.package }}.data.decoder import CpuDecoder
from {{ cookiecutter.package }}.data.loaders import make_loaders

atexit.register(end_workers)  # before multiprocessing's, which would wait for workers that ignore its SIGTERM
CpuDecoder.collate = Decoder.collate  # the batches hold CRC-32s, collated as torch does: no crops to resize
world = setup(1.0)
conf, out = sys.argv[1], sys.argv[2]
with initialize_config_dir(config_dir=conf, version_base="1.3"):
    cfg = compose("train", sys.argv[3:])
loaders = make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                       batch_size=cfg.train.batch_size, seed=cfg.seed, world=world, memory_format=torch.contiguous_format)
loaders.splits.train.transform = lambda payload: torch.tensor(zlib.crc32(payload))  # which image, not its pixels
"""


def training_images_script(path: Path, body: str) -> Path:
    """A script, `python path CONF OUT OVERRIDES...` (or under torchrun), that builds training's loaders whose
    batches hold each image's CRC-32 instead of its pixels, then runs `body` (world, loaders, out in scope)."""
    path.write_text(TRAINING_IMAGES_SCRIPT + body)
    return path


def finish(process: subprocess.Popen, timeout: float) -> str:
    """The stderr of `process` once it ends. Past `timeout`, it and every process it started are killed."""
    try:
        return process.communicate(timeout=timeout)[1] or ""
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{process.args} did not end in {timeout} s:\n{stop(process)[-6000:]}") from None

