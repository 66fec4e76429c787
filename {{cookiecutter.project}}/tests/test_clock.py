"""The timing split: a slow iterator shows as data time, a slow step as compute time."""
import time

import pytest
import torch

from {{ cookiecutter.package }}.clock import Clock, Window

DELAY = 0.02


def slow_batches(count: int, delay: float):
    for _ in range(count):
        time.sleep(delay)
        yield torch.zeros(8, 3, 4, 4), torch.zeros(8)


def measure(iterator_delay: float, step_delay: float) -> Window:
    clock = Clock(torch.device("cpu"))
    clock.start()
    for _ in clock.timed(slow_batches(10, iterator_delay)):
        time.sleep(step_delay)
    return clock.lap()


def test_slow_iterator_is_data_time():
    window = measure(DELAY, 0.0)
    assert window.data_frac > 0.9
    assert window.data_ms == pytest.approx(1000 * DELAY, rel=0.5)
    assert window.compute_ms < 5


def test_slow_step_is_compute_time():
    window = measure(0.0, DELAY)
    assert window.data_frac < 0.1
    assert window.compute_ms == pytest.approx(1000 * DELAY, rel=0.5)


def test_window_counts_steps_and_images():
    window = measure(0.001, 0.001)
    assert (window.steps, window.images) == (10, 80)
    assert window.images_per_s == pytest.approx(80 / window.wall_s)


def test_lap_opens_a_new_window():
    clock = Clock(torch.device("cpu"))
    for _ in clock.timed(slow_batches(3, 0.0)):
        pass
    assert clock.lap().steps == 3
    assert clock.lap().steps == 0


def test_windows_add_up():
    total = Window(2, 16, 1.0, 0.25) + Window(2, 16, 1.0, 0.75)
    assert (total.steps, total.images, total.data_frac, total.compute_ms) == (4, 32, 0.5, 250.0)


class HostEvent:
    """Stands in for torch.cuda.Event on a machine without a GPU: 'GPU time' is host time at record()."""

    def __init__(self, enable_timing: bool = False):
        self.time = None

    def record(self) -> None:
        self.time = time.perf_counter()

    def elapsed_time(self, end: "HostEvent") -> float:
        return 1000 * (end.time - self.time)


@pytest.mark.parametrize(("iterator_delay", "step_delay", "data_share"), [(DELAY, 0.0, "high"), (0.0, DELAY, "low")])
def test_event_path_pairs_each_step(monkeypatch, iterator_delay, step_delay, data_share):
    """With events, compute is the summed start-to-end time of each step; the rest of the window is data."""
    monkeypatch.setattr(torch.cuda, "Event", HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    clock = Clock(torch.device("cuda"))
    for _ in clock.timed(slow_batches(10, iterator_delay)):
        time.sleep(step_delay)
    window = clock.lap()
    assert window.steps == 10 and len(clock.step_events) == 0
    assert (window.data_frac > 0.9) if data_share == "high" else (window.data_frac < 0.1)
    spent = 1000 * max(iterator_delay, step_delay)
    assert (window.data_ms if data_share == "high" else window.compute_ms) == pytest.approx(spent, rel=0.5)
