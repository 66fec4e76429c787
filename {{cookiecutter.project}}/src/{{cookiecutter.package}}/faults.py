"""Faults injected on purpose (`faults.*`), to check that the report names what slows a run down.

`faults.host_delay_ms=20` makes the host sleep before every forward pass, as a Python-heavy step would:
on a GPU the report must call the run host-bound, not data-bound.
"""
import time

import torch


def slow_host(model: torch.nn.Module, host_delay_ms: float) -> None:
    """Sleep `host_delay_ms` on the host before each forward pass of `model` (the outermost wrapper, so
    torch.compile never traces the sleep)."""
    if host_delay_ms > 0:
        model.register_forward_pre_hook(lambda module, args: time.sleep(host_delay_ms / 1000))
