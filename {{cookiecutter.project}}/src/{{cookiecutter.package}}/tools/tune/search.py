"""The search: the start, then the candidates the plan gives, each configuration kept only when it beats the best so
far by more than the noise allows, and a trial stopped as soon as it is clearly slower."""
import logging

from omegaconf import DictConfig, OmegaConf

from ...core.errors import ClearError
from ..trials import Judge, Trial, Trials, as_overrides
from .plan import Group, PackOffer, moves
from .statistics import MAX_SAMPLES, Config, margin, noise, slower_than, upper_bound

log = logging.getLogger(__name__)


def changes_something(change: dict[str, str], best: Config, cfg: DictConfig) -> bool:
    """Whether `change` sets anything to other than it is in the best configuration so far."""
    def now(key: str) -> str:
        if key in best.settings:
            return best.settings[key]
        choices = best.last.summary.choices
        return choices[key] if key in choices else str(OmegaConf.select(cfg, key)).lower()

    return any(now(key) != value for key, value in change.items())


def fresh_moves(best: Config, cfg: DictConfig, offer: PackOffer | None) -> tuple[list[Group], list[tuple[dict, str]]]:
    """`moves` from the best so far, each change once (the verdict and tune's own neighbours may both name it), and
    none that sets a key to the value it has already."""
    groups, left_out = moves(best.last.summary, cfg, offer)
    named: list[dict[str, str]] = []

    def new(change: dict[str, str]) -> bool:
        if change in named or not changes_something(change, best, cfg):
            return False
        named.append(change)
        return True

    return ([kept for group in groups if (kept := [change for change in group if new(change)])],
            [(change, why) for change, why in left_out if new(change)])


def search(cfg: DictConfig, trials: Trials, offer_for) -> dict:
    """Trial the start, then candidates as `moves` plans them. A configuration becomes the best when the mean of
    two or more of its trials beats the best's by more than the noise allows; one clearly slower is stopped
    early. The budget the plan leaves goes to more trials of the best and of each configuration whose mean might
    still beat it, fewest trials first."""
    settings = cfg.tune
    start = Config({})
    configs, path = {(): start}, [start]  # every configuration tried; the bests, in turn

    def run(config: Config, judge: Judge | None = None) -> None:
        config.trials.append(log_trial(trials.run(config.settings, judge)))

    for _ in range(settings.repeats):
        run(start)
    if not start.measured:
        raise ClearError(f"the starting configuration does not train: {start.trials[0].note}")
    best, offer = start, offer_for(start.last.summary)
    if offer is not None and not offer.ready and not settings.allow_pack:
        log_trial(trials.record(Trial(str(len(trials.done)), offer.change, note="proposed, not built (or pass "
                                                                            f"tune.allow_pack=true): {offer.command}")))
    plan, left_out = fresh_moves(best, cfg, offer)

    def ahead(rivals: list[Config], sigma: float) -> Config | None:
        """The fastest rival, where its mean beats the best's by the margin the noise asks."""
        return rivals[0] if rivals and rivals[0].rate > best.rate * (1 + margin(best, rivals[0], sigma,
                                                                                     settings.min_gain)) else None

    while trials.time_left():
        sigma = noise(configs.values())
        judge = slower_than(best, start, sigma, settings)
        rivals = sorted((config for config in configs.values()  # one that failed or was stopped once is no rival
                         if config is not best and config.trials and all(trial.summary for trial in config.trials)),
                        key=lambda config: config.rate, reverse=True)
        rival = ahead(rivals, sigma)
        if rival is not None:
            if len(rival.measured) < 2:  # one fast trial may be luck
                run(rival, judge)
                continue
            best = rival
            path.append(best)
            plan, left_out = fresh_moves(best, cfg, offer)  # what lost before may win on top of it
        elif plan:
            for change in plan.pop(0):
                overrides = {**best.settings, **change}
                key = tuple(sorted(overrides.items()))
                if key in configs or not trials.time_left():
                    continue
                configs[key] = config = Config(overrides)
                unbuilt = offer is not None and change == offer.change and not offer.ready
                note = offer.build(trials.seconds_left() - trials.longest) if unbuilt else None
                if note:
                    config.trials.append(log_trial(trials.record(Trial(str(len(trials.done)), config.settings, note=note))))
                else:
                    run(config, judge)
        else:  # the plan is done: more trials for what could still beat the best, and for the best itself
            hopeful = [config for config in rivals if upper_bound(config, sigma) > best.rate]
            unsettled = [config for config in ([best] if hopeful else []) + hopeful if len(config.measured) < MAX_SAMPLES]
            if not unsettled:
                break
            run(min(unsettled, key=lambda config: (len(config.measured), -upper_bound(config, sigma))))
    # The budget may end on the trial that confirms a rival: it wins as it would have at the next turn.
    rivals = sorted((config for config in configs.values() if config is not best and len(config.measured) >= 2
                     and all(trial.summary for trial in config.trials)), key=lambda config: config.rate, reverse=True)
    if (rival := ahead(rivals, noise(configs.values()))) is not None:
        best = rival
        path.append(best)
    for config in path[1:]:
        for trial in config.measured:
            trial.kept = True
    unreached = [(change, "not reached: the budget ran out first") for group in plan for change in group
                 if tuple(sorted({**best.settings, **change}.items())) not in configs]
    repeated = sum(len(config.measured) > 1 for config in configs.values())
    sigma = noise(configs.values())
    unconfirmed = [(config.settings, config.rate / best.rate) for config in configs.values()
                   if len(config.measured) == 1 and config is not best and all(trial.summary for trial in config.trials)
                   and config.rate > best.rate * (1 + margin(best, config, sigma, settings.min_gain))]
    closest = max((config for config in configs.values() if config is not best and config.measured),
                  key=lambda config: config.rate, default=None)
    return {"trials": trials.done, "noise": sigma, "repeated": repeated, "start": start, "best": best,
            "offer": offer, "left_out": left_out + unreached, "unconfirmed": unconfirmed,
            "closest": closest and (closest, margin(best, closest, sigma, settings.min_gain))}


def log_trial(trial: Trial) -> Trial:
    log.info("trial %s %s: %s", trial.name, " ".join(as_overrides(trial.change)) or "(start)",
             f"{trial.rate:.1f} images/s, {trial.summary.bound}-bound" if trial.summary else trial.note)
    return trial
