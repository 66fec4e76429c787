"""Faults injected on purpose (`faults.*`): to check that the report names what slows a run down, and that
a failure ends the run in one line with nothing lost.

- `faults.host_delay_ms=20` makes the host sleep before every forward pass, as a Python-heavy step would:
  on a GPU the report must call the run host-bound, not data-bound.
- `faults.worker_error_at=N` makes the loader worker that reads the Nth training image of the run raise
  (counted across workers; see data.Images).
- `faults.read_delay_ms=20` makes each training image take that much longer to load, in the loader worker:
  a slow disk or decoder, which more workers hide; the report must call the run data-bound, and `tune`
  must find the workers.
"""
import time

import torch

from .config import ClearError


class InjectedFault(ClearError):
    """The failure `faults.*` asked for."""


def slow_host(model: torch.nn.Module, host_delay_ms: float) -> None:
    """Sleep `host_delay_ms` on the host before each forward pass of `model` (the outermost wrapper, so
    torch.compile never traces the sleep)."""
    if host_delay_ms > 0:
        model.register_forward_pre_hook(lambda module, args: time.sleep(host_delay_ms / 1000))
