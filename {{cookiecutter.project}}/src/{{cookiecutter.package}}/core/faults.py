"""Faults injected on purpose (`faults.*`): to check that the report names what slows a run down, and that
a failure ends the run in one line with nothing lost.

- `faults.host_delay_ms=20` makes the host sleep before every forward pass, as a Python-heavy step would:
  on a GPU the report must call the run host-bound, not data-bound.
- `faults.worker_error_at=N` makes the loader worker that reads the Nth training image of the run raise
  (counted across workers; see data.Images).
- `faults.read_delay_ms=20` makes each training image take that much longer to load, in the loader worker:
  a slow disk or decoder, which more workers hide; the report must call the run data-bound, and `tune`
  must find the workers.
- `faults.unagreed_workers=3` makes the process draw each epoch's order as if every process ran its 3 loader
  workers, and run 3, instead of the layout the processes agreed on at start, as every process did before they
  agreed: with `order=blocks`, whose order depends on the workers, the epoch's coverage check must stop the run.
- `faults.nvml_fails_after=2` makes NVML answer for two logging windows, then fail, as "Failed to initialize
  NVML: Unknown Error" does on one node of a container job: the run must go on without sys/gpu_util there, and
  the report's gather across processes must still match (on a machine without a GPU, a stand-in reads 0%).
- `faults.rank=1` keeps them all to one process of a torchrun job, as a slow disk on one node would: the
  report must name that rank as the one the others wait for.
"""
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from .errors import ClearError


@dataclass(frozen=True)
class Faults:
    """The faults this process injects."""
    host_delay_ms: float = 0.0
    worker_error_at: int = -1
    read_delay_ms: float = 0.0
    unagreed_workers: int = -1
    nvml_fails_after: int = -1


def on_rank(cfg: DictConfig, rank: int) -> Faults:
    """The `faults.*` asked for, where `faults.rank` names this process or every one (-1); none elsewhere."""
    if cfg.rank not in (-1, rank):
        return Faults()
    return Faults(cfg.host_delay_ms, cfg.worker_error_at, cfg.read_delay_ms, cfg.unagreed_workers,
                  cfg.nvml_fails_after)


class InjectedFault(ClearError):
    """The failure `faults.*` asked for."""


class FaultyReads:
    """A worker transform slowed or failing on purpose: `read_delay_s` after each image, and an error at the
    `fail_at`-th image the workers read (counted across them, from 1)."""

    def __init__(self, transform: Callable, fail_at: int, read_delay_s: float):
        self.transform, self.fail_at, self.read_delay_s = transform, fail_at, read_delay_s
        self.reads = multiprocessing.Value("q", 0)  # shared by the workers

    def __call__(self, payload):
        with self.reads.get_lock():
            self.reads.value += 1
            reads = self.reads.value
        if reads == self.fail_at:
            raise InjectedFault(f"faults.worker_error_at={reads}: the loader worker reading training image number "
                                f"{reads} of this run raised, as asked")
        item = self.transform(payload)
        if self.read_delay_s:  # even time.sleep(0) costs a tenth of a millisecond
            time.sleep(self.read_delay_s)
        return item


class FailingNvml:
    """A GPU utilisation reader that answers `answers` times, then raises as NVML does on a node that lost it."""

    def __init__(self, read: Callable[[], float], answers: int):
        self.read, self.answers = read, answers

    def __call__(self) -> float:
        if self.answers <= 0:
            raise RuntimeError("Failed to initialize NVML: Unknown Error (faults.nvml_fails_after)")
        self.answers -= 1
        return self.read()


def slow_host(model: torch.nn.Module, host_delay_ms: float) -> None:
    """Sleep `host_delay_ms` on the host before each forward pass of `model` (the outermost wrapper, so
    torch.compile never traces the sleep)."""
    if host_delay_ms > 0:
        model.register_forward_pre_hook(lambda module, args: time.sleep(host_delay_ms / 1000))
