"""The noise of repeated trials, and the margins a configuration must clear against it."""
import math
import statistics
from dataclasses import dataclass, field

from omegaconf import DictConfig

from ..trials import Judge, Progress, Trial, first_timed

MAX_SAMPLES = 4  # trials of one configuration at most, when the budget left settles a close call
CONFIDENCE = 2.0  # standard errors a gain must clear: a 2-3% chance that noise alone clears it


@dataclass
class Config:
    """A configuration tried: its changes on top of the given overrides, and its trials."""
    settings: dict[str, str]
    trials: list[Trial] = field(default_factory=list)

    @property
    def measured(self) -> list[Trial]:
        return [trial for trial in self.trials if trial.summary]

    @property
    def rate(self) -> float:
        """Images/s, the mean of its trials."""
        return statistics.fmean(trial.rate for trial in self.measured) if self.measured else 0.0

    @property
    def last(self) -> Trial:
        """Its last measured trial, whose verdict plans the next moves."""
        return self.measured[-1]


def noise(configs) -> float:
    """Run-to-run noise as a share of the rate: the standard deviation of repeated trials, pooled over every
    configuration trialled more than once (the start, tune.repeats times, to begin with); 0 before any repeat."""
    squares, freedom = 0.0, 0
    for config in configs:
        rates = [trial.rate for trial in config.measured]
        if len(rates) > 1:
            average = statistics.fmean(rates)
            squares += sum((rate / average - 1) ** 2 for rate in rates)
            freedom += len(rates) - 1
    return math.sqrt(squares / freedom) if freedom else 0.0


def margin(best: Config, rival: Config, sigma: float, min_gain: float) -> float:
    """The share by which `rival`'s mean must beat `best`'s: CONFIDENCE standard errors of their difference."""
    return max(min_gain, CONFIDENCE * sigma * math.sqrt(1 / len(best.measured) + 1 / len(rival.measured)))


def upper_bound(config: Config, sigma: float) -> float:
    """The rate its mean might reach with more trials: CONFIDENCE standard errors above it."""
    return config.rate * (1 + CONFIDENCE * sigma / math.sqrt(len(config.measured)))


def slower_than(best: Config, start: Config, sigma: float, settings: DictConfig) -> Judge:
    """Stops a trial as soon as it is clearly slower than `best`: its first timed window below the best's rate by
    more than the noise allows, or its training (after a set-up of its own) twice as long as the start's.

    One window spreads about sqrt(windows per trial) times more than a trial's mean, the noise measured."""
    windows = max(1, settings.steps // settings.log_every - 1)
    floor = best.rate * (1 - max(2 * settings.min_gain, CONFIDENCE * sigma * math.sqrt(windows)))
    start_training_s = statistics.fmean(trial.seconds - trial.setup_s for trial in start.measured)

    def judge(progress: Progress, elapsed: float) -> str | None:
        timed = first_timed(progress)
        if timed and timed["images_per_s"] < floor:
            return (f"its first timed window ran at {timed['images_per_s']:.1f} images/s, below {floor:.1f}: the best "
                    f"so far ({best.rate:.1f}) less the noise allowed")
        setup_s = progress.setup_s
        if setup_s and elapsed - setup_s > 2 * start_training_s:
            return (f"its training took longer than {2 * start_training_s:.0f} s, twice the start's, without a timed "
                    "window as fast as the best")
        return None

    return judge
