"""scripts/accuracy.py, the accuracy tables' benchmark: every row's overrides make a configuration the checks pass,
the reference's last top-1 is read from its log, and the table marks a row outside the reference's spread."""
import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import PROJECT
from helpers.runs import hydra_run

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.errors import ClearError
from {{ cookiecutter.package }}.options import check

spec = importlib.util.spec_from_file_location("accuracy_script", PROJECT / "scripts/accuracy.py")
accuracy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(accuracy)
FAST_PATHS = [name for name, (_, judged_against) in accuracy.VARIANTS.items() if judged_against == accuracy.PIPELINE]


@pytest.mark.parametrize("name", list(accuracy.VARIANTS))
def test_every_rows_overrides_pass_the_checks(name, tiny_root, tmp_path):
    formats = [override.partition("=")[2] for override in accuracy.VARIANTS[name][0] if override.startswith("format=")]
    missing = [options.facts("format", format).missing() for format in formats]
    if any(missing):  # a row of an extra that is not installed here (a base install has none)
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
        return accuracy.Result(88.5, 5.0, {"85": 2.0})

    folder = tmp_path / "runs/row/epochs3-seed0"
    folder.mkdir(parents=True)
    plan = accuracy.Planned(folder=folder, provenance=accuracy.Provenance(overrides=["seed=0"], recipes={}, code="1"),
                            run=run)
    assert accuracy.kept(plan) == accuracy.kept(plan) == accuracy.Result(88.5, 5.0, {"85": 2.0})
    assert len(runs) == 1


def test_a_kept_run_whose_overrides_recipe_or_code_changed_is_refused_in_one_line_or_trained_again_beside(tmp_path,
                                                                                                        monkeypatch):
    """The row experiment=fast_to_accuracy, which composes fashion_mnist's recipe too, through main(): its training
    faked, its package a copy that the test edits."""
    package = shutil.copytree(accuracy.PACKAGE_DIR, tmp_path / "package", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(accuracy, "PACKAGE_DIR", package)
    trained = []

    def ours(overrides, levels, run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)  # as training makes its run folder
        trained.append(run_dir)
        return accuracy.Result(80.0 + len(trained), 1.0, {})

    monkeypatch.setattr(accuracy, "ours", ours)
    (tmp_path / "tree/train").mkdir(parents=True)
    work = tmp_path / "work"
    (work / "packs/tensor").mkdir(parents=True)  # the row's pack is there: nothing is packed
    folder = work / "runs/experiment-fast_to_accuracy/epochs10-seed0"

    def table(*flags: str) -> None:
        monkeypatch.setattr(sys, "argv", ["accuracy.py", str(tmp_path / "tree"), "--work", str(work), "--seeds", "0",
                                          "--variants", "experiment=fast_to_accuracy", *flags])
        accuracy.main()

    def refused(*flags: str) -> str:
        with pytest.raises(ClearError) as refusal:
            table(*flags)
        return str(refusal.value)

    def edited(path: Path) -> str:
        before = path.read_text()
        path.write_text(before + "\n# an edit\n")
        return before

    table()
    table("--levels", "85")  # other levels time the same training: the kept run is read again
    assert trained == [folder]
    assert refused("--workers", "3") == (
        f"1 kept run(s) differ from what their rows would run now, such as {folder}: its overrides "
        "loader.num_workers=2 are now loader.num_workers=3; pass --rerun-changed to train them again, each old one "
        "kept beside as <folder>.replaced-<time>, or give another --work")
    for path, difference in [(package / "conf/experiment/fashion_mnist.yaml",
                              "its recipe experiment/fashion_mnist.yaml changed;"),
                             (package / "train.py", "its code changed;")]:
        before = edited(path)
        assert f"such as {folder}: {difference} pass --rerun-changed" in refused()
        path.write_text(before)
    edited(package / "conf/experiment/gpu_fast.yaml")  # a recipe the row does not compose
    table()
    assert trained == [folder]

    edited(package / "conf/experiment/fast_to_accuracy.yaml")
    table("--rerun-changed")
    assert trained == [folder, folder]
    old, = work.glob("runs/experiment-fast_to_accuracy/epochs10-seed0.replaced-*")
    assert [json.loads((run / accuracy.RECORD).read_text())["result"]["top1"] for run in (old, folder)] == [81.0, 82.0]
    table()
    assert trained == [folder, folder]

    (folder / accuracy.RECORD).write_text(json.dumps({"top1": 81.0, "minutes": 1.0}))  # as runs were kept before
    assert "such as {folder}: its record does not say what it was trained from;".format(folder=folder) in refused()


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
        return accuracy.Result(90.0 + seed, 1.0, {"90": 0.5})

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
            return accuracy.Result(90.0, 1.0)
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
