"""scripts/accuracy.py, the accuracy tables' benchmark: every row's overrides make a configuration the checks pass,
the reference's last top-1 is read from its log, and the table marks a row outside the reference's spread."""
import importlib.util

import pytest

from conftest import PROJECT, hydra_run

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.config import check

spec = importlib.util.spec_from_file_location("accuracy_script", PROJECT / "scripts/accuracy.py")
accuracy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(accuracy)


@pytest.mark.parametrize("name", list(accuracy.VARIANTS))
def test_every_rows_overrides_pass_the_checks(name, tiny_root, tmp_path):
    formats = [override.partition("=")[2] for override in accuracy.VARIANTS[name] if override.startswith("format=")]
    missing = [options.facts("format", format).missing() for format in formats]
    if any(missing):  # a row of an extra that is not installed here (make test-base installs none)
        pytest.skip(f"{name}: {next(reason for reason in missing if reason)}")
    chosen = [accuracy.RECIPE, f"data.root={tiny_root}", "seed=1", "train.epochs=2",
              *accuracy.overrides(accuracy.VARIANTS[name], tmp_path / "packs")]
    with hydra_run("train", chosen, tmp_path / "run") as cfg:
        check(cfg)
    assert cfg.model.name == "resnet18" and cfg.data.crop_size == 28 and cfg.train.epochs == 2
    assert "{" not in str(cfg.format.get("path"))  # a packed row's path names the packs' folder


def test_the_reference_runs_last_top1_is_read_from_its_log():
    log = "Test:  Acc@1 80.125 Acc@5 99.000\nEpoch: [1]\nTest:  Acc@1 88.500 Acc@5 99.700\nTraining time 0:10:00\n"
    assert accuracy.last_top1(log) == 88.5
    with pytest.raises(RuntimeError, match="printed no 'Acc@1 ... Acc@5' line"):
        accuracy.last_top1("Traceback (most recent call last):\n")


def test_a_row_further_than_twice_the_larger_spread_from_the_reference_is_marked():
    reference = accuracy.Row("reference", [90.0, 91.0, 92.0], [1.0] * 3)  # sd 1.0
    close, far = accuracy.Row("close", [89.0, 89.5, 90.0], [1.0] * 3), accuracy.Row("far", [86.0, 86.5, 87.0], [1.0] * 3)
    lines = accuracy.table([reference, close, far], reference).splitlines()
    assert lines[2].startswith("| reference | 90.00, 91.00, 92.00 | 91.00 | 1.00 | (the reference) |")
    assert "| yes |" in lines[3] and "| **no** |" in lines[4]


def test_a_row_holds_each_seeds_top1_in_turn_and_its_minutes():
    row = accuracy.measured("a row", [3, 1], lambda seed: 90.0 + seed)
    assert row.name == "a row" and row.top1 == [93.0, 91.0] and len(row.minutes) == 2
    assert all(minutes >= 0 for minutes in row.minutes)
