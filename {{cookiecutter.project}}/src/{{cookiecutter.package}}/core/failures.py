"""How a run ends when something fails: one `error:` line on stderr that says what failed and what to do
next, the whole traceback in the run's log file, and no loader worker left behind.

A failure a user can cause or meet (a bad value or file, a killed worker, a full disk, a collective that
times out) gets its line. A bug, an error from our own code, keeps its traceback on the console too.
"""
import errno
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

import psutil
import torch

from .errors import ClearError

log = logging.getLogger(__name__)

# The signals that ask a run to stop at its logging window (loop/preempt.py): loader workers ignore them, since the
# training process alone decides how to stop, and a scheduler's signal reaches every process of the job.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
WORKER_DIED = re.compile(r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited "
                         r"unexpectedly)")
CAUGHT_IN_WORKER = re.compile(r"^Caught \w+ in DataLoader worker process (\d+)\.")
# A batch's shared memory reaches the training process as a file descriptor its worker hands over through
# multiprocessing's resource sharer: a worker that dies mid hand-over fails the receiving end there.
HAND_OVER = os.path.join("multiprocessing", "resource_sharer.py")
SECONDS_TO_BECOME_WAITABLE = 1.0  # a dying process closes its sockets a moment before its parent can wait for it
OUT_OF_MEMORY = "most likely out of memory: lower loader.num_workers or loader.prefetch_factor"
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
GLOO_ERROR = re.compile(r"^\[[^\]]*/gloo/[^\]]*\] ")  # gloo reports a lost peer or a timeout as a RuntimeError
GLOO_CLOSED = "Application timeout caused pair closure"  # unprefixed: an op on a link a timeout already closed


def causes(err: BaseException):
    """The exception and those it was raised from or during."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def full_disk(err: BaseException) -> bool:
    return any((isinstance(cause, OSError) and cause.errno in FULL_DISK) or "No space left on device" in str(cause)
               for cause in causes(err))


def collective_failure(err: BaseException) -> str | None:
    """What a collective across the processes reported, if that is what failed."""
    if isinstance(err, torch.distributed.DistError):
        return str(err)
    if isinstance(err, RuntimeError) and (GLOO_ERROR.match(str(err)) or str(err).startswith(GLOO_CLOSED)):
        return GLOO_ERROR.sub("", str(err))
    return None


def failed_hand_over(err: BaseException) -> bool:
    """Whether a loader worker's batch failed on its way over, its sender gone (see HAND_OVER)."""
    return any(isinstance(cause, (OSError, EOFError)) and any(
        frame.f_code.co_filename.endswith(HAND_OVER) for frame, _ in traceback.walk_tb(cause.__traceback__))
        for cause in causes(err))


def ended_child() -> tuple[int, str] | None:
    """A child of this process that has ended and was not waited for yet, and how it ended in the DataLoader's
    words, read without reaping it; None when none has ended within SECONDS_TO_BECOME_WAITABLE."""
    deadline = time.monotonic() + SECONDS_TO_BECOME_WAITABLE
    while True:
        for child in psutil.Process().children():
            try:
                ended = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # waited for meanwhile
                continue
            if ended is not None:
                if ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
                    return ended.si_pid, f"was killed by a signal ({signal.strsignal(ended.si_status)})"
                return ended.si_pid, "died"
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def worker_message(text: str) -> str:
    """A message as the user wrote it, also when torch re-raised it from a loader worker with its traceback."""
    caught = CAUGHT_IN_WORKER.match(text)
    if not caught:
        return text
    message = re.sub(r"^[\w.]+: ", "", text.strip().splitlines()[-1])  # the last line: module.Class: message
    return f"{message} (in loader worker {caught[1]})"


def explain(err: BaseException) -> str | None:
    """The one line for a failure a user can cause or meet, with the way to continue; None for a bug."""
    resume = getattr(err, "resume_step", None)
    resume = f"; resume=auto continues from step {resume}" if resume is not None else ""
    stacks = getattr(err, "stacks_file", None)  # see forensics.py
    resume += f"; where every thread stood: {stacks}" if stacks is not None else ""
    died = WORKER_DIED.search(str(err))
    collective = collective_failure(err)
    if isinstance(err, ClearError):
        line = worker_message(str(err))
    elif died:
        how = f"was killed by a signal ({died[2].strip()})" if died[2] else "died"
        line = f"a loader worker (pid {died[1].strip()}) {how}, {OUT_OF_MEMORY}"
    elif failed_hand_over(err):
        ended = ended_child()
        who = (f"a loader worker (pid {ended[0]}) {ended[1]}" if ended else
               f"a loader worker ended while handing a batch over ({err.__class__.__name__}: {err})")
        line = f"{who}, {OUT_OF_MEMORY}"
    elif full_disk(err):
        line = f"the disk is full ({err.__class__.__name__}: {str(err).splitlines()[0][:200]}): free some space"
    elif isinstance(err, torch.OutOfMemoryError):
        line = "the GPU ran out of memory: lower train.batch_size, or try precision=bf16"
    elif collective is not None:
        line = (f"a collective across the processes failed ({collective.splitlines()[0][:200]}): another process "
                "failed or is stuck; torchrun restarts the group when --max-restarts allows")
    elif isinstance(err, KeyboardInterrupt):
        line = "interrupted by a second Ctrl-C"
    else:
        return None
    return line + resume


Result = TypeVar("Result")


def one_line(body: Callable[[], Result], finish: Callable[[], None] = lambda: None,
             record: Callable[[BaseException], None] = lambda err: None) -> Result:
    """A command's body, run so that every way out is designed: a failure the user can act on exits with its
    `error:` line (the traceback goes to the log file), a bug keeps its traceback, and this process's workers
    end, then `finish` runs, whichever way it went. `record` sees the failure first (forensics.py). A thread's
    failure goes the same way, through `thread_failed`."""
    threading.excepthook, hook = thread_failed, threading.excepthook
    try:
        return body()
    except SystemExit:  # an exit chosen on purpose, such as a launcher's once a stopped run's checkpoint is saved
        raise
    except BaseException as err:  # noqa: BLE001 - what the user can act on becomes one line; a bug re-raises
        record(err)
        line = explain(err)
        log_traceback(err)
        if line is None:
            raise
        sys.exit(f"error: {line}")
    finally:
        end_workers()
        finish()
        threading.excepthook = hook


def thread_failed(args: threading.ExceptHookArgs) -> None:
    """A thread's failure that the user can meet is logged in one line, its traceback in the log file only:
    TensorBoard's writer thread on a full disk, whose failure its owner raises again at the next call (and that call
    ends the run in one line). A bug keeps Python's report, traceback included, on stderr."""
    line = explain(args.exc_value) if isinstance(args.exc_value, Exception) else None
    if line is None:
        threading.__excepthook__(args)
        return
    name = f"thread {args.thread.name}" if args.thread is not None else "a thread"
    log.warning("%s failed: %s", name, line)
    log_traceback(args.exc_value, f"{name} failed")


def reported(stderr: str) -> str | None:
    """The line of a failed command's stderr that says why: ours (`error: ...`), Hydra's first (not its hints),
    or an exception's last; None for no output."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and "\r" not in line and "%|" not in line
             and not line.startswith(("Set the environment variable HYDRA_FULL_ERROR",
                                      "Error executing job with overrides"))]
    if not lines:
        return None
    ours = [line for line in lines if line.startswith("error:")]
    if ours:
        return ours[-1]
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def log_traceback(err: BaseException, what: str = "the run failed") -> None:
    """The whole traceback, into the run's log files only: the console gets the one line."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, what, None, (type(err), err, err.__traceback__))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def worker_deaths_surface_in_next() -> None:
    """Keep the DataLoader from installing its SIGCHLD handler, which raises wherever the training process
    happens to be when a worker dies, the middle of an optimizer step included. Without it the death is
    raised in `next(loader)`, between steps, within the 5 s the DataLoader waits before checking its workers."""
    from torch.utils.data._utils import signal_handling

    signal_handling._SIGCHLD_handler_set = True  # the flag torch sets once it has installed the handler


def end_workers() -> None:
    """SIGKILL this process's workers still alive: loader workers, or a pack's converters.

    Loader workers ignore STOP_SIGNALS so that the training process alone decides how to stop; at exit,
    multiprocessing would send them SIGTERM and wait for them forever.
    """
    if threading.current_thread() is threading.main_thread():  # where signal handlers can be set at all
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the DataLoader's handler would raise at each death we cause
    kill_children()


def kill_children() -> None:
    """SIGKILL this process's children still alive, and reap them (any thread may: no signal handler changes)."""
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)
