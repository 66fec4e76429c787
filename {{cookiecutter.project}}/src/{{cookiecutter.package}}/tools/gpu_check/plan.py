"""What the GPU check runs, in order, and whether each run still fits the time at hand (gpu_check.minutes)."""
import math
import time

from omegaconf import DictConfig

from ...core.errors import ConfigError
from ..trials import Trial

SECTIONS = ("common", "ceiling", "pipelines", "models", "steps", "split_off", "bench")  # the report reads each


def check_sections(cfg: DictConfig) -> None:
    left_out = [section for section in SECTIONS if section not in cfg.gpu_check]
    if left_out:
        raise ConfigError(f"~gpu_check.{left_out[0]}: the report is built of every section; leave out entries of "
                          "gpu_check.pipelines, gpu_check.models or gpu_check.steps instead, such as "
                          "~gpu_check.steps.compile")


def planned(cfg: DictConfig) -> list[tuple[str, Trial]]:
    """Every training run of the check, with its section, in the order they run: the ceiling and the real pipelines
    beside it, each model's step in each way, then the timing split's cost (the ceiling without it, and again)."""
    check = cfg.gpu_check

    def trial(name: str, *overrides: str) -> Trial:
        return Trial(name, dict(override.partition("=")[::2] for override in [*check.common, *overrides]))

    return [("ceiling", trial("ceiling", *check.ceiling)),
            *(("pipeline", trial(name, *check.ceiling, *overrides)) for name, overrides in check.pipelines.items()),
            *(("compute", trial(f"{model}/{step}", *model_overrides, *step_overrides))
              for model, model_overrides in check.models.items() for step, step_overrides in check.steps.items()),
            ("split", trial("split_off", *check.ceiling, *check.split_off)),
            ("split", trial("ceiling_again", *check.ceiling))]


def kind(trial: Trial) -> str:
    """The kind of run whose duration predicts this one's: compiling takes minutes that an eager run does not."""
    return "compiled" if trial.change.get("model.compile") == "true" else "run"


class Budget:
    """The time at hand, and how long a run of each kind takes: gpu_check.expect_s until one of that kind has run
    here, then the longest that did."""

    def __init__(self, minutes: float | None, expect_s: dict[str, float]):
        self.deadline = math.inf if minutes is None else time.monotonic() + 60 * minutes
        self.expected, self.measured = dict(expect_s), {}

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self, run_timeout_s: float) -> float:
        """A run's time limit: gpu_check.run_timeout_s, or what is left of the time at hand where that is less."""
        return max(1.0, min(run_timeout_s, self.seconds_left()))

    def skip(self, kind: str) -> str | None:
        """Why a run of `kind` is not started, in one line, where it would not end within the time left; else None."""
        expected, left = self.measured.get(kind, self.expected[kind]), self.seconds_left()
        if expected <= left:
            return None
        source = "the longest of them here" if kind in self.measured else f"gpu_check.expect_s.{kind}"
        return (f"skipped: {max(0.0, left):.0f} s of gpu_check.minutes left, and a {kind} run takes about "
                f"{expected:.0f} s ({source})")

    def took(self, kind: str, seconds: float) -> None:
        self.measured[kind] = max(self.measured.get(kind, 0.0), seconds)
