"""Finished runs side by side, behind `python -m <package>.compare`."""
from pathlib import Path

from ..core.errors import ClearError
from ..diagnosis.summary import Summary
from .tables import markdown_table

# The fields the table shows that every version wrote; those kept later (train_top1, time_to_top1_s) are shown
# where present, so compare reads the summaries of older versions too.
SHOWN = ("overrides", "images_per_s", "data_frac", "host_frac", "bound", "env", "val_top1")


def job_order(path: Path) -> tuple[str, ...]:
    """Hydra's job folders 0, 1, ..., 10 in numeric order."""
    return tuple(part.zfill(9) if part.isdigit() else part for part in path.parts)


def load_runs(folders: list[Path]) -> list[tuple[dict[str, str], Summary]]:
    """(overrides as key -> value, summary) for every summary.json under `folders`, in job order."""
    runs = []
    for folder in folders:
        paths = sorted(folder.glob("**/summary.json"), key=lambda path: job_order(path.relative_to(folder)))
        if not paths:
            raise ClearError(f"no summary.json under {folder}: is it the folder of finished runs?")
        for path in paths:
            summary = Summary.read(path, needs=SHOWN)
            runs.append((dict(override.partition("=")[::2] for override in summary.overrides), summary))
    return runs


def percent(value: float | None) -> str:
    return f"{value:.1f}%" if value is not None else ""


def levels_reached(runs: list[tuple[dict[str, str], Summary]]) -> list[str]:
    """Every top-1 level some run reached (summary.json's time_to_top1_s), lowest first."""
    return sorted({level for _, summary in runs for level in summary.time_to_top1_s}, key=float)


def table(runs: list[tuple[dict[str, str], Summary]]) -> str:
    keys = list(dict.fromkeys(key for overrides, _ in runs for key in overrides))
    varying = [key for key in keys if len({overrides.get(key) for overrides, _ in runs}) > 1]
    shared = [f"{key}={runs[0][0][key]}" for key in keys if key not in varying and key in runs[0][0]]
    first = runs[0][1].images_per_s
    trained = any(summary.train_top1 is not None for _, summary in runs)
    levels = levels_reached(runs)  # time to accuracy: each run's seconds to each level, blank where it fell short
    header = [*varying, "images/s", "data wait", "host", "bound", "× first", "val top-1",
              *(["train top-1"] if trained else []), *(f"s to {level}%" for level in levels)]
    rows = [[overrides.get(key, "") for key in varying]
            + [f"{summary.images_per_s:.1f}", f"{100 * summary.data_frac:.0f}%",
               f"{100 * summary.host_frac:.0f}%", summary.bound, f"{summary.images_per_s / first:.2f}",
               f"{summary.val_top1:.1f}%", *([percent(summary.train_top1)] if trained else []),
               *(f"{summary.time_to_top1_s[level]:.0f}" if level in summary.time_to_top1_s else "" for level in levels)]
            for overrides, summary in runs]
    devices = sorted({summary.env["device"] for _, summary in runs})
    return "\n".join([f"on {', '.join(devices)}; every run: {' '.join(shared) or '(no shared overrides)'}", "",
                      *markdown_table(header, rows)])
