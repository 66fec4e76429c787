"""The learning-rate schedules, checked against torch's own schedulers stepped as the runs they stand for step them."""
import math

import pytest
import torch

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.loop.schedule import LearningRate, epoch_cosine

EPOCHS, WARMUP, STEPS_PER_EPOCH, BATCH = 10, 1, 7, 4  # 28 images an epoch, the last batch of each epoch full


def optimizer(lr: float = 0.2) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr, momentum=0.9, nesterov=True)


def test_epoch_cosine_gives_torchvisions_reference_learning_rate_at_every_step():
    """references/classification/train.py: SequentialLR(LinearLR, CosineAnnealingLR), stepped once an epoch."""
    theirs = optimizer()
    warmup = torch.optim.lr_scheduler.LinearLR(theirs, start_factor=0.01, total_iters=WARMUP)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(theirs, T_max=EPOCHS - WARMUP, eta_min=0.0)
    reference = torch.optim.lr_scheduler.SequentialLR(theirs, [warmup, cosine], milestones=[WARMUP])
    ours = optimizer()
    learning_rate = LearningRate(ours, epoch_cosine(EPOCHS, WARMUP, 0.01, 0.0), STEPS_PER_EPOCH * BATCH)
    rates = []
    for epoch in range(EPOCHS):
        for step in range(STEPS_PER_EPOCH):
            learning_rate.set(epoch, step * BATCH)
            assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
            rates.append(ours.param_groups[0]["lr"])
            theirs.step()  # no gradient: nothing moves, but torch expects it before the scheduler's step
        reference.step()
    # the reference's figures for Fashion-MNIST at lr 0.2: 0.002 through epoch 0, 0.006 through the last
    assert rates[0] == rates[STEPS_PER_EPOCH - 1] == pytest.approx(0.002)
    assert rates[-1] == pytest.approx(0.2 * (1 + math.cos(math.pi * 8 / 9)) / 2) and rates[-1] > 0.006


def test_epoch_cosine_refuses_a_warm_up_of_part_of_an_epoch():
    with pytest.raises(ConfigError, match=r"^schedule.warmup_epochs=0.5: schedule=epoch_cosine changes the learning "
                                          r"rate at each epoch's start; pass a whole number of epochs"):
        epoch_cosine(EPOCHS, 0.5, 0.01, 0.0)
