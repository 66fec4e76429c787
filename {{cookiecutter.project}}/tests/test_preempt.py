"""Stop requests (loop/preempt.py): the signals that stop a run at its window, and the launcher's own handler for
the signal, run once the checkpoint is saved."""
import os
import signal

import pytest

from {{ cookiecutter.package }}.loop.preempt import Preempted, StopRequest

pytestmark = pytest.mark.usefixtures("kept_signal_handlers")


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2])
def test_a_schedulers_signal_stops_the_run_then_reaches_the_launchers_own_handler(number):
    received = []
    signal.signal(number, lambda signum, frame: received.append(signum))  # as submitit's, installed before the run
    stop = StopRequest()
    os.kill(os.getpid(), number)
    assert stop.asked and received == []  # the run goes on to its window's end
    with pytest.raises(Preempted, match=signal.Signals(number).name):
        stop.check(stop.asked)
    stop.hand_on()
    assert received == [number]


def test_ctrl_c_is_not_handed_on_to_pythons_own_handler_which_would_raise():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = StopRequest()
    os.kill(os.getpid(), signal.SIGINT)
    stop.hand_on()
    assert stop.signal == "SIGINT"


def test_a_process_that_got_no_signal_hands_nothing_on():
    received = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    stop = StopRequest()
    with pytest.raises(Preempted, match="a signal to another rank"):
        stop.check(True)  # another rank was asked
    stop.hand_on()
    assert received == []
