"""From the bottleneck to a faster configuration, measured: short trials of the switches a run's advice names.

    python -m {{ cookiecutter.package }}.tune model.name=resnet18 data.crop_size=64 loader.num_workers=0 decoder=pil
    torchrun --standalone --nproc-per-node=8 -m {{ cookiecutter.package }}.tune +experiment=gpu_fast data=imagenet data.root=...

Every trial is the training command with the given overrides, a candidate change and `tune.steps` steps: the
same code, clock, data and model (trials.py). The start is trialled `tune.repeats` times to measure the noise:
the standard deviation of repeated trials, pooled over every configuration trialled more than once. A
configuration replaces the best so far only when the mean of two or more of its trials beats the best's by
CONFIDENCE standard errors of the difference, and by `tune.min_gain` at least. Budget the plan leaves goes
to more trials of the best and of every configuration whose mean might still beat it: separate runs of one
configuration differ more than the windows within one run. Candidates come from the verdict:
the switches its advice names first, then their neighbours (workers, decoders, a packed format, prefetchers,
staging when data-bound; precision and layout, and on a GPU compile, cuDNN autotuning and the CUDA-stream
prefetcher, whatever the bound). Each new best draws the plan again from its verdict.
Only switches of speed are tried: never the model, batch size per process, learning rate, crop or augmentation.
A packed format is tried when its pack exists; otherwise it is built only with tune.allow_pack=true, and
proposed with the command that builds it. The run folder gets experiment/tuned.yaml, tune.md, tune.csv,
tune.png and command.txt, the command that trains with the result.
"""
import csv
import functools
import hashlib
import logging
import math
import os
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import psutil
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import options
from .checkpoint import bytes_in
from .config import ClearError, ConfigError, build, check
from .data import TrainCrop
from .format import META
from .format.folder import open_tree
from .pack import Convert, pack
from .diagnosis import SIDES, faster_precision
from .hardware import Hardware
from .trials import Judge, Progress, Ranks, Trial, Trials, as_overrides, first_timed, follow

log = logging.getLogger(__name__)

COLUMNS = ("trial", "overrides", "images_per_s", "data_frac", "host_frac", "bound", "vs_start", "kept", "note")
SAMPLE = 16  # images converted to time a pack before building it


class PackOffer:
    """Decoding once, offline: the data set as format=tensor at the side the crops need (TrainCrop), in
    tune.pack_dir. Tried when that pack exists; built only when allowed and it fits in the budget."""

    def __init__(self, root: Path, crop_size: int, pack_dir: str, on_error: str):
        self.root, self.side, self.on_error = root, TrainCrop(crop_size).full_detail_side(), on_error
        digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:8]
        self.path = Path(pack_dir).expanduser() / f"{root.name}-{digest}-tensor-{self.side}"
        self.change = {"format": "tensor", "decoder": "none", "format.path": str(self.path)}
        self.command = (f"python -m {__package__}.pack data.root={root} format=tensor "
                        f"pack.short_side={self.side} pack.out={self.path}")

    @property
    def ready(self) -> bool:
        return (self.path / META).is_file()

    def build(self, seconds: float) -> str | None:
        """Write the pack if it can be done in `seconds`; why not, or None once it is there."""
        train, val, _ = open_tree(self.root)
        convert, began = Convert(True, self.side, 90), time.monotonic()
        for path in train.paths[:SAMPLE]:
            convert(path)
        workers = os.cpu_count() or 1
        needed = (len(train) + len(val)) * (time.monotonic() - began) / min(SAMPLE, len(train)) / workers
        if needed > seconds:
            return f"building its pack would take about {needed:.0f} s, more than the {seconds:.0f} s left: {self.command}"
        try:
            pack(self.root, "tensor", self.path, self.side, 90, workers, False, self.on_error)
        except ClearError as err:
            return f"its pack could not be built: {err}"
        return None


def pack_offer(cfg: DictConfig, summary: dict, ranks: Ranks) -> PackOffer | None:
    """The pack to decode once, for a data-bound run that decodes JPEGs from a folder on one node."""
    if summary["bound"] != "data" or options.facts("format", summary["choices"]["format"]).packed:
        return None
    single_node = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.size)) == ranks.size  # a pack on node 0 only
    source = build(cfg.data)
    if source.root is None or not single_node:
        return None
    return PackOffer(source.root, source.crop_size, cfg.tune.pack_dir, source.on_error)


def sweep(key: str, values, current: str | None = None) -> list[dict[str, str]]:
    return [{key: str(value)} for value in dict.fromkeys(values) if str(value) != str(current)]


Group = list[dict[str, str]]  # candidate changes trialled one after another before the best is reconsidered


def neighbours(summary: dict, cfg: DictConfig, hardware: Hardware, offer: PackOffer | None) -> dict[str, list[Group]]:
    """By the side of the step they shorten, the switches worth measuring beyond those the verdict names;
    only those this hardware can profit from."""
    choices, cores = summary["choices"], hardware.cores
    picked = {group: options.facts(group, option) for group, option in choices.items()
              if (options.CONF / group / f"{option}.yaml").is_file()}
    data: list[Group] = []
    if offer is not None and (offer.ready or cfg.tune.allow_pack):
        data.append([offer.change])
    # Workers waiting on reads are nearly free: up to twice the cores.
    data.append(sweep("loader.num_workers", [1, 2, cores, 2 * cores], cfg.loader.num_workers))
    if not picked["format"].holds_pixels:
        data.append(sweep("decoder", [name for name in options.options("decoder")
                                      if not (facts := options.facts("decoder", name)).takes_pixels
                                      and (hardware.on_gpu or not facts.gpu) and not facts.missing()],
                          choices["decoder"]))
    data += [[{"loader.persistent_workers": "true"}], [{"loader.prefetch_factor": "4"}],
             sweep("prefetcher", [name for name in options.options("prefetcher")
                                  if not (facts := options.facts("prefetcher", name)).ceiling
                                  and (hardware.on_gpu or not facts.gpu)], choices["prefetcher"])]
    if not picked["format"].packed and not picked["staging"].copies_to_ram and fits_in_ram(cfg):
        data += [[{"staging": option}] for option in options.having("staging", "copies_to_ram")]
    compute: list[Group] = []
    faster = faster_precision(hardware)
    if faster != "fp32":
        compute.append([{"precision": faster}])
    compute.append([{"model.channels_last": "true"}])  # measured, where the hardware facts do not settle it
    if hardware.on_gpu:  # on a CPU, compiling takes much of a short budget and seldom pays back within a trial
        compute += [[{"model.compile": "true"}], [{"cudnn": "benchmark"}],
                    *([{"prefetcher": option}] for option in options.having("prefetcher", "overlaps_copy"))]
    return {"data": data, "host": [], "compute": compute}


def moves(summary: dict, cfg: DictConfig, offer: PackOffer | None) -> tuple[list[Group], list[tuple[dict, str]]]:
    """Groups of candidate changes in the order they can gain, and the changes left out, each with why.

    Removing a side's share s of the step gains at most 1 / (1 - s): the data wait on a data-bound run, the
    compute share on a compute-bound one. The bound's side comes first, then the others by what they can
    gain; a side that cannot gain tune.min_gain is left out. Within a side, the switches the verdict names
    (the run's suggestions) come before the neighbours tune measures on its own. The verdict's withheld
    switches, which this hardware would run slower, are never tried.
    """
    hardware = Hardware.from_record(summary["hardware"])
    advised: dict[str, list[Group]] = {side: [] for side in SIDES}
    for suggestion in summary["suggestions"]:
        if suggestion["tunable"] and suggestion["value"] is not None:
            advised[suggestion["side"]].append([{suggestion["key"]: suggestion["value"], **suggestion["also"]}])
    found = neighbours(summary, cfg, hardware, offer)
    shares = {"data": summary["data_frac"], "host": summary["host_frac"]}
    shares["compute"] = max(0.0, 1 - shares["data"] - shares["host"])
    gains = {side: 1 / max(1e-9, 1 - share) for side, share in shares.items()}
    order = [summary["bound"], *sorted((side for side in SIDES if side != summary["bound"]), key=gains.get,
                                        reverse=True)]
    groups, left_out = [], [({held["key"]: held["value"]}, f"{held['why']} ({held['fact']})")
                            for held in summary.get("withheld", [])]
    for side in order:
        candidates = [group for group in advised[side] + found[side] if group]
        if side != summary["bound"] and gains[side] - 1 < cfg.tune.min_gain:
            left_out += [(change, f"{side}-side: removing all of the {side} share ({100 * shares[side]:.0f}%) gains "
                                  f"at most x{gains[side]:.2f}, less than tune.min_gain") for group in candidates
                         for change in group]
            continue
        groups += candidates
    return groups, left_out


def fits_in_ram(cfg: DictConfig) -> bool:
    try:
        root = build(cfg.data).root
    except ClearError:
        return False
    return root is not None and ram_would_hold(root)


@functools.cache  # moves() asks again at each new best: one walk of a large tree is enough
def ram_would_hold(root: Path) -> bool:
    return 0 < bytes_in(root) < psutil.virtual_memory().available / 4


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


def changes_something(change: dict[str, str], best: Config, cfg: DictConfig) -> bool:
    """Whether `change` sets anything to other than it is in the best configuration so far."""
    def now(key: str) -> str:
        if key in best.settings:
            return best.settings[key]
        choices = best.last.summary["choices"]
        return choices[key] if key in choices else str(OmegaConf.select(cfg, key)).lower()

    return any(now(key) != value for key, value in change.items())


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
        log_trial(trials.record(Trial(len(trials.done), offer.change, note="proposed, not built (or pass "
                                                                            f"tune.allow_pack=true): {offer.command}")))
    plan, left_out = moves(best.last.summary, cfg, offer)
    while trials.time_left():
        sigma = noise(configs.values())
        judge = slower_than(best, start, sigma, settings)
        rivals = sorted((config for config in configs.values()  # one that failed or was stopped once is no rival
                         if config is not best and config.trials and all(trial.summary for trial in config.trials)),
                        key=lambda config: config.rate, reverse=True)
        rival = rivals[0] if rivals else None
        needed = margin(best, rival, sigma, settings.min_gain) if rival is not None else 0.0
        if rival is not None and rival.rate > best.rate * (1 + needed):
            if len(rival.measured) < 2:  # one fast trial may be luck
                run(rival, judge)
                continue
            best = rival
            path.append(best)
            plan, left_out = moves(best.last.summary, cfg, offer)  # what lost before may win on top of it
        elif plan:
            for change in plan.pop(0):
                overrides = {**best.settings, **change}
                key = tuple(sorted(overrides.items()))
                if key in configs or not changes_something(change, best, cfg) or not trials.time_left():
                    continue
                configs[key] = config = Config(overrides)
                unbuilt = offer is not None and change == offer.change and not offer.ready
                note = offer.build(trials.seconds_left() - trials.longest) if unbuilt else None
                if note:
                    config.trials.append(log_trial(trials.record(Trial(len(trials.done), config.settings, note=note))))
                else:
                    run(config, judge)
        else:  # the plan is done: more trials for what could still beat the best, and for the best itself
            hopeful = [config for config in rivals if upper_bound(config, sigma) > best.rate]
            unsettled = [config for config in ([best] if hopeful else []) + hopeful if len(config.measured) < MAX_SAMPLES]
            if not unsettled:
                break
            run(min(unsettled, key=lambda config: (len(config.measured), -upper_bound(config, sigma))))
    for config in path[1:]:
        for trial in config.measured:
            trial.kept = True
    unreached = [(change, "not reached: the budget ran out first") for group in plan for change in group
                 if tuple(sorted({**best.settings, **change}.items())) not in configs
                 and changes_something(change, best, cfg)]
    repeated = sum(len(config.measured) > 1 for config in configs.values())
    return {"trials": trials.done, "noise": noise(configs.values()), "repeated": repeated, "start": start,
            "best": best, "offer": offer, "left_out": left_out + unreached}


def log_trial(trial: Trial) -> Trial:
    log.info("trial %d %s: %s", trial.number, " ".join(as_overrides(trial.change)) or "(start)",
             f"{trial.rate:.1f} images/s, {trial.summary['bound']}-bound" if trial.summary else trial.note)
    return trial


def tuned_overlay(kept: dict[str, str], base: str | None, start_rate: float, best_rate: float, device: str) -> str:
    """An experiment file: the recipe tuned from (`base`, if any) first, then group choices as
    `override /group: option`, then the other keys."""
    groups = {key: value for key, value in kept.items() if (options.CONF / key).is_dir()}
    values = OmegaConf.to_container(OmegaConf.from_dotlist(as_overrides(
        {key: value for key, value in kept.items() if key not in groups})))
    defaults = [*([base] if base else []), *({f"override /{key}": value} for key, value in groups.items())]
    body = {**({"defaults": defaults} if defaults else {}), **values}
    header = (f"# @package _global_\n# Found by python -m {__package__}.tune on {device}: {start_rate:.1f} -> "
              f"{best_rate:.1f} images/s. Only speed switches; what is learned is unchanged.\n")
    return header + (yaml.safe_dump(body, sort_keys=False) if body else "{}\n")


def write_outputs(result: dict, run_dir: Path, given: list[str]) -> tuple[str, str, str]:
    """tune.csv, tune.md, tune.png and experiment/tuned.yaml; the before/after line, the command and the table."""
    start, best = result["start"], result["best"]
    rows = [{"trial": trial.number, "overrides": " ".join(as_overrides(trial.change)) or "(start)",
             "images_per_s": round(trial.figures.get("images_per_s", 0.0), 1),
             "data_frac": round(trial.figures.get("data_frac", 0.0), 3),
             "host_frac": round(trial.figures.get("host_frac", 0.0), 3), "bound": trial.summary.get("bound", ""),
             "vs_start": round(trial.figures.get("images_per_s", 0.0) / start.rate, 2),
             "kept": "yes" if trial.kept else "", "note": trial.note} for trial in result["trials"]]
    with open(run_dir / "tune.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    device = start.last.summary["env"]["device"]
    base = next((override.split("=", 1)[1] for override in given if override.startswith("+experiment=")), None)
    (run_dir / "experiment").mkdir(exist_ok=True)
    (run_dir / "experiment/tuned.yaml").write_text(tuned_overlay(best.settings, base, start.rate, best.rate, device))
    chart(result["trials"], run_dir / "tune.png")
    before, after = start.last.summary, best.last.summary
    before_after = (f"before: {start.rate:.1f} images/s, {before['bound']}-bound (data wait "
                    f"{100 * before['data_frac']:.0f}%); after: {best.rate:.1f} images/s (mean of {len(best.measured)} "
                    f"trials), {after['bound']}-bound "
                    f"(data wait {100 * after['data_frac']:.0f}%): x{best.rate / start.rate:.2f}")
    if best is start:
        before_after = (f"no change beat the noise (trials of one configuration differ by {100 * result['noise']:.1f}%, "
                        f"one standard deviation): {start.rate:.1f} images/s, {before['bound']}-bound; keep this "
                        "configuration")
    keep = [override for override in given
            if override.split("=")[0].lstrip("+~") not in best.settings and not override.startswith("+experiment=")]
    command = " ".join([f"python -m {__package__}.train", f"--config-dir {run_dir}", "+experiment=tuned", *keep])
    (run_dir / "command.txt").write_text(command + "\n")
    header = ["trial", "overrides added", "images/s", "data wait", "host", "bound", "× start", "kept", "note"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
             *(f"| {row['trial']} | {row['overrides']} | {row['images_per_s']} | {100 * row['data_frac']:.0f}% | "
               f"{100 * row['host_frac']:.0f}% | {row['bound']} | {row['vs_start']:.2f} | {row['kept']} | {row['note']} |"
               for row in rows)]
    left_out = [f"- `{' '.join(as_overrides(change))}`: {why}" for change, why in result["left_out"]]
    offer = result["offer"]
    proposal = [] if offer is None or offer.ready else [
        f"Decoding once may help further: `{offer.command}`, then tune again (or pass tune.allow_pack=true).", ""]
    (run_dir / "tune.md").write_text("\n".join([
        f"# tune on {device}", "", f"Given: `{' '.join(given) or '(defaults)'}`", "",
        f"Noise: trials of one configuration differ by {100 * result['noise']:.1f}% (one standard deviation, pooled "
        f"over the {result['repeated']} configurations trialled more than once). A configuration replaces the best "
        f"so far only when the mean of two or more of its trials is faster by {CONFIDENCE:.0f} standard errors of "
        "the difference, and by tune.min_gain at least.",
        "", *table, "", before_after, "",
        *(["Not tried:", *left_out, ""] if left_out else []), *proposal, f"Train with it: `{command}`", "",
        "Only speed switches were tried: the model, batch size per process, learning rate, crop size and "
        "augmentation are unchanged.", ""]))
    return before_after, command, "\n".join(table)


def chart_label(trial: Trial) -> str:
    """A trial's overrides, a path by its last part, wrapped to fit beside the bars; whether they were kept."""
    shown = {key: Path(value).name if key.endswith(".path") else value for key, value in trial.change.items()}
    text = " ".join(as_overrides(shown)) or "start"
    return f"{trial.number}: " + "\n".join(textwrap.wrap(text + (" (kept)" if trial.kept else ""), 40))


def chart(trials: list[Trial], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [trial for trial in trials if trial.figures]
    labels = [chart_label(trial) for trial in measured]
    figure, axes = plt.subplots(figsize=(10, 0.6 * len(measured) + 1.5))
    left = [0.0] * len(measured)
    for part, colour in (("data_ms", "tab:red"), ("host_ms", "tab:orange"), ("compute_ms", "tab:blue")):
        widths = [trial.figures[part] for trial in measured]
        axes.barh(labels, widths, left=left, color=colour, label=part.removesuffix("_ms"))
        left = [a + b for a, b in zip(left, widths)]
    axes.invert_yaxis()
    axes.set_xlabel("ms per step")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def tune(cfg: DictConfig, run_dir: Path, given: list[str], ranks: Ranks) -> None:
    """Rank 0: search, write, say the result; every rank runs the trials."""
    settings = cfg.tune
    if settings.steps < 2 * settings.log_every:
        raise ConfigError(f"tune.steps={settings.steps} leaves no measured window after the first "
                          f"(tune.log_every={settings.log_every}): make it at least {2 * settings.log_every}")
    trials = Trials(given, run_dir, settings.steps, settings.log_every, 60 * settings.budget_min, ranks)
    try:
        result = search(cfg, trials, lambda summary: pack_offer(cfg, summary, ranks))
    finally:
        trials.finish()
    before_after, command, table = write_outputs(result, run_dir, given)
    log.info("\n%s\n\n%s\n%s\ntrain with it: %s\nwritten: %s (tune.md, tune.csv, tune.png, experiment/tuned.yaml)\n"
             "Only speed switches were tried: the model, batch size, learning rate, crop and augmentation are "
             "unchanged.", table, before_after, "".join(f"not tried: {' '.join(as_overrides(change))}: {why}\n"
                                                        for change, why in result["left_out"]), command, run_dir)


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="tune")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    given = [override for override in HydraConfig.get().overrides.task
             if not override.startswith(("tune.", "hydra."))]
    ranks = None
    try:
        check(cfg)
        ranks = Ranks(timeout_s=60 * cfg.tune.budget_min + 300)  # longer than any trial
        if ranks.rank == 0:
            tune(cfg, run_dir, given, ranks)
        else:
            follow(ranks)
    except ClearError as err:
        sys.exit(f"error: {err}")
    finally:
        if ranks is not None:
            ranks.close()


if __name__ == "__main__":
    main()
