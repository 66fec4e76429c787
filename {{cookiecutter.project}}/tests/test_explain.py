"""failures.explain: the failures a user meets become one line that names what happened, read from the facts."""
import multiprocessing
import signal
import time
from multiprocessing.reduction import ForkingPickler

import psutil
import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers how tensors travel between processes

from {{ cookiecutter.package }}.core import failures


def send_a_batch_then_wait(connection) -> None:
    """A loader worker's side: the batch's tensor goes over as a file descriptor that this process must hand over."""
    connection.send_bytes(ForkingPickler.dumps(torch.arange(64)))
    time.sleep(60)


def batch_of_a_killed_worker():
    """The bytes of a batch whose worker was then killed like the OOM killer does, and that worker."""
    ctx = multiprocessing.get_context("fork")
    receiving, sending = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=send_a_batch_then_wait, args=(sending,))
    worker.start()
    batch = receiving.recv_bytes()
    worker.kill()
    while psutil.Process(worker.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    return batch, worker


def test_a_worker_killed_mid_hand_over_is_named_with_its_signal_and_left_for_its_loader_to_reap(monkeypatch):
    batch, worker = batch_of_a_killed_worker()
    with pytest.raises((OSError, EOFError)) as raised:
        ForkingPickler.loads(batch)
    assert failures.explain(raised.value) == (f"a loader worker (pid {worker.pid}) was killed by a signal "
                                              f"({signal.strsignal(signal.SIGKILL)}), {failures.OUT_OF_MEMORY}")
    worker.join(timeout=5)  # explain only looked: the worker is still there to be waited for
    assert worker.exitcode == -signal.SIGKILL
    monkeypatch.setattr(failures, "SECONDS_TO_BECOME_WAITABLE", 0.05)
    line = failures.explain(raised.value)  # now with no ended child to name
    assert line.startswith(f"a loader worker ended while handing a batch over ({type(raised.value).__name__}: ")
    assert line.endswith(failures.OUT_OF_MEMORY)
    assert failures.explain(ConnectionResetError(104, "Connection reset by peer")) is None  # not in a hand-over
