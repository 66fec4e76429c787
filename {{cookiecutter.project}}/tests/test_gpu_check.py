"""The GPU check: refuses a machine without CUDA in one line; its sweep, tried on the CPU, reports every run."""
import csv
import re
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.tools.gpu_check import gpu_check
from {{ cookiecutter.package }}.tools.gpu_check.decode import PIXEL_TOLERANCE, decode_rows
from {{ cookiecutter.package }}.tools.gpu_check.plan import Budget, planned
from {{ cookiecutter.package }}.tools.trials import as_overrides

from helpers.paths import CONF, PACKAGE, PROJECT
from helpers.processes import CPU_ONLY
from helpers.runs import hydra_run, tiny

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1"
skipped="1" tests="5"></testsuite></testsuites>"""


@pytest.mark.full
def test_refuses_a_machine_without_cuda_in_one_line(tmp_path):
    import os

    result = subprocess.run([sys.executable, "-m", f"{PACKAGE}.gpu_check", f"hydra.run.dir={tmp_path}"], cwd=PROJECT,
                            capture_output=True, text=True, timeout=120, env={**os.environ, **CPU_ONLY})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: gpu_check measures a GPU and torch.cuda.is_available() is False here: run it on a machine with "
        "CUDA (gpu_check.allow_cpu=true runs the sweep on the CPU, to test the tool)"]
    assert not (tmp_path / "report.md").exists()


@pytest.mark.full  # a fresh interpreter, 3-4 s
def test_a_key_it_does_not_know_is_refused_in_one_line_before_anything_runs(tmp_path):
    import os

    result = subprocess.run([sys.executable, "-m", f"{PACKAGE}.gpu_check", "+gpu_check.run_timout_s=5",
                             f"hydra.run.dir={tmp_path}"], cwd=PROJECT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **CPU_ONLY})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: +gpu_check.run_timout_s: no such key; did you mean gpu_check.run_timeout_s?"]


@pytest.mark.parametrize("section", ["pipelines", "steps", "split_off"])
def test_a_section_left_out_is_refused_in_one_line_before_anything_runs(section, tmp_path):
    from {{ cookiecutter.package }}.core.errors import ConfigError

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("gpu_check", [f"~gpu_check.{section}"])
    with pytest.raises(ConfigError) as refused:
        gpu_check(cfg, tmp_path)
    assert str(refused.value) == (
        f"~gpu_check.{section}: the report is built of every section; leave out entries of gpu_check.pipelines, "
        "gpu_check.models or gpu_check.steps instead, such as ~gpu_check.steps.compile")
    assert not list(tmp_path.iterdir())


def test_a_failed_run_is_summed_up_by_the_line_that_says_why():
    from {{ cookiecutter.package }}.core.failures import reported

    progress = "epoch 0:  50%|#####     | 3/6 [00:01<00:01]\r"
    assert reported(f"{progress}\nerror: decoder=dali: nvidia.dali is not installed\n") == \
        "error: decoder=dali: nvidia.dali is not installed"
    assert reported("Could not override 'data.root'.\nKey 'root' is not in struct\n\n"
                    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n") == \
        "Could not override 'data.root'."
    assert reported("Traceback (most recent call last):\n  File x\nRuntimeError: CUDA error: out of memory\n") == \
        "RuntimeError: CUDA error: out of memory"
    assert reported("") is None


@pytest.mark.full
def test_sweep_reports_each_run_beside_the_ceiling_and_records_failures(tmp_path, cache_dir, tiny_root, packs,
                                                                        monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the sweep's runs on the CPU, whatever the machine
    (tmp_path / "tests.xml").write_text(JUNIT)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("gpu_check", ["gpu_check.allow_cpu=true", f"gpu_check.tests_xml={tmp_path / 'tests.xml'}"])
    check = cfg.gpu_check
    check.common = [*tiny((), cache_dir, tiny_root), "train.limit_val_batches=1"]
    check.ceiling = ["prefetcher=resident"]
    check.pipelines = OmegaConf.create({"real": ["prefetcher=none", "loader.num_workers=1"],
                                        "nvjpeg": ["prefetcher=none", "decoder=nvjpeg"]})
    check.models = OmegaConf.create({"small": ["data.crop_size=16", "data.val_resize=16"]})
    check.steps = OmegaConf.create({"eager": ["prefetcher=resident"], "bf16": ["prefetcher=resident", "precision=bf16"]})
    check.decode.images, check.decode.repeats, check.decode.backends = 4, 1, ["torchvision"]
    check.bench = ["bench.decoders=[pil,nvjpeg]", "bench.formats=[folder]", "bench.num_workers=[0]",
                   "bench.batch_size=4", "bench.timed_epochs=1"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # as hydra.main's: the decode stage composes
        report = gpu_check(cfg, tmp_path).read_text()

    with (tmp_path / "gpu_check.csv").open() as file:
        rows = {row["name"]: row for row in csv.DictReader(file)}
    assert [name for name in rows if rows[name]["section"] not in ("bench", "decode")] == [
        "ceiling", "real", "nvjpeg", "small/eager", "small/bf16", "split_off", "ceiling_again"]
    ceiling = float(rows["ceiling"]["images_per_s"])
    assert ceiling > 0 and float(rows["ceiling"]["vs_ceiling"]) == 1.0
    real = rows["real"]
    assert real["status"] == "ok" and "prefetcher=none" in real["command"] and "prefetcher=resident" not in \
        real["command"]
    # The CSV gives rates to 0.1 image/s, so their ratio is off the unrounded one by up to about 0.05 / ceiling each
    ratio = float(real["images_per_s"]) / ceiling
    assert abs(float(real["vs_ceiling"]) - ratio) < 0.001 + 0.05 * (1 + ratio) / ceiling, (real, ceiling)
    assert rows["nvjpeg"]["status"] == "failed: decoder=nvjpeg decodes on the GPU and this run has none: pass " \
                                       f"decoder.on_cpu=true to run its batched path on the CPU, or pick decoder={options.fastest_cpu_decoder()}"
    assert rows["ceiling"]["bound"] == "compute" and rows["ceiling"]["device"].startswith("cpu")
    bf16 = rows["small/bf16"]
    assert bf16["status"] == "ok" and "data.crop_size=16" in bf16["command"] and bf16["vs_ceiling"] == ""
    eager = float(rows["small/eager"]["images_per_s"])
    ratio = float(bf16["images_per_s"]) / eager
    assert abs(float(bf16["vs_eager"]) - ratio) < 0.001 + 0.05 * (1 + ratio) / eager, (bf16, eager)
    assert "train.host_split=false" in rows["split_off"]["command"] and rows["split_off"]["status"] == "ok"
    assert rows["nvjpeg/torchvision"]["status"] == "ok" and rows["nvjpeg/torchvision"]["section"] == "decode"
    bench = [row for row in rows.values() if row["section"] == "bench"]
    assert {row["name"] for row in bench} >= {"pil/folder/w0", "baseline/folder/w0", "nvjpeg/folder/w0"}

    assert "**gpu tests**: 3 passed, 1 failed, 1 skipped" in report
    best = re.search(r"Best real pipeline: real, ([\d.]+)% of the ceiling\.", report)
    assert best and abs(float(best[1]) - 100 * float(real["vs_ceiling"])) < 0.2  # the CSV rounds its figures
    assert "| nvjpeg | | | | | | failed: decoder=nvjpeg decodes on the GPU" in report
    assert re.search(r"\| small \| \d+ \(×1\.00\) \| \d+ \(×\d\.\d\d\) \|", report), report
    assert "the ceiling run twice differed by" in report and "| pil | folder | 0 |" in report


def check_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("gpu_check", ["gpu_check.allow_cpu=true", *overrides])


def test_a_short_budget_skips_each_stage_with_a_line_and_runs_nothing(tmp_path, caplog):
    caplog.set_level("INFO")
    report = gpu_check(check_cfg("gpu_check.minutes=0.2"), tmp_path).read_text()  # 12 s: less than any stage
    with (tmp_path / "gpu_check.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 2 + len(planned(check_cfg())) and not (tmp_path / "runs").exists()
    for row in rows:
        assert re.fullmatch(r"skipped: 1?\d s of gpu_check.minutes left, and a (decode|run|compiled) run takes "
                            r"about (30|90) s \(gpu_check.expect_s.\w+\)", row["status"]), row
    assert "bench: skipped: " in caplog.text and "| nvjpeg/torchvision | | | skipped: " in report


def test_a_run_of_a_kind_that_ran_is_expected_to_take_as_long_as_the_longest_of_them():
    budget = Budget(1.0, {"run": 30, "compiled": 90})
    assert budget.skip("run") is None and budget.skip("compiled") == (
        "skipped: 60 s of gpu_check.minutes left, and a compiled run takes about 90 s (gpu_check.expect_s.compiled)")
    budget.took("compiled", 20.0)
    budget.took("compiled", 45.0)
    assert budget.skip("compiled") is None and budget.measured == {"compiled": 45.0}
    budget.took("run", 75.0)
    assert "a run run takes about 75 s (the longest of them here)" in budget.skip("run")
    assert Budget(None, {"run": 1e9}).skip("run") is None and Budget(None, {}).timeout(420) == 420


def test_every_command_of_every_stage_composes_and_passes_the_start_up_checks(tmp_path):
    """The GPU check's dry run: each run it would start is a command line train accepts, its compile mode too,
    whatever the machine (an option's missing package is the run's row to report, not the command's fault)."""
    from {{ cookiecutter.package }}.core.config import check_values
    from {{ cookiecutter.package }}.loop.compile import check_mode

    trials = planned(check_cfg())
    assert len(trials) == 1 + 4 + 2 * 4 + 2  # the ceiling, 4 pipelines, 2 models x 4 steps, the split's two
    for _, trial in trials:
        with hydra_run("train", as_overrides(trial.change), tmp_path / trial.name.replace("/", "-")) as cfg:
            check_values(cfg)
            check_mode(cfg.model.compile, cfg.model.compile_mode, cfg.train.accumulate, 1)
    assert {trial.change.get("model.compile_mode") for _, trial in trials} == {None, "reduce-overhead"}


def test_nvjpeg_decodes_as_pillow_does_on_each_backend_here(tiny_root):
    files = sorted((tiny_root / "train").rglob("*.JPEG"))[:6]
    rows = {row["name"]: row for row in decode_rows(files, torch.device("cpu"), ["torchvision", "torchcodec"], 2)}
    for backend, row in rows.items():
        if row["status"].startswith("not run: "):
            assert backend == "nvjpeg/torchcodec", row  # torchvision comes with torch
            continue
        assert row["status"] == "ok" and row["images_per_s"] > 0, row
        mean, largest = re.fullmatch(r"mean ([\d.]+), max (\d+)", row["vs_pillow"]).groups()
        assert float(mean) <= PIXEL_TOLERANCE and int(largest) <= 255
