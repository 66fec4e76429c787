"""Time to accuracy: the wall-clock seconds from the run's start (its set-up included) to the first validation whose
top-1 reached each of train.top1_levels, and the best top-1 with its time. A speed switch is judged by this, not by
images/s alone, as DAWNBench and MLPerf rank runs. A resumed run adds its own time to what its checkpoint recorded."""
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.errors import ConfigError


@dataclass
class TimeToAccuracy:
    levels: list[float]  # top-1 in percent, ascending
    began: float  # this process's start, on perf_counter's clock
    before_s: float = 0.0  # the seconds of the runs this one resumed
    reached: dict[str, float] = field(default_factory=dict)  # level ("75") -> seconds to its first validation
    best: dict = field(default_factory=dict)  # top1, at_s and epoch of the best validation so far

    def elapsed(self) -> float:
        return self.before_s + time.perf_counter() - self.began

    def add(self, top1: float, epoch: int) -> float:
        """Record a validation's top-1; returns its time, in seconds since the run's start."""
        seconds = self.elapsed()
        for level in self.levels:
            if top1 >= level:
                self.reached.setdefault(f"{level:g}", seconds)
        if not self.best or top1 > self.best["top1"]:
            self.best = {"top1": top1, "at_s": seconds, "epoch": epoch}
        return seconds

    def record(self) -> dict:
        return {"time_to_top1_s": dict(self.reached), "best_top1": dict(self.best)}

    def state_dict(self) -> dict:
        return {"elapsed_s": self.elapsed(), **self.record()}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.before_s = state["elapsed_s"]
            self.reached, self.best = dict(state["time_to_top1_s"]), dict(state["best_top1"])


def time_to_accuracy(levels: Sequence, began: float | None = None) -> TimeToAccuracy:
    """train.top1_levels checked: numbers from 0 to 100, sorted; `began`: the run's start (default: now)."""
    if not all(isinstance(level, (int, float)) and not isinstance(level, bool) and 0 < level <= 100
               for level in levels):
        raise ConfigError(f"train.top1_levels={list(levels)} must be percentages above 0 and up to 100, such as "
                          "[50,75,90]")
    return TimeToAccuracy(sorted(float(level) for level in levels), time.perf_counter() if began is None else began)
