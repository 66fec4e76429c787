"""The GPU check: refuses a machine without CUDA in one line; its sweep, tried on the CPU, reports every run."""
import csv
import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.tools.gpu_check import gpu_check

from conftest import CONF, CPU_ONLY, PACKAGE, PROJECT, tiny

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


@pytest.mark.full  # a fresh interpreter, 3-4 s; make gpu-check refuses a machine without CUDA in the fast tier
def test_a_key_it_does_not_know_is_refused_in_one_line_before_anything_runs(tmp_path):
    import os

    result = subprocess.run([sys.executable, "-m", f"{PACKAGE}.gpu_check", "+gpu_check.run_timout_s=5",
                             f"hydra.run.dir={tmp_path}"], cwd=PROJECT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **CPU_ONLY})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: +gpu_check.run_timout_s: no such key; did you mean gpu_check.run_timeout_s?"]


@pytest.mark.parametrize("section", ["pipelines", "split_off"])
def test_a_section_left_out_is_refused_in_one_line_before_anything_runs(section, tmp_path):
    from {{ cookiecutter.package }}.core.errors import ConfigError

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("gpu_check", [f"~gpu_check.{section}"])
    with pytest.raises(ConfigError) as refused:
        gpu_check(cfg, tmp_path)
    assert str(refused.value) == (
        f"~gpu_check.{section}: the report is built of every section; leave out entries of gpu_check.pipelines or "
        "gpu_check.compute instead, such as ~gpu_check.compute.fp32_compile")
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
    check.compute = OmegaConf.create({"bf16": ["prefetcher=resident", "precision=bf16"]})
    check.bench = ["bench.decoders=[pil,nvjpeg]", "bench.formats=[folder]", "bench.num_workers=[0]",
                   "bench.batch_size=4", "bench.timed_epochs=1"]
    report = gpu_check(cfg, tmp_path).read_text()

    with (tmp_path / "gpu_check.csv").open() as file:
        rows = {row["name"]: row for row in csv.DictReader(file)}
    assert [name for name in rows if rows[name]["section"] != "bench"] == [
        "ceiling", "real", "nvjpeg", "bf16", "split_off", "ceiling_again"]
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
    assert "train.host_split=false" in rows["split_off"]["command"] and rows["split_off"]["status"] == "ok"
    bench = [row for row in rows.values() if row["section"] == "bench"]
    assert {row["name"] for row in bench} >= {"pil/folder/w0", "baseline/folder/w0", "nvjpeg/folder/w0"}

    assert "**gpu tests**: 3 passed, 1 failed, 1 skipped" in report
    best = re.search(r"Best real pipeline: real, ([\d.]+)% of the ceiling\.", report)
    assert best and abs(float(best[1]) - 100 * float(real["vs_ceiling"])) < 0.2  # the CSV rounds its figures
    assert "| nvjpeg | | | | | | failed: decoder=nvjpeg decodes on the GPU" in report
    assert "the ceiling run twice differed by" in report and "| pil | folder | 0 |" in report
