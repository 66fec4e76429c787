"""The network: any torchvision classification model by name (`model.name=resnet50`)."""
import torch
import torchvision

from .config import ConfigError


def torchvision_model(name: str, num_classes: int, data_classes: int) -> torch.nn.Module:
    """A randomly initialised torchvision classifier with num_classes outputs (0 = data_classes)."""
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ConfigError(f"model.name={name} is not a torchvision classification model; "
                          f"pick one of {', '.join(available)}")
    num_classes = num_classes or data_classes
    if num_classes < data_classes:
        raise ConfigError(f"model.num_classes={num_classes} is smaller than the {data_classes} classes in the data")
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
