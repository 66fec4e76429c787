"""Short measured runs of the training command, for `tune`: each trial is `python -m <package>.train`.

A plain `python -m <package>.tune` runs each trial as one process. Under torchrun every process of the tune
job runs the same trial as one rank of a training job of the same size: rank 0 says what to run and reads
what it measured. Each trial joins a process group of its own, on a port of its own, so a trial that fails
leaves the tune job's group, which carries only what to run next, whole.
"""
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from .failures import reported

PEER_TIMEOUT_MIN = 1.0  # a trial's process gives up on a peer that failed after this long, not training's 30 min


@dataclass
class Trial:
    number: int
    change: dict[str, str]  # the overrides tried on top of the given ones, as key -> value
    summary: dict = field(default_factory=dict)  # the trial's summary.json; empty if it did not finish
    note: str = ""  # why it did not run or finish, or what it is
    kept: bool = False

    @property
    def rate(self) -> float:
        return self.summary.get("images_per_s", 0.0)


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


def run_rank(job: dict, ranks: Ranks) -> tuple[int, str]:
    """This process's rank of a trial: its exit code and, if it failed, its one-line reason."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TORCHELASTIC_")}
    if ranks.size > 1:  # RANK, WORLD_SIZE and MASTER_ADDR as torchrun set them for tune; a group of its own
        env["MASTER_PORT"] = str(job["port"])
    command = [sys.executable, "-m", f"{__package__}.train", *job["overrides"]]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=job["timeout_s"], env=env)
    except subprocess.TimeoutExpired:
        return -1, "did not finish within the budget"
    return done.returncode, (reported(done.stderr) or f"exit code {done.returncode}") if done.returncode else ""


def follow(ranks: Ranks) -> None:
    """Every rank but 0: run each trial rank 0 shares, until it shares None."""
    while (job := ranks.share(None)) is not None:
        ranks.gather(run_rank(job, ranks))


class Trials:
    """Rank 0's side: runs each trial on every rank and keeps what it measured, within the budget."""

    def __init__(self, base: list[str], run_dir: Path, steps: int, log_every: int, budget_s: float, ranks: Ranks):
        self.base, self.run_dir, self.ranks = base, run_dir, ranks
        self.shape = [f"train.max_steps={steps}", f"train.log_every={log_every}", "train.epochs=1000",
                      "train.limit_val_batches=1", "logger=none", f"distributed.timeout_min={PEER_TIMEOUT_MIN}"]
        self.deadline, self.longest, self.done = time.monotonic() + budget_s, 0.0, []

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def time_left(self, extra_s: float = 0.0) -> bool:
        """Whether a trial as long as the longest so far, after `extra_s` more, still ends within the budget."""
        return self.longest + extra_s < self.seconds_left()

    def record(self, trial: Trial) -> Trial:
        self.done.append(trial)
        return trial

    def run(self, settings: dict[str, str]) -> Trial:
        """A trial of the given overrides with `settings` on top."""
        trial = Trial(len(self.done), settings)
        folder = self.run_dir / "trials" / f"{trial.number:02d}"
        job = {"overrides": [*self.base, *as_overrides(settings), *self.shape, f"hydra.run.dir={folder}"],
               "port": free_port(), "timeout_s": max(60.0, self.seconds_left() + 60.0)}
        began = time.monotonic()
        outcomes = self.ranks.gather(run_rank(self.ranks.share(job), self.ranks))
        failed = [line for code, line in outcomes if code]
        if failed:  # the rank that failed first says why; the others only lost a peer
            trial.note = next((line for line in failed if "collective" not in line), failed[0])
        else:
            trial.summary = json.loads((folder / "summary.json").read_text())
        self.longest = max(self.longest, time.monotonic() - began)
        return self.record(trial)

    def finish(self) -> None:
        """Let the other ranks' `follow` return."""
        self.ranks.share(None)
