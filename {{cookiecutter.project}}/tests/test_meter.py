"""The training loss and top-1 of each logging window, and the epoch's top-1 they add up to."""
import math

import pytest
import torch

from {{ cookiecutter.package }}.core.distributed import ALONE
from {{ cookiecutter.package }}.loop.clock import Window
from {{ cookiecutter.package }}.loop.meter import TrainMeter


def outputs_for(predicted: list[int], classes: int = 3) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(predicted), classes).float()


def test_each_window_gives_its_mean_loss_and_top1_and_the_windows_add_up_to_the_epoch():
    meter = TrainMeter(torch.device("cpu"))
    meter.start_epoch()
    assert meter.epoch_top1(ALONE) is None  # no window yet
    labels = torch.tensor([0, 1, 2, 0])
    meter.add(outputs_for([0, 1, 2, 1]), labels, torch.tensor(1.0))  # 3 of 4 right
    meter.add(outputs_for([0, 0, 0, 0]), labels, torch.tensor(3.0))  # 2 of 4 right
    assert meter.lap(Window(steps=2, images=8)) == {"train/loss": 2.0, "train/top1": 62.5}
    meter.add(outputs_for([1, 1, 1, 1]), labels, torch.tensor(math.inf))  # an fp16 step the scaler skipped: 1 right
    assert meter.lap(Window(steps=1, images=4)) == {"train/loss": 0.0, "train/top1": 25.0}
    assert meter.epoch_top1(ALONE) == pytest.approx(100 * 6 / 12)
    meter.start_epoch()
    assert meter.epoch_top1(ALONE) is None


@pytest.mark.gpu
def test_adding_a_step_makes_no_host_sync():
    """The sums stay on the device until lap(), after the clock's sync: a step that read them would wait for the GPU."""
    device = torch.device("cuda")
    meter = TrainMeter(device)
    output, labels = outputs_for([0, 1]).to(device), torch.tensor([0, 0], device=device)
    loss = torch.ones((), device=device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        meter.add(output, labels, loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert meter.lap(Window(steps=1, images=2)) == {"train/loss": 1.0, "train/top1": 50.0}
