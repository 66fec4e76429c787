"""A fine-tune's warm-up with the backbone frozen (`train.freeze_epochs`): for the first epochs only the new
classifier head trains, so that its random start does not send large gradients through weights that are already
good; then everything trains.

Built before the loop, which tells it each epoch as it begins; with `train.freeze_epochs=0` it freezes nothing.
Frozen parameters take no gradient (the optimizer leaves them alone, weight decay and momentum included), and the
frozen layers run in eval mode, so that BatchNorm keeps its running statistics and dropout is off.
"""
import logging

import torch

from ..core.errors import ConfigError
from .model import find_head

log = logging.getLogger(__name__)


class FrozenBackbone:
    """Everything of `model` but its head (the last layer with `outputs` outputs, model.name `name`'s), frozen for
    the first `epochs` epochs; `pretrained`: whether the model starts from trained weights, the only ones worth
    freezing."""

    def __init__(self, model: torch.nn.Module, epochs: int, outputs: int, name: str, pretrained: bool):
        if epochs and not pretrained:
            raise ConfigError(f"train.freeze_epochs={epochs} freezes all but the head, and model.weights=null starts "
                              "them from random weights: pass model.weights (DEFAULT, pretrained or a file), or "
                              "train.freeze_epochs=0")
        self.epochs = epochs
        head = find_head(model, outputs, name) if epochs else ""

        def backbone(name: str) -> bool:
            return epochs > 0 and name != head and not name.startswith(f"{head}.")

        self.layers = [module for name, module in model.named_modules() if backbone(name)]
        self.parameters = [parameter for name, parameter in model.named_parameters()
                           if backbone(name) and parameter.requires_grad]
        if epochs:
            log.info("train.freeze_epochs=%d: only the head, %s, trains in the first %d epoch%s", epochs, head, epochs,
                     "s" if epochs > 1 else "")

    def set_epoch(self, epoch: int) -> None:
        """Freeze or thaw for `epoch`, after the model was put in training mode for it."""
        frozen = epoch < self.epochs
        for parameter in self.parameters:
            parameter.requires_grad_(not frozen)
        if frozen:
            for layer in self.layers:
                layer.training = False  # this layer alone: eval() would reach the head, a child of the model
