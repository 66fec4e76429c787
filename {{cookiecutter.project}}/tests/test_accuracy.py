"""Time to accuracy: the first validation at or above each level, the best with its time, and a resumed run
carrying on the clock of the run it resumed."""
import pytest

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.loop import accuracy
from {{ cookiecutter.package }}.loop.accuracy import time_to_accuracy


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_level_keeps_the_time_of_the_first_validation_that_reached_it(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(accuracy.time, "perf_counter", clock)
    tracked = time_to_accuracy([90, 50, 75], began=100.0)
    for seconds, top1, epoch in ((10, 40.0, 1), (20, 60.0, 2), (30, 55.0, 3), (40, 91.5, 4), (50, 88.0, 5)):
        clock.now = 100.0 + seconds
        assert tracked.add(top1, epoch) == seconds
    assert tracked.record() == {"time_to_top1_s": {"50": 20.0, "75": 40.0, "90": 40.0},
                                "best_top1": {"top1": 91.5, "at_s": 40.0, "epoch": 4}}


def test_a_resumed_run_adds_its_own_time_to_the_checkpoints(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(accuracy.time, "perf_counter", clock)
    first = time_to_accuracy([50], began=100.0)
    clock.now = 130.0
    first.add(60.0, 1)
    state = first.state_dict()
    clock.now = 1000.0  # the resumed process starts much later; the gap between the two is not training time
    resumed = time_to_accuracy([50, 75], began=1000.0)
    resumed.load_state_dict(state)
    clock.now = 1015.0
    assert resumed.add(80.0, 2) == 45.0
    assert resumed.record()["time_to_top1_s"] == {"50": 30.0, "75": 45.0}


@pytest.mark.parametrize("levels", [[150], [0], ["abc"], [True]])
def test_a_level_that_is_not_a_percentage_is_refused_in_one_line(levels):
    with pytest.raises(ConfigError) as refused:
        time_to_accuracy(levels)
    assert str(refused.value).startswith(f"train.top1_levels={levels} must be percentages above 0 and up to 100")
