"""The GPU benchmark behind `make gpu-check`: the compute ceiling, real pipelines beside it, precision x compile,
the cost of the three-way split, and the loader-only bench, written up as report.md and gpu_check.csv.

    python -m {{ cookiecutter.package }}.gpu_check                                 # on a machine with CUDA
    python -m {{ cookiecutter.package }}.gpu_check gpu_check.tests_xml=gpu-tests.xml  # with the gpu tests' results

Every run is `python -m {{ cookiecutter.package }}.train` with the overrides in conf/gpu_check.yaml, one after
another, so each figure comes from the same loop, clock and report as a user's run. A run that fails (an
option this machine cannot run, say DALI not installed) is recorded with its one-line reason; the others go on.
"""
import csv
import json
import logging
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .config import ClearError, ConfigError
from .failures import reported
from .report import environment

log = logging.getLogger(__name__)

COLUMNS = ("section", "name", "images_per_s", "vs_ceiling", "data_frac", "host_frac", "bound", "status", "command",
           "device", "driver", "cuda", "cudnn", "torch", "torchvision", "nvidia-dali-cuda130")


@dataclass
class Trial:
    section: str
    name: str
    command: list[str]
    summary: dict = field(default_factory=dict)
    status: str = "not run"
    seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.summary.get("images_per_s", 0.0)


def run_trial(trial: Trial, timeout_s: float, writes: str = "summary.json") -> Trial:
    """Run the trial's command; keep its summary, or the one line saying why it failed.

    It succeeded if it exited with 0 and wrote `writes` into its run folder.
    """
    run_dir = Path(next(arg for arg in trial.command if arg.startswith("hydra.run.dir=")).partition("=")[2])
    log.info("%s / %s: %s", trial.section, trial.name, " ".join(trial.command[3:]))
    start = time.perf_counter()
    try:
        result = subprocess.run(trial.command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        trial.status = f"failed: still running after {timeout_s:.0f} s (gpu_check.run_timeout_s)"
        return trial
    finally:
        trial.seconds = time.perf_counter() - start
    if result.returncode == 0 and (run_dir / writes).is_file():
        trial.status = "ok"
        if writes == "summary.json":
            trial.summary = json.loads((run_dir / writes).read_text())
    else:
        trial.status = f"failed: {failure(result.stderr)}"
    log.info("  %s in %.0f s%s", trial.status, trial.seconds,
             f", {trial.images_per_s:.0f} images/s" if trial.summary else "")
    return trial


def failure(stderr: str) -> str:
    """Why a run failed, in the report's words: failures.reported without its `error: `."""
    return (reported(stderr) or "no output").removeprefix("error: ")


def trials(cfg: DictConfig, run_dir: Path) -> list[Trial]:
    """Every training run of the check, in the order they run."""
    check = cfg.gpu_check

    def trial(section: str, name: str, *overrides: str) -> Trial:
        return Trial(section, name, [sys.executable, "-m", f"{__package__}.train",
                                     f"hydra.run.dir={run_dir / 'runs' / name}", *check.common, *overrides])

    return [trial("ceiling", "ceiling", *check.ceiling),
            *(trial("pipeline", name, *_replace(check.ceiling, overrides)) for name, overrides in check.pipelines.items()),
            *(trial("compute", name, *overrides) for name, overrides in check.compute.items()),
            trial("split", "split_off", *check.ceiling, *check.split_off),
            trial("split", "ceiling_again", *check.ceiling)]


def _replace(base, overrides) -> list[str]:
    """`base` with the keys that `overrides` sets replaced by theirs."""
    keys = {override.partition("=")[0] for override in overrides}
    return [*(override for override in base if override.partition("=")[0] not in keys), *overrides]


def run_bench(cfg: DictConfig, run_dir: Path) -> tuple[list[dict], str]:
    """The loader-only bench on the same data set, and its status."""
    data = [override for override in cfg.gpu_check.common if override.startswith("data.")]
    out = run_dir / "bench"
    command = [sys.executable, "-m", f"{__package__}.bench", f"hydra.run.dir={out}", *data, *cfg.gpu_check.bench]
    trial = run_trial(Trial("bench", "bench", command), cfg.gpu_check.run_timeout_s, writes="bench.csv")
    if trial.status != "ok":
        return [], trial.status
    with (out / "bench.csv").open() as file:
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


def write_report(cfg: DictConfig, run_dir: Path, runs: list[Trial], bench: tuple[list[dict], str],
                 device: torch.device) -> Path:
    env = describe(device)
    ceiling = next((run.images_per_s for run in runs if run.name == "ceiling"), 0.0)
    rows = [{"section": run.section, "name": run.name, "images_per_s": round(run.images_per_s, 1),
             "vs_ceiling": round(run.images_per_s / ceiling, 3) if ceiling else "",
             "data_frac": round(run.summary.get("data_frac", 0.0), 3),
             "host_frac": round(run.summary.get("host_frac", 0.0), 3), "bound": run.summary.get("bound", ""),
             "status": run.status, "command": " ".join(run.command[3:]),
             **{key: env.get(key, "") for key in COLUMNS[9:]}} for run in runs]
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
    report.write_text(markdown(cfg, runs, ceiling, bench_rows, bench_status, env))
    return report


def markdown(cfg: DictConfig, runs: list[Trial], ceiling: float, bench_rows: list[dict], bench_status: str,
             env: dict[str, str]) -> str:
    by_name = {run.name: run for run in runs}

    def table(names: list[str]) -> list[str]:
        lines = ["| run | images/s | × ceiling | data wait | host | bound | verdict or failure |",
                 "|---|---:|---:|---:|---:|---|---|"]
        for name in names:
            run = by_name[name]
            if run.summary:
                ratio = f"{run.images_per_s / ceiling:.2f}" if ceiling else ""
                lines.append(f"| {name} | {run.images_per_s:.0f} | {ratio} | "
                             f"{100 * run.summary['data_frac']:.0f}% | {100 * run.summary['host_frac']:.0f}% | "
                             f"{run.summary['bound']} | {run.summary['verdict']} |")
            else:
                lines.append(f"| {name} | | | | | | {run.status} |")
        return lines

    check = cfg.gpu_check
    pipelines = [name for name in check.pipelines if by_name[name].summary]
    best = max(pipelines, key=lambda name: by_name[name].images_per_s, default=None)
    repeat = [by_name[name].images_per_s for name in ("ceiling", "ceiling_again") if by_name[name].summary]
    noise = abs(repeat[0] - repeat[1]) / repeat[0] if len(repeat) == 2 else None
    split_off = by_name["split_off"].images_per_s
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
        (f"Best real pipeline: {best}, {by_name[best].images_per_s / ceiling:.1%} of the ceiling." if best and ceiling
         else "No real pipeline finished."), "",
        "## Precision × compile on the resident batch", "",
        "The ceiling is bf16 with channels_last and cudnn=benchmark, not compiled.", "",
        *table([*check.compute, "ceiling"]), "",
        "## What the three-way split costs", "",
        f"The ceiling without queue sampling and TensorBoard (`{' '.join(check.split_off)}`): "
        + (f"{split_off:.0f} images/s, {split_off / ceiling:.3f} × the ceiling; the ceiling run twice differed by "
           f"{noise:.1%} (run-to-run noise)." if split_off and ceiling and noise is not None
           else by_name["split_off"].status), "",
        "## Loader only", "",
        f"`python -m {__package__}.bench {' '.join(check.bench)}`: {bench_status}", "",
        "| decoder | format | workers | images/s | × baseline | note |", "|---|---|---:|---:|---:|---|",
        *(f"| {row['decoder']} | {row['format']} | {row['num_workers']} | {row['images_per_s']} | "
          f"{row['vs_baseline']} | {row['note']} |" for row in bench_rows), "",
        "## Commands", "",
        *(f"- {run.name} ({run.seconds:.0f} s): `python -m {__package__}.train {' '.join(run.command[3:])}`"
          for run in runs), "",
    ]
    return "\n".join(lines)


def gpu_check(cfg: DictConfig, run_dir: Path) -> Path:
    if not torch.cuda.is_available() and not cfg.gpu_check.allow_cpu:
        raise ConfigError("gpu_check measures a GPU and torch.cuda.is_available() is False here: run it on a "
                          "machine with CUDA (gpu_check.allow_cpu=true runs the sweep on the CPU, to test the tool)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runs = [run_trial(trial, cfg.gpu_check.run_timeout_s) for trial in trials(cfg, run_dir)]
    return write_report(cfg, run_dir, runs, run_bench(cfg, run_dir), device)


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="gpu_check")
def main(cfg: DictConfig) -> None:
    try:
        report = gpu_check(cfg, Path(HydraConfig.get().runtime.output_dir))
    except ClearError as err:
        sys.exit(f"error: {err}")
    print(report.read_text())
    print(f"written: {report}, {report.with_name('gpu_check.csv')}")


if __name__ == "__main__":
    main()
