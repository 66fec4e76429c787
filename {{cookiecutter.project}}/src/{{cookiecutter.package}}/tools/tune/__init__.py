"""tune's parts: plan.py (what to try, in which order), statistics.py (noise and margins), search.py (the search)
and outputs.py (what it writes). The command is the package's tune.py.

Every trial is the training command with the given overrides, a candidate change and `tune.steps` steps: the
same code, clock, data and model (trials.py). The start is trialled `tune.repeats` times to measure the noise:
the standard deviation of repeated trials, pooled over every configuration trialled more than once. A
configuration replaces the best so far only when the mean of two or more of its trials beats the best's by
CONFIDENCE standard errors of the difference, and by `tune.min_gain` at least. Budget the plan leaves goes
to more trials of the best and of every configuration whose mean might still beat it: separate runs of one
configuration differ more than the windows within one run. Candidates come from the verdict: the
switches its suggestions name first, then their neighbours, side by side of the step, the sides by what they can
gain (plan.py); a trial clearly slower than the best is stopped early. Each new best draws the plan again from its
verdict.
Only switches of speed are tried: never the model, batch size per process, learning rate, crop or augmentation.
A packed format is tried when its pack exists; otherwise it is built only with tune.allow_pack=true, and
proposed with the command that builds it. The run folder gets tune.md, tune.csv, tune.png and, where a change
beat the start, experiment/tuned.yaml and command.txt, the command that trains with the result.
"""
import logging
from pathlib import Path

from omegaconf import DictConfig

from ... import options
from ...core.errors import ConfigError
from ..trials import Ranks, Trials, as_overrides, follow
from . import search
from .outputs import write_outputs
from .plan import pack_offer

log = logging.getLogger(__name__)


def tune(cfg: DictConfig, run_dir: Path, given: list[str], ranks: Ranks) -> None:
    """Rank 0: search, write, say the result; every rank runs the trials."""
    settings = cfg.tune
    if settings.steps < 2 * settings.log_every:
        raise ConfigError(f"tune.steps={settings.steps} leaves no measured window after the first "
                          f"(tune.log_every={settings.log_every}): make it at least {2 * settings.log_every}")
    # The start's trials take a minute or more before their first line: say at once what is coming.
    log.info("tune: the start (%s) %d times, to measure the noise, then the speed switches its verdict names; "
             "%d steps a trial, within %.1f minutes (tune.budget_min); a line per trial as it ends",
             " ".join(given) or "the defaults", settings.repeats, settings.steps, settings.budget_min)
    trials = Trials(given, run_dir, settings.steps, settings.log_every, 60 * settings.budget_min, ranks)
    try:
        result = search.search(cfg, trials, lambda summary: pack_offer(cfg, summary, ranks))
    finally:
        trials.finish()
    before_after, command, table = write_outputs(result, run_dir, given)
    trained_with = f"train with it: {command}\n" if command else ""
    files = ", ".join(name for name in ("tune.md", "tune.csv", "tune.png", "experiment/tuned.yaml", "command.txt")
                      if (run_dir / name).exists())
    log.info("\n%s\n\n%s\n%s%swritten: %s (%s)\n"
             "Only speed switches were tried: the model, batch size, learning rate, crop and augmentation are "
             "unchanged.", table, before_after, "".join(f"not tried: {' '.join(as_overrides(change))}: {why}\n"
                                                        for change, why in result["left_out"]), trained_with, run_dir,
             files)


def run(cfg: DictConfig, run_dir: Path, given: list[str]) -> None:
    """The command's body on every process of the tune job: rank 0 tunes, the others follow its trials."""
    options.check(cfg)
    ranks = Ranks(timeout_s=60 * cfg.tune.budget_min + 300)  # longer than any trial
    try:
        if ranks.rank == 0:
            tune(cfg, run_dir, given, ranks)
        else:
            follow(ranks)
    finally:
        ranks.close()
