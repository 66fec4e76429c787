"""Stopping on request: SIGTERM (Slurm preemption, `kill`) or SIGINT (Ctrl-C).

The signal only raises a flag. At the end of the logging window, where the ranks synchronise anyway,
they agree to stop together; rank 0 then saves a checkpoint that records the position inside the epoch,
and `resume=auto` carries on from that batch. A second Ctrl-C stops at once.
"""
import signal
import time


class Preempted(Exception):
    """Raised at a window's end on every rank once any rank has been asked to stop."""


class StopRequest:
    def __init__(self):
        self.signal: str | None = None
        self.since: float | None = None  # time.monotonic() when the signal came
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self.handle)

    def handle(self, number: int, frame) -> None:
        if self.signal is not None and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal, self.since = signal.Signals(number).name, time.monotonic()

    @property
    def asked(self) -> bool:
        return self.signal is not None

    def check(self, asked_anywhere: bool) -> None:
        """Raise Preempted if any rank got a signal: `asked_anywhere`, from the window's exchange (train.py)."""
        if asked_anywhere:
            raise Preempted(self.signal or "a signal to another rank")
