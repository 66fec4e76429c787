"""`model=torchvision`: any torchvision classification model by name (`model.name=resnet50`), randomly initialised
or from torchvision's weights by their name (`model.weights=DEFAULT`, `IMAGENET1K_V2`, ...), which torch hub
downloads once into its cache ($TORCH_HOME/hub/checkpoints) and reads from there after.
"""
import torch
import torchvision
from torch.hub import get_dir

from ...contracts import Network, Preprocessing
from ...core.errors import ConfigError
from ...contracts import Pretrained


class Torchvision(Network):
    def __init__(self, name: str, weights: str | None, num_classes: int, channels_last: bool, compile: bool,
                 compile_mode: str = "default"):  # absent from the checkpoints written before the key
        # channels_last, compile and compile_mode are the loop's: train.py reads them from the same node
        available = torchvision.models.list_models(module=torchvision.models)
        if name not in available:
            raise ConfigError(f"model.name={name} is not a torchvision classification model; "
                              f"pick one of {', '.join(available)}")
        self.name, self.weights, self.num_classes = name, weights, num_classes

    def architecture(self, classes: int) -> torch.nn.Module:
        return torchvision.models.get_model(self.name, weights=None, num_classes=classes)

    def library_weights(self) -> Pretrained:
        known = torchvision.models.get_model_weights(self.name)
        if self.weights not in known.__members__:
            raise ConfigError(f"model.weights={self.weights} is not one of torchvision's weights for {self.name}: pick "
                              f"{' or '.join(known.__members__)}, or pass a file")
        weights = known[self.weights]
        try:
            model = torchvision.models.get_model(self.name, weights=weights)
        except OSError as err:  # no network here, and nothing in torch hub's cache (URLError is an OSError)
            raise ConfigError(f"model.weights={self.weights}: could not download {weights.url} ({err}); without a "
                              f"network, put that file in {get_dir()}/checkpoints/, or pass model.weights=/path/to/"
                              "file") from err
        transform = weights.transforms()
        return Pretrained(model=model, classes=len(weights.meta["categories"]),
                          preprocessing=Preprocessing(mean=tuple(transform.mean), std=tuple(transform.std),
                                                      crop_size=transform.crop_size[0],
                                                      resize=transform.resize_size[0]))
