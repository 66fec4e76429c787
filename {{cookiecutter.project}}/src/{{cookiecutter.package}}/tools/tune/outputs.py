"""What tune writes: tune.csv, tune.md, tune.png and, where a change beat the start, experiment/tuned.yaml and
command.txt."""
import csv
import textwrap
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from ... import options
from ...core.charts import pyplot_for
from ..tables import markdown_table
from ..trials import Trial, as_overrides
from .statistics import CONFIDENCE, Config

COLUMNS = ("trial", "overrides", "images_per_s", "data_frac", "host_frac", "bound", "vs_start", "kept", "note")


def tuned_overlay(kept: dict[str, str], base: str | None, start_rate: float, best_rate: float, device: str) -> str:
    """An experiment file: the recipe tuned from (`base`, if any) first, then group choices as
    `override /group: option`, then the other keys."""
    groups = {key: value for key, value in kept.items() if (options.CONF / key).is_dir()}
    values = OmegaConf.to_container(OmegaConf.from_dotlist(as_overrides(
        {key: value for key, value in kept.items() if key not in groups})))
    defaults = [*([base] if base else []), *({f"override /{key}": value} for key, value in groups.items())]
    body = {**({"defaults": defaults} if defaults else {}), **values}
    header = (f"# @package _global_\n# Found by python -m {options.PACKAGE}.tune on {device}: {start_rate:.1f} -> "
              f"{best_rate:.1f} images/s. Only speed switches; what is learned is unchanged.\n")
    return header + yaml.safe_dump(body, sort_keys=False)


def nothing_beat(result: dict) -> str:
    """The line for a search whose best is the start: how close the fastest change came, and what it had to beat."""
    start, noise = result["start"], f"{100 * result['noise']:.1f}%"
    if result["closest"] is None:
        return (f"nothing beat the start: no change was measured (trials of one configuration differ by {noise}, "
                f"one standard deviation)")
    closest, needed = result["closest"]
    trials = "its one trial" if len(closest.measured) == 1 else f"the mean of {len(closest.measured)} trials"
    ran, had = closest.rate / start.rate, 1 + needed
    # as many decimals as tell the two apart, so that the line never reads "ran x1.41 where it had to run x1.41"
    digits = next((digits for digits in range(2, 6) if f"{ran:.{digits}f}" != f"{had:.{digits}f}"), 6)
    return (f"nothing beat the start: the fastest change, {' '.join(as_overrides(closest.settings))}, ran "
            f"x{ran:.{digits}f} the start ({trials}), where a change had "
            f"to run x{had:.{digits}f}: {CONFIDENCE:.0f} standard errors of the {noise} noise between trials of one "
            "configuration, and tune.min_gain at least")


def write_outputs(result: dict, run_dir: Path, given: list[str]) -> tuple[str, str | None, str]:
    """tune.csv, tune.md, tune.png and, where a change beat the start, experiment/tuned.yaml and command.txt; the
    before/after line, the command (None where nothing beat the start) and the table."""
    start, best = result["start"], result["best"]
    rows = [{"trial": trial.name, "overrides": " ".join(as_overrides(trial.change)) or "(start)",
             "images_per_s": round(trial.figures.get("images_per_s", 0.0), 1),
             "data_frac": round(trial.figures.get("data_frac", 0.0), 3),
             "host_frac": round(trial.figures.get("host_frac", 0.0), 3),
             "bound": trial.summary.bound if trial.summary else "",
             "vs_start": round(trial.figures.get("images_per_s", 0.0) / start.rate, 2),
             "kept": "yes" if trial.kept else "", "note": trial.note} for trial in result["trials"]]
    with open(run_dir / "tune.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    device = start.last.summary.env["device"]
    chart(result["trials"], run_dir / "tune.png")
    before, after = start.last.summary, best.last.summary
    before_after = (f"before: {start.rate:.1f} images/s, {before.bound}-bound (data wait "
                    f"{100 * before.data_frac:.0f}%); after: {best.rate:.1f} images/s (mean of {len(best.measured)} "
                    f"trials), {after.bound}-bound "
                    f"(data wait {100 * after.data_frac:.0f}%): x{best.rate / start.rate:.2f}")
    if best is start:
        before_after = f"{nothing_beat(result)}; keep this configuration: {start.rate:.1f} images/s, {before.bound}-bound"
    for settings, gain in result.get("unconfirmed", []):
        before_after += (f"; {' '.join(as_overrides(settings))} ran x{gain:.2f} that in its one trial, and the budget "
                         "ended before a second could confirm it: raise tune.budget_min")
    command = None if best is start else write_command(best, start.rate, run_dir, given, device)
    table = markdown_table(
        ["trial", "overrides added", "images/s", "data wait", "host", "bound", "× start", "kept", "note"],
        [[row["trial"], row["overrides"], row["images_per_s"], f"{100 * row['data_frac']:.0f}%",
          f"{100 * row['host_frac']:.0f}%", row["bound"], f"{row['vs_start']:.2f}", row["kept"], row["note"]]
         for row in rows])
    left_out = [f"- `{' '.join(as_overrides(change))}`: {why}" for change, why in result["left_out"]]
    offer = result["offer"]
    left_out_offer = offer is not None and any(change == offer.change for change, _ in result["left_out"])
    proposal = [] if offer is None or offer.ready or left_out_offer else [
        f"Decoding once may help further: `{offer.command}`, then tune again (or pass tune.allow_pack=true).", ""]
    (run_dir / "tune.md").write_text("\n".join([
        f"# tune on {device}", "", f"Given: `{' '.join(given) or '(defaults)'}`", "",
        f"Noise: trials of one configuration differ by {100 * result['noise']:.1f}% (one standard deviation, pooled "
        f"over the {result['repeated']} configurations trialled more than once). A configuration replaces the best "
        f"so far only when the mean of two or more of its trials is faster by {CONFIDENCE:.0f} standard errors of "
        "the difference, and by tune.min_gain at least.",
        "", *table, "", before_after, "",
        *(["Not tried:", *left_out, ""] if left_out else []), *proposal,
        *([f"Train with it: `{command}`", ""] if command else []),
        "Only speed switches were tried: the model, batch size per process, learning rate, crop size and "
        "augmentation are unchanged.", ""]))
    return before_after, command, "\n".join(table)


def write_command(best: Config, start_rate: float, run_dir: Path, given: list[str], device: str) -> str:
    """experiment/tuned.yaml, on top of the recipe tuned from, and command.txt, the command that trains with it."""
    base = next((override.split("=", 1)[1] for override in given if override.startswith("experiment=")), None)
    (run_dir / "experiment").mkdir(exist_ok=True)
    (run_dir / "experiment/tuned.yaml").write_text(tuned_overlay(best.settings, base, start_rate, best.rate, device))
    keep = [override for override in given
            if override.split("=")[0].lstrip("+~") not in best.settings and not override.startswith("experiment=")]
    command = " ".join([f"python -m {options.PACKAGE}.train", f"--config-dir {run_dir}", "experiment=tuned", *keep])
    (run_dir / "command.txt").write_text(command + "\n")
    return command


def chart_label(trial: Trial) -> str:
    """A trial's overrides, a path by its last part, wrapped to fit beside the bars; whether they were kept."""
    shown = {key: Path(value).name if key.endswith(".path") else value for key, value in trial.change.items()}
    text = " ".join(as_overrides(shown)) or "start"
    return f"{trial.name}: " + "\n".join(textwrap.wrap(text + (" (kept)" if trial.kept else ""), 40))


def chart(trials: list[Trial], path: Path) -> None:
    if (plt := pyplot_for(path)) is None:
        return
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
