"""Validation accuracy: top-k hits counted on the device, percentages over exactly the batches allowed; and the
evaluate command, whose scores match a hand count on a tiny set of coloured photos (tests/helpers/colours.py)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.loop.validate import accuracy, score
from {{ cookiecutter.package }}.loop.precision import Precision
from {{ cookiecutter.package }}.tools import evaluate as command
from {{ cookiecutter.package }}.tools.pack import pack

from helpers.colours import CLASSES, colour_checkpoint, colour_tree
from helpers.paths import PACKAGE, PROJECT
from helpers.processes import QUIET, error_line
from helpers.runs import hydra_run

CPU = torch.device("cpu")


def test_accuracy_counts_the_targets_within_the_top_k():
    output = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    target = torch.tensor([1, 2, 0])  # ranked first, third and third
    assert accuracy(output, target, topk=(1, 2, 5)).tolist() == [1, 1, 3]  # top-5 of 3 classes: all of them


def test_validation_gives_percentages_over_the_batches_it_may_see():
    right = (torch.eye(3), torch.arange(3))  # the identity "model" ranks each label first
    wrong = (torch.eye(3), torch.tensor([1, 2, 0]))
    world, precision = World(0, 0, 1, CPU), Precision("fp32", CPU)
    assert score(torch.nn.Identity(), [right, wrong], precision, world) == (50.0, 100.0)
    assert score(torch.nn.Identity(), [right, wrong], precision, world, limit_batches=1) == (100.0, 100.0)


# Two photos of each colour in its own folder; a red one filed under cyan (the model ranks cyan last for red: a top-1
# and a top-5 miss) and a magenta one under red (red comes third for magenta: a top-1 miss, a top-5 hit).
FILED = {name: [name, name] for name in CLASSES} | {"cyan": ["cyan", "cyan", "red"], "red": ["red", "red", "magenta"]}


@pytest.fixture
def scored(tmp_path):
    """scored(*overrides) -> evaluate's result on the coloured set, run in this process on the CPU."""
    root, checkpoint = colour_tree(tmp_path / "colours", FILED), colour_checkpoint(tmp_path / "best.pt")

    def run(*overrides: str) -> dict:
        with hydra_run("evaluate", [f"checkpoint={checkpoint}", f"data.root={root}", "loader.num_workers=0",
                                    "batch_size=4", *overrides], tmp_path / "run") as cfg:
            return command.evaluate(cfg, tmp_path / "run", World(0, 0, 1, CPU))

    run.root, run.checkpoint, run.run_dir = root, checkpoint, tmp_path / "run"
    return run


def test_evaluate_scores_as_a_hand_count_of_the_set_does(scored):
    result = scored()
    assert result["images"] == 14 and result["top1"] == pytest.approx(100 * 12 / 14)
    assert result["top5"] == pytest.approx(100 * 13 / 14)  # 6 classes: top-5 is given
    expected = {name: 100.0 for name in CLASSES} | {"cyan": 100 * 2 / 3, "red": 100 * 2 / 3}
    assert {name: entry["top1"] for name, entry in result["per_class"].items()} == pytest.approx(expected)
    wrong = {(CLASSES[row], CLASSES[column]): count for row, counts in enumerate(result["confusion"])
             for column, count in enumerate(counts) if count and row != column}
    assert wrong == {("cyan", "red"): 1, ("red", "magenta"): 1}
    assert json.loads((scored.run_dir / "evaluation.json").read_text()) == json.loads(json.dumps(result))
    with Image.open(scored.run_dir / "confusion.png") as drawn:
        assert drawn.format == "PNG" and min(drawn.size) > 6 * 16  # a cell of at least 16 pixels per class
    assert "14 images: top-1 85.71%, top-5 92.86%" in command.report(result, scored.run_dir)


def test_evaluate_reads_any_format_through_the_loader_assembly(scored):
    pack(scored.root, "hdf5", scored.root.parent / "packed", None, 90, 1, False, "raise")
    packed = scored("format=hdf5", f"format.path={scored.root.parent / 'packed'}", "decoder=pil")
    assert (packed["top1"], packed["top5"]) == pytest.approx((100 * 12 / 14, 100 * 13 / 14))
    assert packed["confusion"] == scored()["confusion"]


def test_top5_is_left_out_with_five_classes_or_fewer():
    two = torch.tensor([[3, 1], [0, 2]])
    assert "top5" not in command.scores(two, hits5=6, classes=["a", "b"])
    assert command.scores(two, hits5=6, classes=["a", "b"])["per_class"] == {"a": {"images": 4, "top1": 75.0},
                                                                              "b": {"images": 2, "top1": 100.0}}


def test_data_of_classes_the_checkpoint_never_saw_is_refused(scored, tmp_path):
    (scored.root / "train/purple").mkdir()
    (scored.root / "train/purple/0.jpg").write_bytes((scored.root / "train/red/0.jpg").read_bytes())
    with pytest.raises(ConfigError, match="has classes the checkpoint was not trained on: purple"):
        scored()


@pytest.mark.full
@pytest.mark.parametrize("command_line", [
    ["evaluate", "checkpoint=/no/such/best.pt", "data.root={folder}"],
    ["predict", "checkpoint=/no/such/best.pt", "images={folder}"],
    ["export", "checkpoint=/no/such/best.pt"],
], ids=["evaluate", "predict", "export"])
def test_each_command_refuses_a_missing_checkpoint_in_one_line(command_line, tmp_path):
    # A folder of the test's own: one that other tests write into and delete from meanwhile (such as /tmp) can lose
    # a subfolder while a command walks it.
    folder = tmp_path / "images"
    folder.mkdir()
    result = subprocess.run([sys.executable, "-m", f"{PACKAGE}.{command_line[0]}",
                             *(argument.format(folder=folder) for argument in command_line[1:]),
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=PROJECT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, **QUIET})
    assert result.returncode != 0
    assert error_line(result.stderr) == "error: checkpoint=/no/such/best.pt: no such file; pass the last.pt or best.pt " \
                                        "of a run folder"
