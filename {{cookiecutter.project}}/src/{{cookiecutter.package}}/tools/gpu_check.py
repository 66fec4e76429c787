"""The GPU benchmark behind `python -m <package>.gpu_check`: its runs, one after another, and report.md."""
import csv
import logging
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch
from omegaconf import DictConfig

from ..core.errors import ConfigError
from ..diagnosis.report import environment
from ..diagnosis.summary import Summary
from ..options import PACKAGE
from .tables import markdown_table
from .trials import STOPPED, Trial, as_overrides, command_of, run_command

log = logging.getLogger(__name__)

COLUMNS = ("section", "name", "images_per_s", "vs_ceiling", "data_frac", "host_frac", "bound", "status", "command",
           "device", "driver", "cuda", "cudnn", "torch", "torchvision", "nvidia-dali-cuda130")


def planned(cfg: DictConfig) -> list[tuple[str, Trial]]:
    """Every training run of the check, with its section, in the order they run."""
    check = cfg.gpu_check

    def trial(name: str, *overrides: str) -> Trial:
        return Trial(name, dict(override.partition("=")[::2] for override in [*check.common, *overrides]))

    return [("ceiling", trial("ceiling", *check.ceiling)),
            *(("pipeline", trial(name, *check.ceiling, *overrides)) for name, overrides in check.pipelines.items()),
            *(("compute", trial(name, *overrides)) for name, overrides in check.compute.items()),
            ("split", trial("split_off", *check.ceiling, *check.split_off)),
            ("split", trial("ceiling_again", *check.ceiling))]


def run(trial: Trial, folder: Path, timeout_s: float, tool: str = "train", writes: str = "summary.json") -> Trial:
    """Run the trial as `python -m <package>.<tool>`; keep its summary, or the one line saying why it failed. It
    succeeded if it exited with 0 and wrote `writes` into its run folder."""
    log.info("%s: %s", trial.name, " ".join(as_overrides(trial.change)))
    began = time.perf_counter()
    code, line = run_command(command_of(tool, folder, as_overrides(trial.change)), folder, timeout_s)
    trial.seconds = time.perf_counter() - began
    if code == 0 and (folder / writes).is_file():
        if writes == "summary.json":
            trial.summary = Summary.read(folder / writes)
    else:
        reason = line.removeprefix("error: ") or "no output"
        trial.note = f"{reason} (gpu_check.run_timeout_s)" if code == STOPPED else reason
    log.info("  %s in %.0f s%s", status(trial), trial.seconds, f", {trial.rate:.0f} images/s" if trial.summary else "")
    return trial


def status(trial: Trial) -> str:
    return f"failed: {trial.note}" if trial.note else "ok"


def run_bench(cfg: DictConfig, run_dir: Path) -> tuple[list[dict], str]:
    """The loader-only bench on the same data set, and its status."""
    data = [override for override in cfg.gpu_check.common if override.startswith("data.")]
    overrides = dict(override.partition("=")[::2] for override in [*data, *cfg.gpu_check.bench])
    trial = run(Trial("bench", overrides), run_dir / "bench", cfg.gpu_check.run_timeout_s, "bench", "bench.csv")
    if trial.note:
        return [], status(trial)
    with (run_dir / "bench/bench.csv").open() as file:
        return list(csv.DictReader(file)), "ok"


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


def write_report(cfg: DictConfig, run_dir: Path, runs: list[tuple[str, Trial]], bench: tuple[list[dict], str],
                 device: torch.device) -> Path:
    env = describe(device)
    ceiling = next((run.rate for _, run in runs if run.name == "ceiling"), 0.0)
    rows = [{"section": section, "name": run.name, "images_per_s": round(run.rate, 1),
             "vs_ceiling": round(run.rate / ceiling, 3) if ceiling else "",
             "data_frac": round(run.figures.get("data_frac", 0.0), 3),
             "host_frac": round(run.figures.get("host_frac", 0.0), 3),
             "bound": run.summary.bound if run.summary else "",
             "status": status(run), "command": " ".join(as_overrides(run.change)),
             **{key: env.get(key, "") for key in COLUMNS[9:]}} for section, run in runs]
    bench_rows, bench_status = bench
    rows += [{"section": "bench", "name": f"{row['decoder']}/{row['format']}/w{row['num_workers']}",
              "images_per_s": row["images_per_s"], "status": row["note"] or "ok",
              "command": " ".join(cfg.gpu_check.bench), **{key: env.get(key, "") for key in COLUMNS[9:]}}
             for row in bench_rows]
    with (run_dir / "gpu_check.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    report = run_dir / "report.md"
    report.write_text(markdown(cfg, [run for _, run in runs], ceiling, bench_rows, bench_status, env))
    return report


def markdown(cfg: DictConfig, runs: list[Trial], ceiling: float, bench_rows: list[dict], bench_status: str,
             env: dict[str, str]) -> str:
    by_name = {run.name: run for run in runs}

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

    check = cfg.gpu_check
    pipelines = [name for name in check.pipelines if by_name[name].summary]
    best = max(pipelines, key=lambda name: by_name[name].rate, default=None)
    repeat = [by_name[name].rate for name in ("ceiling", "ceiling_again") if by_name[name].summary]
    noise = abs(repeat[0] - repeat[1]) / repeat[0] if len(repeat) == 2 else None
    split_off = by_name["split_off"].rate
    lines = [
        f"# GPU check: {env['device']}", "",
        f"{time.strftime('%Y-%m-%d %H:%M')}; driver {env['driver']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
        f"torch {env['torch']}, torchvision {env['torchvision']}, DALI {env['nvidia-dali-cuda130']}, "
        f"{env['cpu_cores']} CPU cores.", "",
        f"**gpu tests**: {test_results(check.tests_xml)}", "",
        f"Every run: `{' '.join(check.common)}`; each figure leaves out the run's first logging window.", "",
        "## Real pipelines beside the compute ceiling", "",
        f"Ceiling: `{' '.join(check.ceiling)}`. Each pipeline keeps the ceiling's compute switches.", "",
        *table(["ceiling", *check.pipelines]), "",
        (f"Best real pipeline: {best}, {by_name[best].rate / ceiling:.1%} of the ceiling." if best and ceiling
         else "No real pipeline finished."), "",
        "## Precision × compile on the resident batch", "",
        "The ceiling is bf16 with channels_last and cudnn=benchmark, not compiled.", "",
        *table([*check.compute, "ceiling"]), "",
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
          for run in runs), "",
    ]
    return "\n".join(lines)


SECTIONS = ("common", "ceiling", "pipelines", "compute", "split_off", "bench")  # the report reads each of them


def gpu_check(cfg: DictConfig, run_dir: Path) -> Path:
    left_out = [section for section in SECTIONS if section not in cfg.gpu_check]
    if left_out:
        raise ConfigError(f"~gpu_check.{left_out[0]}: the report is built of every section; leave out entries of "
                          "gpu_check.pipelines or gpu_check.compute instead, such as ~gpu_check.compute.fp32_compile")
    if not torch.cuda.is_available() and not cfg.gpu_check.allow_cpu:
        raise ConfigError("gpu_check measures a GPU and torch.cuda.is_available() is False here: run it on a "
                          "machine with CUDA (gpu_check.allow_cpu=true runs the sweep on the CPU, to test the tool)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runs = [(section, run(trial, run_dir / "runs" / trial.name, cfg.gpu_check.run_timeout_s))
            for section, trial in planned(cfg)]
    return write_report(cfg, run_dir, runs, run_bench(cfg, run_dir), device)
