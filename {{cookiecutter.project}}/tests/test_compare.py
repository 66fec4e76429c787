"""compare: finished runs side by side, here the resident-batch ceiling beside a real pipeline."""
import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from {{ cookiecutter.package }}.core.errors import ClearError
from {{ cookiecutter.package }}.diagnosis.summary import Summary
from {{ cookiecutter.package }}.tools.compare import load_runs, table

from helpers.paths import PACKAGE, PROJECT
from helpers.runs import a_summary, summary


def compare(*folders) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"{PACKAGE}.compare", *map(str, folders)], cwd=PROJECT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.full
def test_the_ceiling_and_a_real_pipeline_side_by_side(tmp_path, train_cli):
    sweep = tmp_path / "sweep"
    train_cli(tmp_path / "unused", "hydra.mode=MULTIRUN", f"hydra.sweep.dir={sweep}", "prefetcher=resident,none")
    ceiling, real = summary(sweep / "0"), summary(sweep / "1")
    assert (ceiling.choices["prefetcher"], real.choices["prefetcher"]) == ("resident", "none")
    assert ceiling.data_frac < real.data_frac  # the resident batch waits for no loading
    assert ceiling.steps == real.steps

    result = compare(sweep)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "debug=tiny" in lines[0] and "prefetcher" not in lines[0]  # shared settings above the table
    # then the seconds to each top-1 level a run reached
    assert lines[2].startswith("| prefetcher | images/s | data wait | host | bound | × first | val top-1 | train top-1 |")
    assert lines[4].startswith("| resident |") and "| 1.00 |" in lines[4]
    ratio = real.images_per_s / ceiling.images_per_s
    assert lines[5].startswith(f"| none | {real.images_per_s:.1f} | {100 * real.data_frac:.0f}% | "
                               f"{100 * real.host_frac:.0f}% | {real.bound} | {ratio:.2f} | "
                               f"{real.val_top1:.1f}% | {real.train_top1:.1f}% |")


def finished(overrides: list[str], images_per_s: float, val_top1: float, **more) -> tuple[dict, Summary]:
    summary = a_summary(overrides=overrides, images_per_s=images_per_s, data_frac=0.25, host_frac=0.0, bound="data",
                        env={"device": "cpu: AMD EPYC"}, val_top1=val_top1, **more)
    return dict(override.partition("=")[::2] for override in overrides), summary


def test_accuracy_stands_beside_speed_and_training_top1_where_a_summary_has_it():
    runs = [finished(["precision=fp32"], 100.0, 71.25, train_top1=64.0),
            finished(["precision=bf16"], 150.0, 70.0)]  # a summary written before train_top1 was kept
    assert table(runs).splitlines()[2:] == [
        "| precision | images/s | data wait | host | bound | × first | val top-1 | train top-1 |",
        "|---|---|---|---|---|---|---|---|",
        "| fp32 | 100.0 | 25% | 0% | data | 1.00 | 71.2% | 64.0% |",
        "| bf16 | 150.0 | 25% | 0% | data | 1.50 | 70.0% | |"]
    assert "train top-1" not in table([finished(["precision=fp32"], 100.0, 71.25)])


def test_time_to_accuracy_is_compared_at_each_level_a_run_reached_blank_where_another_fell_short():
    runs = [finished(["precision=fp32"], 100.0, 91.0, time_to_top1_s={"50": 12.0, "75": 40.0, "90": 95.0}),
            finished(["precision=bf16"], 150.0, 80.0, time_to_top1_s={"50": 9.0, "75": 27.4})]
    assert table(runs).splitlines()[2:] == [
        "| precision | images/s | data wait | host | bound | × first | val top-1 | s to 50% | s to 75% | s to 90% |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| fp32 | 100.0 | 25% | 0% | data | 1.00 | 91.0% | 12 | 40 | 95 |",
        "| bf16 | 150.0 | 25% | 0% | data | 1.50 | 80.0% | 9 | 27 | |"]
    assert "s to" not in table([finished(["precision=fp16"], 90.0, 40.0, time_to_top1_s={})])


def test_a_summary_an_older_version_wrote_is_compared_on_what_it_holds(tmp_path):
    for job, (precision, images_per_s) in enumerate([("fp32", 100.0), ("bf16", 150.0)]):
        (tmp_path / str(job)).mkdir()
        held = asdict(finished([f"precision={precision}"], images_per_s, 71.25)[1])
        written = {key: held[key] for key in ("overrides", "images_per_s", "data_frac", "host_frac", "bound", "env",
                                              "val_top1")}  # as the versions before classes and setup wrote it
        (tmp_path / f"{job}/summary.json").write_text(json.dumps(written))
    assert table(load_runs([tmp_path])).splitlines()[2:] == [
        "| precision | images/s | data wait | host | bound | × first | val top-1 |",
        "|---|---|---|---|---|---|---|",
        "| fp32 | 100.0 | 25% | 0% | data | 1.00 | 71.2% |",
        "| bf16 | 150.0 | 25% | 0% | data | 1.50 | 71.2% |"]
    with pytest.raises(ClearError, match="has no choices, data_ms, .*: it comes from an older version"):
        Summary.read(tmp_path / "0/summary.json")  # the readers that need every field refuse it in one line


@pytest.mark.full
def test_a_folder_without_finished_runs_is_refused_in_one_line(tmp_path):
    result = compare(tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: no summary.json under {tmp_path}: is it the folder of finished runs?"


@pytest.mark.full
def test_a_summary_without_the_overrides_is_refused_in_one_line(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0/summary.json").write_text('{"images_per_s": 10.0, "data_frac": 0.1}')
    result = compare(tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().endswith("has no overrides, host_frac, bound, env, val_top1: it comes from an older "
                                          "version of the project")
