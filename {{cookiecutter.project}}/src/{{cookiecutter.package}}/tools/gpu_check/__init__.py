"""The GPU benchmark behind `python -m <package>.gpu_check`: its stages, one run after another, within the time at
hand (gpu_check.minutes), each run's row in gpu_check.csv as it ends and report.md at the end."""
import csv
import logging
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ...core.errors import ConfigError
from ...diagnosis.summary import Summary
from ..trials import STOPPED, Trial, as_overrides, command_of, run_command
from .decode import decode_rows, training_jpegs
from .plan import Budget, check_sections, kind, planned
from .report import describe, environment_cells, markdown, run_rows, status, write_csv

log = logging.getLogger(__name__)


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
        trial.note = f"{reason} (gpu_check.run_timeout_s or gpu_check.minutes)" if code == STOPPED else reason
    log.info("  %s in %.0f s%s", status(trial), trial.seconds, f", {trial.rate:.0f} images/s" if trial.summary else "")
    return trial


def decode_stage(cfg: DictConfig, device: torch.device, budget: Budget) -> list[dict]:
    """nvJPEG against Pillow on each backend, or the line saying why the stage did not run."""
    settings = cfg.gpu_check.decode
    if why := budget.skip("decode"):
        log.info("nvJPEG against Pillow: %s", why)
        return [{"name": f"nvjpeg/{backend}", "status": why} for backend in settings.backends]
    began = time.perf_counter()
    rows = decode_rows(training_jpegs(cfg, settings.images), device, list(settings.backends), settings.repeats)
    budget.took("decode", time.perf_counter() - began)
    for row in rows:
        log.info("%s: %s%s", row["name"], row["status"], f", {row['images_per_s']:.0f} images/s, {row['vs_pillow']} "
                 "from Pillow" if "images_per_s" in row else "")
    return rows


def bench_stage(cfg: DictConfig, run_dir: Path, budget: Budget) -> tuple[list[dict], str]:
    """The loader-only bench on the same data set, and its status."""
    if why := budget.skip("bench"):
        log.info("bench: %s", why)
        return [], why
    data = [override for override in cfg.gpu_check.common if override.startswith("data.")]
    overrides = dict(override.partition("=")[::2] for override in [*data, *cfg.gpu_check.bench])
    trial = run(Trial("bench", overrides), run_dir / "bench", budget.timeout(cfg.gpu_check.run_timeout_s), "bench",
                "bench.csv")
    budget.took("bench", trial.seconds)
    if trial.note:
        return [], status(trial)
    with (run_dir / "bench/bench.csv").open() as file:
        return list(csv.DictReader(file)), "ok"


def gpu_check(cfg: DictConfig, run_dir: Path) -> Path:
    check_sections(cfg)
    if not torch.cuda.is_available() and not cfg.gpu_check.allow_cpu:
        raise ConfigError("gpu_check measures a GPU and torch.cuda.is_available() is False here: run it on a "
                          "machine with CUDA (gpu_check.allow_cpu=true runs the sweep on the CPU, to test the tool)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env, budget = describe(device), Budget(cfg.gpu_check.minutes, OmegaConf.to_container(cfg.gpu_check.expect_s))
    decoded = decode_stage(cfg, device, budget)
    rows = [{"section": "decode", **row, **environment_cells(env)} for row in decoded]
    write_csv(run_dir, rows)
    runs = planned(cfg)
    for done, (_, trial) in enumerate(runs, 1):
        if why := budget.skip(kind(trial)):
            trial.note = why
            log.info("%s: %s", trial.name, why)
        else:
            run(trial, run_dir / "runs" / trial.name.replace("/", "-"), budget.timeout(cfg.gpu_check.run_timeout_s))
            budget.took(kind(trial), trial.seconds)
        write_csv(run_dir, rows + run_rows(runs[:done], env))
    bench = bench_stage(cfg, run_dir, budget)
    bench_rows = [{"section": "bench", "name": f"{row['decoder']}/{row['format']}/w{row['num_workers']}",
                   "images_per_s": row["images_per_s"], "status": row["note"] or "ok",
                   "command": " ".join(cfg.gpu_check.bench), **environment_cells(env)}
                  for row in bench[0]]
    write_csv(run_dir, rows + run_rows(runs, env) + bench_rows)
    report = run_dir / "report.md"
    report.write_text(markdown(cfg, [trial for _, trial in runs], decoded, bench, env))
    return report
