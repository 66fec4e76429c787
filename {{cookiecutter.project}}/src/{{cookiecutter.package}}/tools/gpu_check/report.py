"""The GPU check's records: gpu_check.csv, rewritten as each run ends, and report.md, written at the end."""
import csv
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch
from omegaconf import DictConfig

from ...core.files import write_atomic
from ...diagnosis.report import environment
from ...options import PACKAGE
from ..tables import markdown_table
from ..trials import Trial, as_overrides

ENVIRONMENT = ("device", "driver", "cuda", "cudnn", "torch", "torchvision", "nvidia-dali-cuda130")
COLUMNS = ("section", "name", "images_per_s", "vs_ceiling", "vs_eager", "vs_pillow", "data_frac", "host_frac",
           "bound", "status", "command", *ENVIRONMENT)


def status(trial: Trial) -> str:
    if trial.note:
        return trial.note if trial.note.startswith("skipped: ") else f"failed: {trial.note}"
    return "ok" if trial.summary else "not run yet"


def test_results(path: str | None) -> str:
    if not path:
        return "not run (gpu_check.tests_xml not given)"
    try:
        suite = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as err:
        return f"unreadable: {path} ({err})"
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return (f"{passed} passed, {counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped "
            f"(pytest -m gpu; {path})")


def driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception as err:  # noqa: BLE001 - NVML raises its own error types, or is missing: the report says so
        return f"unknown ({err.__class__.__name__})"


def describe(device: torch.device) -> dict[str, str]:
    return {**environment(device), "driver": driver_version(), "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version())}


def environment_cells(env: dict[str, str]) -> dict[str, str]:
    """The machine's columns of a row, the same in every row of gpu_check.csv."""
    return {key: env.get(key, "") for key in ENVIRONMENT}


def eager_rate(runs: dict[str, Trial], name: str) -> float:
    """The rate of the eager run of `name`'s model (`<model>/<step>`), 0 where it has none."""
    eager = runs.get(f"{name.split('/')[0]}/eager")
    return eager.rate if eager else 0.0


def run_rows(runs: list[tuple[str, Trial]], env: dict[str, str]) -> list[dict]:
    by_name = {run.name: run for _, run in runs}
    ceiling = by_name["ceiling"].rate if "ceiling" in by_name else 0.0
    rows = []
    for section, run in runs:
        eager = eager_rate(by_name, run.name) if section == "compute" else 0.0
        rows.append({"section": section, "name": run.name, "images_per_s": round(run.rate, 1),
                     "vs_ceiling": round(run.rate / ceiling, 3) if ceiling and section != "compute" else "",
                     "vs_eager": round(run.rate / eager, 3) if eager and run.rate else "",
                     "data_frac": round(run.figures.get("data_frac", 0.0), 3),
                     "host_frac": round(run.figures.get("host_frac", 0.0), 3),
                     "bound": run.summary.bound if run.summary else "", "status": status(run),
                     "command": " ".join(as_overrides(run.change)), **environment_cells(env)})
    return rows


def write_csv(run_dir: Path, rows: list[dict]) -> None:
    """gpu_check.csv with every row so far, replaced whole: a check cut short keeps the rows it finished."""
    def write(path: Path) -> None:
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    write_atomic(run_dir / "gpu_check.csv", write)


def markdown(cfg: DictConfig, runs: list[Trial], decoded: list[dict], bench: tuple[list[dict], str],
             env: dict[str, str]) -> str:
    check, by_name = cfg.gpu_check, {run.name: run for run in runs}
    ceiling = by_name["ceiling"].rate

    def table(names: list[str]) -> list[str]:
        rows = []
        for name in names:
            run = by_name[name]
            if run.summary:
                rows.append([name, f"{run.rate:.0f}", f"{run.rate / ceiling:.2f}" if ceiling else "",
                             f"{100 * run.summary.data_frac:.0f}%", f"{100 * run.summary.host_frac:.0f}%",
                             run.summary.bound, run.summary.verdict])
            else:
                rows.append([name, "", "", "", "", "", status(run)])
        return markdown_table(["run", "images/s", "× ceiling", "data wait", "host", "bound", "verdict or failure"],
                              rows, right={1, 2, 3, 4})

    def cell(model: str, step: str) -> str:
        run = by_name[f"{model}/{step}"]
        eager = eager_rate(by_name, run.name)
        return f"{run.rate:.0f} (×{run.rate / eager:.2f})" if run.summary and eager else (
            f"{run.rate:.0f}" if run.summary else status(run))

    pipelines = [name for name in check.pipelines if by_name[name].summary]
    best = max(pipelines, key=lambda name: by_name[name].rate, default=None)
    repeat = [by_name[name].rate for name in ("ceiling", "ceiling_again") if by_name[name].summary]
    noise = abs(repeat[0] - repeat[1]) / repeat[0] if len(repeat) == 2 else None
    split_off = by_name["split_off"].rate
    bench_rows, bench_status = bench
    return "\n".join([
        f"# GPU check: {env['device']}", "",
        f"{time.strftime('%Y-%m-%d %H:%M')}; driver {env['driver']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
        f"torch {env['torch']}, torchvision {env['torchvision']}, DALI {env['nvidia-dali-cuda130']}, "
        f"{env['cpu_cores']} CPU cores; gpu_check.minutes={check.minutes}.", "",
        f"**gpu tests**: {test_results(check.tests_xml)}", "",
        "## nvJPEG against Pillow", "",
        f"{check.decode.images} training JPEGs in one batched call, {check.decode.repeats} calls timed after one.", "",
        *markdown_table(["backend", "images/s", "difference from Pillow (levels)", "status"],
                        [[row["name"], row.get("images_per_s", ""), row.get("vs_pillow", ""), row["status"]]
                         for row in decoded], right={1}), "",
        "## Real pipelines beside the compute ceiling", "",
        f"Every run: `{' '.join(check.common)}`; each figure leaves out the run's first logging window. Ceiling: "
        f"`{' '.join(check.ceiling)}`; each pipeline keeps its compute switches.", "",
        *table(["ceiling", *check.pipelines]), "",
        (f"Best real pipeline: {best}, {by_name[best].rate / ceiling:.1%} of the ceiling." if best and ceiling
         else "No real pipeline finished."), "",
        "## Each model's step: eager, compiled, CUDA graphs, fused optimizer", "",
        "Images/s on the resident batch, and × the model's eager run.", "",
        *markdown_table(["model", *check.steps], [[model, *(cell(model, step) for step in check.steps)]
                                                  for model in check.models]), "",
        *(f"- {model}: `{' '.join(overrides)}`" for model, overrides in check.models.items()),
        *(f"- {step}: `{' '.join(overrides)}`" for step, overrides in check.steps.items()), "",
        "## What the three-way split costs", "",
        f"The ceiling without queue sampling and TensorBoard (`{' '.join(check.split_off)}`): "
        + (f"{split_off:.0f} images/s, {split_off / ceiling:.3f} × the ceiling; the ceiling run twice differed by "
           f"{noise:.1%} (run-to-run noise)." if split_off and ceiling and noise is not None
           else status(by_name["split_off"])), "",
        "## Loader only", "",
        f"`python -m {PACKAGE}.bench {' '.join(check.bench)}`: {bench_status}", "",
        *markdown_table(["decoder", "format", "workers", "images/s", "× baseline", "note"],
                        [[row["decoder"], row["format"], row["num_workers"], row["images_per_s"], row["vs_baseline"],
                          row["note"]] for row in bench_rows], right={2, 3, 4}), "",
        "## Commands", "",
        *(f"- {run.name} ({run.seconds:.0f} s): `python -m {PACKAGE}.train {' '.join(as_overrides(run.change))}`"
          for run in runs if run.seconds), "",
    ])
