"""Measured runs of the training command, for the tools: each trial is `python -m <package>.train` (or another
command of the package) in a process session of its own, followed while it runs and stopped outright when
asked, its loader workers with it. `gpu_check` runs them one after another; `tune` through `Trials`.

A plain `python -m <package>.tune` runs each trial as one process. Under torchrun every process of the tune
job runs the same trial as one rank of a training job of the same size: rank 0 says what to run and reads
what it measured. Each trial joins a process group of its own, on a port of its own, so a trial that fails
leaves the tune job's group, which carries only what to run next, whole.
"""
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist
from omegaconf import OmegaConf

from .. import options
from ..core.failures import reported
from ..diagnosis.summary import Summary
from ..loop.checkpoint import BEST, LAST
from ..options import PACKAGE

PEER_TIMEOUT_MIN = 1.0  # a trial's process gives up on a peer that failed after this long, not training's 30 min
POLL_S = 0.25  # how often a running trial's progress is read
FOLLOWED = options.only("logger", "followed")  # the logger whose file shows a trial's windows as they end
PROGRESS = OmegaConf.load(options.CONF / "logger" / f"{FOLLOWED}.yaml").file
STOPPED = -1  # run_rank's exit code for a trial it stopped


@dataclass
class Trial:
    name: str  # tune's trial number; gpu_check's run
    change: dict[str, str]  # the overrides tried on top of the common ones, as key -> value
    summary: Summary | None = None  # the trial's summary.json; None if it did not finish
    note: str = ""  # why it did not run, finish or go on, or what it is
    kept: bool = False
    seconds: float = 0.0  # from launch to exit
    setup_s: float = 0.0  # of which the training command spent building (data, model, compile) before its first step
    window: dict = field(default_factory=dict)  # a trial stopped early: its first timed window's figures

    @property
    def rate(self) -> float:
        return self.summary.images_per_s if self.summary else 0.0

    @property
    def figures(self) -> dict:
        """The summary's timing split, or for a trial stopped early its first timed window's: what the tables and
        chart show."""
        return self.summary.figures() if self.summary else self.window


class Progress:
    """A running trial's logging windows, read from its logger's file (FOLLOWED) as they are written."""

    def __init__(self, folder: Path):
        self.path, self.lines = folder / PROGRESS, []

    def read(self) -> list[dict]:
        """Every complete line so far: the set-up time first, then one per logging window."""
        if self.path.is_file():
            text = self.path.read_text()
            self.lines = [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]
        return self.lines

    @property
    def setup_s(self) -> float:
        return next((line["time/setup_s"] for line in self.read() if "time/setup_s" in line), 0.0)

    @property
    def windows(self) -> list[dict]:
        return [line for line in self.read() if "throughput/images_per_s" in line]


# Given a running trial's progress and its seconds since launch: None to let it run, or why it stops now.
Judge = Callable[[Progress, float], str | None]


def as_overrides(settings: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in settings.items()]


class Ranks:
    """The tune job's processes: one, or torchrun's, in a gloo group used only to agree on each trial."""

    def __init__(self, timeout_s: float):
        self.rank, self.size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if self.size > 1:  # gloo even on GPUs: the trials, not the tune job, should hold the devices
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))

    def share(self, value):
        """Rank 0's `value`, on every rank."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value) -> list:
        """Every rank's `value`, in rank order, on rank 0."""
        if self.size == 1:
            return [value]
        values = [None] * self.size if self.rank == 0 else None
        dist.gather_object(value, values, dst=0)
        return values

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def run_command(command: list[str], folder: Path, timeout_s: float, env: dict[str, str] | None = None,
                judge: Judge | None = None) -> tuple[int, str]:
    """Run `command`, which writes into `folder`: its exit code and, if it failed or was stopped, its one-line
    reason. It is stopped when `judge` says so or once `timeout_s` have passed (exit code STOPPED)."""
    progress, began = Progress(folder), time.monotonic()
    with tempfile.TemporaryFile("w+") as stderr:  # a file, not a pipe, which a long trial could fill and block on
        # A process session of its own: stopping it ends its loader workers too.
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=env,
                                   start_new_session=True)
        try:
            while process.poll() is None:
                elapsed = time.monotonic() - began
                reason = judge(progress, elapsed) if judge else None
                if reason is None and elapsed > timeout_s:
                    reason = f"still running after {timeout_s:.0f} s"
                if reason is not None:
                    return STOPPED, reason
                time.sleep(POLL_S)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        stderr.seek(0)
        return process.returncode, (reported(stderr.read()) or f"exit code {process.returncode}") \
            if process.returncode else ""


def command_of(tool: str, folder: Path, overrides: list[str]) -> list[str]:
    """`python -m <package>.<tool> ...overrides`, writing into `folder`."""
    return [sys.executable, "-m", f"{PACKAGE}.{tool}", *overrides, f"hydra.run.dir={folder}"]


def run_rank(job: dict, ranks: Ranks, judge: Judge | None = None) -> tuple[int, str]:
    """This process's rank of a trial: its exit code and, if it failed or was stopped, its one-line reason.

    Rank 0 may stop its rank early (`judge`); the others' ranks then fail on their next collective, at once.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("TORCHELASTIC_")}
    if ranks.size > 1:  # RANK, WORLD_SIZE and MASTER_ADDR as torchrun set them for tune; a group of its own
        env["MASTER_PORT"] = str(job["port"])
    folder = Path(job["folder"])
    return run_command(command_of("train", folder, job["overrides"]), folder, job["timeout_s"], env, judge)


def follow(ranks: Ranks) -> None:
    """Every rank but 0: run each trial rank 0 shares, until it shares None."""
    while (job := ranks.share(None)) is not None:
        ranks.gather(run_rank(job, ranks))


def first_timed(progress: Progress) -> dict:
    """The first logging window after the start-up one, as a summary names its figures; empty before it ends."""
    windows = progress.windows
    if len(windows) < 2:
        return {}
    window = windows[1]
    return {"images_per_s": window["throughput/images_per_s"], "data_frac": window["time/data_frac"],
            "host_frac": window["time/host_frac"], "data_ms": window["time/data_ms"], "host_ms": window["time/host_ms"],
            "compute_ms": window["time/compute_ms"]}


class Trials:
    """Rank 0's side: runs each trial on every rank and keeps what it measured, within the budget."""

    def __init__(self, base: list[str], run_dir: Path, steps: int, log_every: int, budget_s: float, ranks: Ranks):
        self.base, self.run_dir, self.ranks = base, run_dir, ranks
        self.shape = [f"train.max_steps={steps}", f"train.log_every={log_every}", "train.epochs=1000",
                      "train.limit_val_batches=1", f"logger={FOLLOWED}", f"distributed.timeout_min={PEER_TIMEOUT_MIN}"]
        self.deadline, self.longest, self.done = time.monotonic() + budget_s, 0.0, []

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def time_left(self, extra_s: float = 0.0) -> bool:
        """Whether a trial as long as the longest so far, after `extra_s` more, still ends within the budget."""
        return self.longest + extra_s < self.seconds_left()

    def record(self, trial: Trial) -> Trial:
        self.done.append(trial)
        return trial

    def run(self, settings: dict[str, str], judge: Judge | None = None) -> Trial:
        """A trial of the given overrides with `settings` on top; `judge` may stop it early (see Judge)."""
        trial = Trial(str(len(self.done)), settings)
        folder = self.run_dir / "trials" / f"{len(self.done):02d}"
        job = {"overrides": [*self.base, *as_overrides(settings), *self.shape],
               "folder": str(folder), "port": free_port(), "timeout_s": max(60.0, self.seconds_left() + 60.0)}
        began = time.monotonic()
        outcomes = self.ranks.gather(run_rank(self.ranks.share(job), self.ranks, judge))
        trial.seconds = time.monotonic() - began
        progress = Progress(folder)
        trial.setup_s = progress.setup_s
        stopped = outcomes[0][0] == STOPPED
        failed = [line for code, line in outcomes if code]
        if stopped:  # rank 0 stopped it: the others only lost their peer
            trial.note, trial.window = f"stopped after {trial.seconds:.0f} s: {outcomes[0][1]}", first_timed(progress)
        elif failed:  # the rank that failed first says why; the others only lost a peer
            trial.note = next((line for line in failed if "collective" not in line), failed[0])
        else:
            trial.summary = Summary.read(folder / "summary.json")
        for checkpoint in (LAST, BEST):  # a trial's weights are never used again, and a ResNet-50's are 100 MB each
            (folder / checkpoint).unlink(missing_ok=True)
        self.longest = max(self.longest, trial.seconds)
        return self.record(trial)

    def finish(self) -> None:
        """Let the other ranks' `follow` return."""
        self.ranks.share(None)
