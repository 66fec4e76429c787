"""An exponential moving average of the weights (`train.ema_decay`), the model that validation scores and that
evaluate, predict and export use; 0 turns it off, and validation scores the live weights.

After each optimizer step, average = decay * average + (1 - decay) * weights, BatchNorm's running statistics
included (torchvision's reference recipe averages them too). The decay starts low, (1 + n) / (10 + n) after n
updates, and grows to `decay`: so that the average of a short run is not mostly its random start (TensorFlow's
ExponentialMovingAverage with num_updates, which timm's ModelEmaV2 warm-up follows in spirit). An update costs no
host-device sync: torch's AveragedModel would copy its CPU counter to the device at each one.
"""
import copy

import torch

from ..core import distributed
from ..core.errors import ConfigError


class WeightAverage:
    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0 <= decay < 1:
            raise ConfigError(f"train.ema_decay={decay}: the average keeps this share of itself each step, so it "
                              "must be below 1; try 0.9998 (timm's default), or 0 to validate the live weights")
        self.decay = decay
        live = distributed.unwrap(model)
        self.average = copy.deepcopy(live).requires_grad_(False) if decay else None
        self.updates = 0  # on the host: the decay it gives is a number, and reading it is no device sync
        # What validation scores: the average, or, without one, the model being trained.
        self.model = self.average if self.average is not None else model
        # The tensors each update blends (floating) or copies (BatchNorm's batch counts), paired once, here.
        pairs = list(zip([*self.average.parameters(), *self.average.buffers()],
                         [*live.parameters(), *live.buffers()])) if decay else []
        floating = [pair[0].is_floating_point() for pair in pairs]
        self.blended = [[pair[side] for pair, blend in zip(pairs, floating) if blend] for side in (0, 1)]
        self.copied = [[pair[side] for pair, blend in zip(pairs, floating) if not blend] for side in (0, 1)]

    def update(self) -> None:
        """After an optimizer step of the model it averages: one foreach lerp of its floating tensors, on their device,
        and a copy of the rest (BatchNorm's batch counts). The first update copies all."""
        if self.average is None:
            return
        kept = min(self.decay, (1 + self.updates) / (10 + self.updates)) if self.updates else 0.0
        with torch.no_grad():
            if self.blended[0]:
                torch._foreach_lerp_(*self.blended, 1 - kept)
            if self.copied[0]:
                torch._foreach_copy_(*self.copied)
        self.updates += 1

    def weights(self) -> dict[str, torch.Tensor]:
        """The averaged model's state dict, with the live model's keys; empty without an average."""
        return self.average.state_dict() if self.average is not None else {}

    def state_dict(self) -> dict:
        return {"weights": self.weights(), "updates": self.updates} if self.average is not None else {}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's average; one without (the run turned the average on at resume) starts it afresh."""
        if self.average is not None and state:
            self.average.load_state_dict(state["weights"])
            self.updates = int(state["updates"])
