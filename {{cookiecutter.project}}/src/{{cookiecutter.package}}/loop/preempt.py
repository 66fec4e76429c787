"""Stopping on request: SIGTERM (Slurm preemption, `kill`), SIGINT (Ctrl-C), or SIGUSR1 and SIGUSR2 (a
scheduler's warning ahead of the time limit: Slurm's --signal, submitit's USR2).

The signal only raises a flag. At the end of the logging window, where the ranks synchronise anyway,
they agree to stop together; rank 0 then saves a checkpoint that records the position inside the epoch,
and `resume=auto` carries on from that batch. A second Ctrl-C stops at once.

A launcher may have had its own handler for the signal: submitit's, for its warning, requeues the job. Once the
checkpoint is saved, `hand_on` gives the signal to it.
"""
import signal
import threading
import time

from ..core.failures import STOP_SIGNALS


class Preempted(Exception):
    """Raised at a window's end on every rank once any rank has been asked to stop."""


class StopRequest:
    def __init__(self):
        self.signal: str | None = None
        self.since: float | None = None  # time.monotonic() when the signal came
        # Signals reach the main thread alone; a run in another thread (a Ray Train worker's) is stopped by its
        # launcher, and resumes from its last checkpoint.
        in_main_thread = threading.current_thread() is threading.main_thread()
        self.replaced = {number: signal.signal(number, self.handle) for number in STOP_SIGNALS} if in_main_thread else {}

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

    def hand_on(self) -> None:
        """Run the handler this process had for the signal that stopped it, where a launcher installed one (Python's
        own for Ctrl-C raises, and is left out). Call once the checkpoint is saved: submitit's requeues the job and
        ends the process."""
        if self.signal is None:  # another rank got the signal, and hands it on
            return
        number = signal.Signals[self.signal]
        handler = self.replaced[number]
        if callable(handler) and handler is not signal.default_int_handler:
            handler(number, None)
