"""Validation accuracy: top-k hits counted on the device, percentages over exactly the batches allowed."""
import torch

from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.loop.evaluate import accuracy, evaluate
from {{ cookiecutter.package }}.loop.precision import Precision

CPU = torch.device("cpu")


def test_accuracy_counts_the_targets_within_the_top_k():
    output = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    target = torch.tensor([1, 2, 0])  # ranked first, third and third
    assert accuracy(output, target, topk=(1, 2, 5)).tolist() == [1, 1, 3]  # top-5 of 3 classes: all of them


def test_evaluate_gives_percentages_over_the_batches_it_may_see():
    right = (torch.eye(3), torch.arange(3))  # the identity "model" ranks each label first
    wrong = (torch.eye(3), torch.tensor([1, 2, 0]))
    world, precision = World(0, 0, 1, CPU), Precision("fp32", CPU)
    assert evaluate(torch.nn.Identity(), [right, wrong], precision, world) == (50.0, 100.0)
    assert evaluate(torch.nn.Identity(), [right, wrong], precision, world, limit_batches=1) == (100.0, 100.0)
