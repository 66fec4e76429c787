"""Stopping on request: SIGTERM (Slurm preemption, `kill`) or SIGINT (Ctrl-C).

The signal only raises a flag. At the end of the logging window, where the ranks synchronise anyway,
they agree to stop together; rank 0 then saves a checkpoint that records the position inside the epoch,
and `resume=auto` carries on from that batch. A second Ctrl-C stops at once.
"""
import signal

import torch

from ..core.distributed import World


class Preempted(Exception):
    """Raised at a window's end on every rank once any rank has been asked to stop."""


class StopRequest:
    def __init__(self):
        self.signal: str | None = None
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self.handle)

    def handle(self, number: int, frame) -> None:
        if self.signal is not None and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(number).name

    def check(self, world: World) -> None:
        """Raise Preempted if any rank got a signal (one all-reduce of one number)."""
        asked = world.sum(torch.tensor([int(self.signal is not None)], device=world.device))
        if int(asked.item()):
            raise Preempted(self.signal or "a signal to another rank")
