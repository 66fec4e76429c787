"""The learning-rate schedule: a factor of the peak learning rate at each point of the run, set before every optimizer
step. The point is the run's position in epochs (the epochs done, plus the share of this epoch's images that all
processes together trained), not a count of steps: a run resumed on another number of processes, or with another
train.accumulate, goes on along the same curve. A schedule option is built with the run's train.epochs and answers
`factor(position)`."""
import math
from dataclasses import dataclass

import torch

from ..contracts import Schedule
from ..core.errors import ConfigError


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up from warmup_start to 1 over warmup_epochs, then half a cosine down to min_lr_ratio at the
    run's end, `epochs`."""
    epochs: int
    warmup_epochs: float
    warmup_start: float
    min_lr_ratio: float

    def factor(self, position: float) -> float:
        warmup = min(self.warmup_epochs, self.epochs)
        if position < warmup:
            return self.warmup_start + (1 - self.warmup_start) * position / warmup
        progress = min(1.0, (position - warmup) / max(self.epochs - warmup, 1e-9))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(epochs: int, warmup_epochs: float, warmup_start: float, min_lr_ratio: float) -> WarmupCosine:
    return WarmupCosine(epochs, warmup_epochs, warmup_start, min_lr_ratio)


@dataclass(frozen=True)
class EpochWarmupCosine(WarmupCosine):
    """The same curve taken once per epoch, at its start, as torchvision's reference steps
    SequentialLR(LinearLR, CosineAnnealingLR): each epoch trains at one learning rate."""

    def factor(self, position: float) -> float:
        return super().factor(math.floor(position))


def epoch_cosine(epochs: int, warmup_epochs: int, warmup_start: float, min_lr_ratio: float) -> EpochWarmupCosine:
    if warmup_epochs != int(warmup_epochs):
        raise ConfigError(f"schedule.warmup_epochs={warmup_epochs}: schedule=epoch_cosine changes the learning rate at "
                          "each epoch's start; pass a whole number of epochs, or use schedule=warmup_cosine")
    return EpochWarmupCosine(epochs, int(warmup_epochs), warmup_start, min_lr_ratio)


class LearningRate:
    """Sets each parameter group's learning rate to its peak (the lr it was built with, which the optimizer's state
    keeps as `initial_lr`) times the schedule's factor where the run stands."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule, epoch_images: int):
        self.optimizer, self.schedule, self.epoch_images = optimizer, schedule, epoch_images
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])

    def position(self, epoch: int, images_in_epoch: int) -> float:
        return epoch + images_in_epoch / self.epoch_images

    def set(self, epoch: int, images_in_epoch: int) -> None:
        factor = self.schedule.factor(self.position(epoch, images_in_epoch))
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
