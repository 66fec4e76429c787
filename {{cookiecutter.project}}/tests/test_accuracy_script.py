"""scripts/accuracy.py, the accuracy tables' benchmark: every row's overrides make a configuration the checks pass,
the reference's last top-1 is read from its log, and the table marks a row outside the reference's spread."""
import importlib.util
import subprocess
import sys

import pytest

from helpers.paths import PROJECT
from helpers.runs import hydra_run

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.options import check

spec = importlib.util.spec_from_file_location("accuracy_script", PROJECT / "scripts/accuracy.py")
accuracy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(accuracy)


@pytest.mark.parametrize("name", list(accuracy.VARIANTS))
def test_every_rows_overrides_pass_the_checks(name, tiny_root, tmp_path):
    formats = [override.partition("=")[2] for override in accuracy.VARIANTS[name] if override.startswith("format=")]
    missing = [options.facts("format", format).missing() for format in formats]
    if any(missing):  # a row of an extra that is not installed here (make test-base installs none)
        pytest.skip(f"{name}: {next(reason for reason in missing if reason)}")
    chosen = [*accuracy.recipe_and_overrides(accuracy.VARIANTS[name], tmp_path / "packs"), f"data.root={tiny_root}",
              "seed=1", "train.epochs=2"]
    with hydra_run("train", chosen, tmp_path / "run") as cfg:
        check(cfg)
    assert cfg.model.name == "resnet18" and cfg.data.crop_size == 28 and cfg.train.epochs == 2
    assert "{" not in str(cfg.format.get("path"))  # a packed row's path names the packs' folder


def test_the_reference_runs_last_top1_is_read_from_its_log():
    log = "Test:  Acc@1 80.125 Acc@5 99.000\nEpoch: [1]\nTest:  Acc@1 88.500 Acc@5 99.700\nTraining time 0:10:00\n"
    assert accuracy.last_top1(log) == 88.5
    with pytest.raises(RuntimeError, match="printed no 'Acc@1 ... Acc@5' line"):
        accuracy.last_top1("Traceback (most recent call last):\n")


def test_the_pipeline_is_judged_against_torchvision_and_each_fast_path_against_the_pipeline():
    reference = accuracy.Row(accuracy.REFERENCE, [90.0, 91.0, 92.0], [1.0] * 3)  # sd 1.0
    pipeline = accuracy.Row(accuracy.PIPELINE, [86.0, 86.5, 87.0], [1.0] * 3)  # 4.5 below: outside 2 x 1.0
    close, far = accuracy.Row("close", [86.0, 86.4, 86.8], [1.0] * 3), accuracy.Row("far", [84.0, 84.2, 84.4], [1.0] * 3)
    names = [row.name for row in (reference, pipeline, close, far)]
    lines = accuracy.table([reference, pipeline, close, far], names, [90]).splitlines()
    assert lines[2].startswith(f"| {accuracy.REFERENCE} | 90.00, 91.00, 92.00 | 91.00 | 1.00 | (the reference) |")
    assert f"| **no**, of {accuracy.REFERENCE} |" in lines[3]
    assert f"| yes, of {accuracy.PIPELINE} |" in lines[4] and f"| **no**, of {accuracy.PIPELINE} |" in lines[5]


def test_a_row_whose_comparison_has_not_finished_is_not_judged_and_without_torchvision_the_pipeline_leads():
    pipeline = accuracy.Row(accuracy.PIPELINE, [86.0, 87.0], [1.0] * 2)
    close = accuracy.Row("close", [86.2, 86.6], [1.0] * 2)
    waiting = accuracy.table([close], [accuracy.PIPELINE, "close"], [90]).splitlines()[2]
    assert f"| not judged: {accuracy.PIPELINE} did not finish |" in waiting
    lines = accuracy.table([pipeline, close], [accuracy.PIPELINE, "close"], [90]).splitlines()
    assert "| (the reference) |" in lines[2] and f"| yes, of {accuracy.PIPELINE} |" in lines[3]


def test_the_minutes_to_a_level_are_the_mean_of_the_runs_that_reached_it_saying_how_many_did():
    row = accuracy.Row("a row", [91.0, 89.0, 92.0], [2.0] * 3, [{"90": 1.0}, {}, {"90": 2.0, "92": 1.5}])
    assert [row.minutes_to(level) for level in ("90", "92", "95")] == ["1.5 (2 of 3)", "1.5 (1 of 3)", "-"]
    assert accuracy.Row("timed by none", [91.0], [2.0]).minutes_to("90") == "-"


def test_runs_at_a_time_fill_each_row_by_seed_and_a_failed_run_leaves_its_row_out_in_one_line(tmp_path, capsys):
    def good(seed):
        return accuracy.Run(90.0 + seed, 1.0, {"90": 0.5})

    def broken(seed):
        raise subprocess.CalledProcessError(3, ["python", "-m", "train", "seed=1", "more"])

    def unreadable(seed):  # any exception a run raises, such as a summary that cannot be read
        raise ValueError("summary.json is not JSON")

    out = tmp_path / "table.md"
    finished, failed = accuracy.measure({"first": good, "broken": broken, "other": good, "unreadable": unreadable},
                                        [2, 0, 1], 3, [90], out)
    assert [row.name for row in finished] == ["first", "other"] and failed == ["broken", "unreadable"]
    err = capsys.readouterr().err
    assert "error: broken, seed " in err and "error: unreadable, seed " in err and "summary.json is not JSON" in err
    rows = out.read_text().splitlines()[2:]  # the table of the rows that finished, written as each did
    assert [row.split(" | ")[:2] for row in rows] == [["| first", "92.00, 90.00, 91.00"],
                                                      ["| other", "92.00, 90.00, 91.00"]]
    assert not list(tmp_path.glob(".*.partial*"))


def test_a_table_that_cannot_be_written_stops_the_runs_queued_in_one_line(tmp_path):
    import time

    from {{ cookiecutter.package }}.core.files import WriteError

    started = []

    def run(name, seconds):
        def one(seed):
            started.append(name)
            time.sleep(seconds)  # the second run is still going when the first's table fails to be written
            return accuracy.Run(90.0, 1.0)
        return one

    out = tmp_path / "table.md"
    out.mkdir()  # a folder where the table goes: renaming the table over it fails, as a full disk would
    with pytest.raises(WriteError, match=f"^could not write {out}: "):
        accuracy.measure({"first": run("first", 0), "second": run("second", 0.5), "third": run("third", 0)}, [0], 1,
                         [90], out)
    assert "third" not in started  # queued when the write failed: never started
    assert list(tmp_path.iterdir()) == [out]  # no temporary left beside it


def test_a_seed_named_twice_is_refused_before_any_run(tmp_path):
    result = subprocess.run([sys.executable, str(PROJECT / "scripts/accuracy.py"), str(tmp_path), "--work",
                             str(tmp_path), "--seeds", "0", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith("error: argument --seeds: 0 0 names a seed twice; give "
                                                           "each once")
    assert not list(tmp_path.iterdir())


def test_a_bad_number_is_refused_in_argparses_error_line_naming_the_flag(tmp_path):
    result = subprocess.run([sys.executable, str(PROJECT / "scripts/accuracy.py"), str(tmp_path), "--work",
                             str(tmp_path), "--jobs", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        "error: argument --jobs: '0' is not a whole number from 1 up")
