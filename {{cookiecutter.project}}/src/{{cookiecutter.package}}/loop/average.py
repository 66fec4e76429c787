"""An exponential moving average of the weights (`train.ema_decay`), the model that validation scores and that
evaluate, predict and export use; 0 turns it off, and validation scores the live weights.

After each optimizer step, average = decay * average + (1 - decay) * weights, BatchNorm's running statistics
included (torchvision's reference recipe averages them too). The decay starts low, (1 + n) / (10 + n) after n
updates, and grows to `decay`: so that the average of a short run is not mostly its random start (TensorFlow's
ExponentialMovingAverage with num_updates, which timm's ModelEmaV2 warm-up follows in spirit).
"""
import torch
from torch.optim.swa_utils import AveragedModel

from ..core import distributed
from ..core.config import ConfigError


class WeightAverage:
    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0 <= decay < 1:
            raise ConfigError(f"train.ema_decay={decay}: the average keeps this share of itself each step, so it "
                              "must be below 1; try 0.9998 (timm's default), or 0 to validate the live weights")
        self.decay = decay
        self.average = AveragedModel(distributed.unwrap(model), multi_avg_fn=self.blend, use_buffers=True) \
            if decay else None
        # What validation scores: the average, or, without one, the model being trained.
        self.model = self.average if self.average is not None else model

    @property
    def updates(self) -> int:
        """The updates averaged so far: AveragedModel's count, which it keeps on the CPU, so reading it is no sync."""
        return int(self.average.n_averaged) if self.average is not None else 0

    def blend(self, averaged: list[torch.Tensor], current: list[torch.Tensor], _) -> None:
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))  # before this update
        if averaged[0].is_floating_point():
            torch._foreach_lerp_(averaged, current, 1 - decay)
        else:  # BatchNorm's batch counts: the live one
            torch._foreach_copy_(averaged, current)

    def update(self, model: torch.nn.Module) -> None:
        """After an optimizer step of `model`."""
        if self.average is not None:
            self.average.update_parameters(distributed.unwrap(model))

    def weights(self) -> dict[str, torch.Tensor]:
        """The averaged model's state dict, with the live model's keys; empty without an average."""
        return self.average.module.state_dict() if self.average is not None else {}

    def state_dict(self) -> dict:
        return {"weights": self.weights(), "updates": self.updates} if self.average is not None else {}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's average; one without (the run turned the average on at resume) starts it afresh."""
        if self.average is not None and state:
            self.average.module.load_state_dict(state["weights"])
            self.average.n_averaged.fill_(state["updates"])
