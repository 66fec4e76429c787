"""`model=timm`: any of timm's models by name (`model.name=resnet18.a1_in1k`, the tag after the dot naming its
pretrained weights), randomly initialised or with those weights (`model.weights=pretrained`), which the Hugging Face
hub downloads once into its cache ($HF_HOME/hub) and reads from there after (HF_HUB_OFFLINE=1: from there only).
Needs the `timm` extra.
"""
import math

import torch

from ...contracts import Network, Preprocessing
from ...core.errors import ConfigError
from ...core.packages import optional_import
from ...contracts import Pretrained

PRETRAINED = "pretrained"  # model.weights' word for the weights model.name's tag names


class Timm(Network):
    def __init__(self, name: str, weights: str | None, num_classes: int, channels_last: bool, compile: bool,
                 compile_mode: str = "default"):  # absent from the checkpoints written before the key
        # channels_last, compile and compile_mode are the loop's: train.py reads them from the same node
        self.timm = optional_import("timm", "timm")
        if not self.timm.is_model(name):
            raise ConfigError(f"model.name={name} is not one of timm's models; timm.list_models('resnet*', "
                              "pretrained=True) lists some, with their weights' tags")
        self.name, self.weights, self.num_classes = name, weights, num_classes

    def architecture(self, classes: int) -> torch.nn.Module:
        return self.timm.create_model(self.name, pretrained=False, num_classes=classes)

    def library_weights(self) -> Pretrained:
        if self.weights != PRETRAINED:
            raise ConfigError(f"model.weights={self.weights}: timm's weights are model.weights={PRETRAINED} (the tag "
                              f"after the dot in model.name picks them: resnet18.a1_in1k), or pass a file")
        try:
            model = self.timm.create_model(self.name, pretrained=True)
        except (OSError, RuntimeError) as err:  # offline with nothing cached, or weights this name does not have
            raise ConfigError(f"model.weights={PRETRAINED} for {self.name}: timm could not load them "
                              f"({str(err).splitlines()[0]}); without a network, fill the Hugging Face cache "
                              "($HF_HOME/hub) on a machine with one, or pass model.weights=/path/to/file") from err
        config = self.timm.data.resolve_data_config({}, model=model)
        crop = config["input_size"][-1]
        return Pretrained(model=model, classes=model.pretrained_cfg["num_classes"],
                          preprocessing=Preprocessing(mean=tuple(config["mean"]), std=tuple(config["std"]),
                                                      crop_size=crop, resize=math.floor(crop / config["crop_pct"])))
