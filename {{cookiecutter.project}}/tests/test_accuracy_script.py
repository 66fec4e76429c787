"""scripts/accuracy.py, the accuracy tables' benchmark: every row's overrides make a configuration the checks pass,
the reference's last top-1 is read from its log, and the table marks a row outside the reference's spread."""
import argparse
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
FAST_PATHS = [name for name, (_, judged_against) in accuracy.VARIANTS.items() if judged_against == accuracy.PIPELINE]


@pytest.mark.parametrize("name", list(accuracy.VARIANTS))
def test_every_rows_overrides_pass_the_checks(name, tiny_root, tmp_path):
    formats = [override.partition("=")[2] for override in accuracy.VARIANTS[name][0] if override.startswith("format=")]
    missing = [options.facts("format", format).missing() for format in formats]
    if any(missing):  # a row of an extra that is not installed here (make test-base installs none)
        pytest.skip(f"{name}: {next(reason for reason in missing if reason)}")
    chosen = [*accuracy.recipe_and_overrides(accuracy.VARIANTS[name][0], tmp_path / "packs", 2),
              f"data.root={tiny_root}", "seed=1"]
    with hydra_run("train", chosen, tmp_path / "run") as cfg:
        check(cfg)
    assert cfg.model.name == "resnet18" and cfg.data.crop_size == 28
    own_recipe = accuracy.RECIPE not in chosen  # a recipe trains for its own epochs, not the table's 2
    assert cfg.train.epochs != 2 if own_recipe else cfg.train.epochs == 2
    assert "{" not in str(cfg.format.get("path"))  # a packed row's path names the packs' folder


def test_the_reference_runs_last_top1_is_read_from_its_log():
    log = "Test:  Acc@1 80.125 Acc@5 99.000\nEpoch: [1]\nTest:  Acc@1 88.500 Acc@5 99.700\nTraining time 0:10:00\n"
    assert accuracy.last_top1(log) == 88.5
    with pytest.raises(RuntimeError, match="printed no 'Acc@1 ... Acc@5' line"):
        accuracy.last_top1("Traceback (most recent call last):\n")


def test_the_pipeline_is_judged_against_torchvision_and_each_fast_path_against_the_pipeline():
    reference = accuracy.Row(accuracy.REFERENCE, [90.0, 91.0, 92.0], [1.0] * 3)  # sd 1.0
    pipeline = accuracy.Row(accuracy.PIPELINE, [86.0, 86.5, 87.0], [1.0] * 3)  # 4.5 below: outside 2 x 1.0
    close = accuracy.Row("decoder=opencv", [86.0, 86.4, 86.8], [1.0] * 3)
    far = accuracy.Row("format=lmdb", [84.0, 84.2, 84.4], [1.0] * 3)
    names = [row.name for row in (reference, pipeline, close, far)]
    lines = accuracy.table([reference, pipeline, close, far], names, ["90"]).splitlines()
    assert lines[2].startswith(f"| {accuracy.REFERENCE} | 90.00, 91.00, 92.00 | 91.00 | 1.00 | (the reference) |")
    assert f"| **no**, of {accuracy.REFERENCE} |" in lines[3]
    assert f"| yes, of {accuracy.PIPELINE} |" in lines[4] and f"| **no**, of {accuracy.PIPELINE} |" in lines[5]


def test_a_row_whose_comparison_has_not_finished_is_not_judged_and_without_torchvision_the_pipeline_leads():
    pipeline = accuracy.Row(accuracy.PIPELINE, [86.0, 87.0], [1.0] * 2)
    close = accuracy.Row("decoder=opencv", [86.2, 86.6], [1.0] * 2)
    waiting = accuracy.table([close], [accuracy.PIPELINE, close.name], ["90"]).splitlines()[2]
    assert f"| not judged: {accuracy.PIPELINE} did not finish |" in waiting
    lines = accuracy.table([pipeline, close], [accuracy.PIPELINE, close.name], ["90"]).splitlines()
    assert "| (the reference) |" in lines[2] and f"| yes, of {accuracy.PIPELINE} |" in lines[3]


def test_the_schedule_stepped_per_epoch_is_judged_against_torchvision_and_its_corner_without_warm_up_against_it():
    names = [accuracy.REFERENCE, *accuracy.VARIANTS]
    assert accuracy.compared_with(accuracy.PER_EPOCH, names) == accuracy.REFERENCE
    assert accuracy.compared_with("decoder=pil schedule=epoch_cosine schedule.warmup_epochs=0", names) == \
        accuracy.PER_EPOCH
    assert accuracy.compared_with("decoder=pil schedule.warmup_epochs=0", names) == accuracy.PIPELINE
    assert accuracy.compared_with("decoder=pil schedule.warmup_epochs=0", [accuracy.REFERENCE]) == accuracy.REFERENCE


FAKE_REFERENCE = """import sys
from pathlib import Path
paths = {arg.split("=")[0]: Path(arg.split("=", 1)[1]) for arg in sys.argv[1:] if arg.startswith(("--data-path", "--output-dir"))}
print("data found" if (paths["--data-path"] / "train").is_dir() else "no data", flush=True)
print("Test:  Acc@1 77.250 Acc@5 99.000")
sys.exit(int(not paths["--output-dir"].is_absolute()) + 3 * ("--bias-weight-decay=0" in sys.argv and "fail" in sys.argv[0]))
"""


def test_the_reference_reads_paths_relative_to_the_callers_folder_and_keeps_its_output_when_it_fails(tmp_path,
                                                                                                     monkeypatch):
    checkout = tmp_path / "vision"
    checkout.mkdir()
    (checkout / "train.py").write_text(FAKE_REFERENCE)
    (checkout / "fail_train.py").write_text(FAKE_REFERENCE)
    (tmp_path / "data/train").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    run = accuracy.reference(checkout / "train.py", accuracy.Path("data"), 1, accuracy.Path("out"), "cpu", 0)
    assert run.top1 == 77.25 and "data found" in (tmp_path / "out/train.log").read_text()
    with pytest.raises(RuntimeError, match=r"exit code 3; .*failed/train.log ends: data found"):
        accuracy.reference(checkout / "fail_train.py", accuracy.Path("data"), 1, accuracy.Path("failed"), "cpu", 0)
    assert "Acc@1 77.250" in (tmp_path / "failed/train.log").read_text()


def test_a_finished_runs_result_is_kept_in_its_folder_and_read_again_in_place_of_a_new_run(tmp_path):
    runs = []

    def run():
        runs.append(1)
        return accuracy.Run(88.5, 5.0, {"85": 2.0})

    folder = tmp_path / "runs/row/epochs3-seed0"
    folder.mkdir(parents=True)
    assert accuracy.kept(folder, run) == accuracy.kept(folder, run) == accuracy.Run(88.5, 5.0, {"85": 2.0})
    assert len(runs) == 1


def test_the_minutes_to_a_level_are_the_mean_of_the_runs_that_reached_it_saying_how_many_did():
    row = accuracy.Row("a row", [91.0, 89.0, 92.0], [2.0] * 3, [{"90": 1.0}, {}, {"90": 2.0, "92": 1.5}])
    assert [row.minutes_to(level) for level in ("90", "92", "95")] == ["1.5 (2 of 3)", "1.5 (1 of 3)", "-"]
    assert accuracy.Row("timed by none", [91.0], [2.0]).minutes_to("90") == "-"


def test_a_level_is_keyed_as_the_loops_summary_keys_it_and_a_bad_one_is_refused():
    assert [accuracy.percent(text) for text in ("88", "88.0", "87.6")] == ["88", "88", "87.6"]
    for text in ("0", "101", "abc"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^'{text}' is not a top-1 percentage above 0 and up "
                                                              "to 100, such as 87.6$"):
            accuracy.percent(text)


def test_runs_at_a_time_fill_each_row_by_seed_and_a_failed_run_leaves_its_row_out_in_one_line(tmp_path, capsys):
    def good(seed):
        return accuracy.Run(90.0 + seed, 1.0, {"90": 0.5})

    def broken(seed):
        raise subprocess.CalledProcessError(3, ["python", "-m", "train", "seed=1", "more"])

    def unreadable(seed):  # any exception a run raises, such as a summary that cannot be read
        raise ValueError("summary.json is not JSON")

    out = tmp_path / "table.md"
    first, broken_row, other, unreadable_row = FAST_PATHS[:4]
    finished, failed = accuracy.measure({first: good, broken_row: broken, other: good, unreadable_row: unreadable},
                                        [2, 0, 1], 3, [90], out)
    assert [row.name for row in finished] == [first, other] and failed == [broken_row, unreadable_row]
    err = capsys.readouterr().err
    assert f"error: {broken_row}, seed " in err and f"error: {unreadable_row}, seed " in err
    assert "summary.json is not JSON" in err
    rows = out.read_text().splitlines()[2:]  # the table of the rows that finished, written as each did
    assert [row.split(" | ")[:2] for row in rows] == [[f"| {first}", "92.00, 90.00, 91.00"],
                                                      [f"| {other}", "92.00, 90.00, 91.00"]]
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
        accuracy.measure({name: run(name, seconds) for name, seconds in zip(FAST_PATHS, (0, 0.5, 0))}, [0], 1, [90],
                         out)
    assert FAST_PATHS[2] not in started  # queued when the write failed: never started
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
