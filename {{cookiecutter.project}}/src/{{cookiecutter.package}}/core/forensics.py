"""What each process was doing when a run hung or failed across processes: every thread's Python stack in
`stacks-rank<N>.txt` in the run folder, and on CUDA the NCCL flight recorder's dump beside it.

A rank writes its stacks
- before it exits on a collective that failed (a timeout, a lost peer) or on a second Ctrl-C: the failing
  call's traceback shows where the main thread waited, the other threads' stacks where they stood;
- when it made no progress (no training step, no validation batch) for `distributed.stall_min`, with no
  collective failing: a watchdog thread writes the live stacks and one warning line, and the run goes on,
  unless `distributed.stall_exit=true` asked it to end there;
- when it was asked to stop (SIGTERM) and has not reached its logging window's end `STOP_GRACE_S` later.
Each dump is a section added to the file, which is rewritten whole each time (nothing half-written).
"""
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from .failures import collective_failure, kill_children
from .files import WriteError, write_atomic

log = logging.getLogger(__name__)

STOP_GRACE_S = 15.0  # torchrun kills a worker 30 s after its SIGTERM: leave time to write the stacks before that
WATCH_EVERY_S = 1.0  # or a quarter of distributed.stall_min, where that is shorter


class PendingStop(Protocol):
    """A stop request (loop.preempt.StopRequest): the signal, and when it came; None until one did."""
    signal: str | None
    since: float | None


def stacks_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"stacks-rank{rank}.txt"


def thread_stacks() -> str:
    """Every Python thread's stack, most recent call last, each under its thread's name."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(f"--- thread {names.get(ident, ident)}{' (this one)' if ident == threading.get_ident() else ''}"
                     f" ---\n{''.join(traceback.format_stack(frame))}"
                     for ident, frame in sys._current_frames().items())


class Forensics:
    """Writes this rank's stacks into the run folder, and watches for a step that does not come."""

    def __init__(self, run_dir: Path, stall_min: float, stall_exit: bool):
        self.run_dir, self.stall_s, self.stall_exit = run_dir, 60 * stall_min, stall_exit
        self.last_progress = time.monotonic()
        self.reported_stall = self.reported_stop = False
        self.closing = threading.Event()

    @property
    def rank(self) -> int:
        return int(os.environ.get("RANK", 0))  # torchrun's, or submitit's once distributed.setup exported it

    def dump(self, reason: str, err: BaseException | None = None) -> Path:
        """Add a section to the stack file: why, the failing call's traceback (where the main thread waited) and
        every thread's stack now."""
        path = stacks_file(self.run_dir, self.rank)
        failing = "".join(traceback.format_exception(err)) if err is not None else ""
        section = (f"==== rank {self.rank}, pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}: {reason} ====\n"
                   + (f"--- the failing call ---\n{failing}" if failing else "") + thread_stacks() + "\n")
        earlier = path.read_text() if path.exists() else ""
        write_atomic(path, lambda temporary: temporary.write_text(earlier + section))
        return path

    def record(self, err: BaseException) -> None:
        """For `failures.one_line`: the stacks of a rank whose collective failed or that got a second Ctrl-C (it
        did not reach the point where it would stop), named on the error's line."""
        if collective_failure(err) is None and not isinstance(err, KeyboardInterrupt):
            return
        try:
            err.stacks_file = self.dump("a second Ctrl-C" if isinstance(err, KeyboardInterrupt)
                                        else "a collective across the processes failed", err)
        except (OSError, WriteError) as unwritten:
            log.error("could not write the stacks: %s", unwritten)

    def watch(self, batches: Iterable) -> Iterator:
        """The batches, each one counted as progress."""
        for batch in batches:
            self.progress()
            yield batch

    def progress(self) -> None:
        self.last_progress, self.reported_stall = time.monotonic(), False

    @contextmanager
    def watching(self, stop: PendingStop) -> Iterator[None]:
        """A watchdog thread for the stretch inside: a stall, or a stop request not honoured, gets the stacks."""
        self.progress()
        self.closing.clear()
        watcher = threading.Thread(target=self._watch, args=(stop,), daemon=True, name="stall-watchdog")
        watcher.start()
        try:
            yield
        finally:
            self.closing.set()
            watcher.join()

    def _watch(self, stop: PendingStop) -> None:
        while not self.closing.wait(min(WATCH_EVERY_S, self.stall_s / 4)):
            now = time.monotonic()
            if not self.reported_stall and now - self.last_progress > self.stall_s:
                self.reported_stall = True
                self._stalled(f"no progress for {now - self.last_progress:.0f} s "
                              f"(distributed.stall_min={self.stall_s / 60:g})")
            if not self.reported_stop and stop.since is not None and now - stop.since > STOP_GRACE_S:
                self.reported_stop = True
                self._write_or_warn(f"asked to stop ({stop.signal}) {now - stop.since:.0f} s ago and still short of "
                                    "its logging window's end, where it would stop")

    def _stalled(self, reason: str) -> None:
        path = self._write_or_warn(reason)
        if self.stall_exit and path is not None:
            # On a line of its own: the progress bar leaves its line open.
            print(f"\nerror: rank {self.rank} stalled, {reason}: distributed.stall_exit=true ends it; every thread's "
                  f"stack is in {path}", file=sys.stderr, flush=True)
            kill_children()  # the loader workers; a signal handler cannot change outside the main thread
            os._exit(1)  # the stuck main thread cannot be interrupted; torchrun restarts the group if it may

    def _write_or_warn(self, reason: str) -> Path | None:
        try:
            path = self.dump(reason)
        except (OSError, WriteError) as err:
            log.warning("rank %d: %s; writing its stacks failed too: %s", self.rank, reason, err)
            return None
        log.warning("rank %d: %s; every thread's stack is in %s", self.rank, reason, path)
        return path
