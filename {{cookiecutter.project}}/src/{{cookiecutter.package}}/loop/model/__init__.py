"""The network: `model=<option>`, an architecture by name that starts from random weights, from its library's own
(`model.weights=DEFAULT` with torchvision, `pretrained` with timm) or from a local file, its classifier head then
fitted to the data's classes. Pick weights to fine-tune on a data set of your own (`experiment=finetune`).

What every option shares lives here: reading a weights file (a state_dict, a .safetensors file, or a checkpoint
this project wrote, which brings the preprocessing its weights were trained with), finding the head generically
(the last Linear layer, or 1x1 convolution, whose outputs are the weights' classes) and giving it the data's, and
building a checkpoint's model again for evaluate, predict and export. An option (loop/model/<option>.py, a
`Network`) says only what its library knows: the architecture, and its weights by name with their preprocessing.

`model.channels_last=true` stores activations NHWC, the layout tensor-core convolutions want (the inputs
follow, converted on the device). `model.compile=true` applies torch.compile (loop/compile.py).
"""
import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ...contracts import Network, Preprocessing, Pretrained
from ...core.config import build
from ...core.errors import ConfigError
from ...core.packages import optional_import
from ..checkpoint import Inference, load, validated_weights

log = logging.getLogger(__name__)

CPU = torch.device("cpu")
HEAD_PROBE = 1009  # outputs no hidden layer has: an architecture built with this many has them in its head alone


def load_weights(network: Network) -> Pretrained | None:
    """The weights model.weights names, in the architecture at their own class count; None to start from random."""
    if network.weights is None:
        return None
    path = Path(str(network.weights)).expanduser()
    if path.is_file():
        return from_file(network, path)
    if "/" in str(network.weights) or path.suffix:  # no library names its weights with a slash or a dot
        raise ConfigError(f"model.weights={network.weights}: no such file")
    return network.library_weights()


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], Preprocessing | None]:
    """A weights file's tensors by name, and the preprocessing it was trained with where it is a checkpoint of this
    project."""
    if path.suffix == ".safetensors":
        return optional_import("safetensors.torch", "timm").load_file(path), None
    held = load(path, CPU, "model.weights")
    inference = held.get("inference") if isinstance(held, dict) else None
    if isinstance(held, dict) and isinstance(held.get("model"), dict):  # a checkpoint of this project's
        held = validated_weights(held)
    if not isinstance(held, dict) or not all(isinstance(tensor, torch.Tensor) for tensor in held.values()):
        raise ConfigError(f"model.weights={path} holds no state_dict (tensors by name), nor a checkpoint of this "
                          "project")
    return held, Inference.from_state(inference).preprocessing if inference else None


def from_file(network: Network, path: Path) -> Pretrained:
    """The weights in a local file, loaded whole into the architecture with their own class count."""
    state, preprocessing = read_weights(path)
    model = network.architecture(HEAD_PROBE)
    head = find_head(model, HEAD_PROBE, network.name)
    if f"{head}.weight" not in state:
        raise ConfigError(f"model.weights={path} has no {head}.weight, the head of model.name={network.name}: it "
                          "holds another architecture; set model.name to the one its weights are for")
    classes = state[f"{head}.weight"].shape[0]
    replace_head(model, head, classes)
    mine = model.state_dict()
    differ = sorted(name for name in mine.keys() | state.keys()
                    if name not in mine or name not in state or mine[name].shape != state[name].shape)
    if differ:
        raise ConfigError(f"model.weights={path} does not fit model.name={network.name}: {len(differ)} tensors differ "
                          f"({', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''}); set model.name to the "
                          "architecture its weights are for")
    model.load_state_dict(state)
    return Pretrained(model=model, classes=classes, preprocessing=preprocessing)


def find_head(model: torch.nn.Module, outputs: int, name: str) -> str:
    """The classifier head's name: the last Linear layer, or 1x1 convolution, with `outputs` outputs."""
    heads = [layer for layer, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and module.out_features == outputs
             or isinstance(module, torch.nn.Conv2d) and module.kernel_size == (1, 1) and module.out_channels == outputs]
    if not heads:
        raise ConfigError(f"model.name={name} has no Linear layer or 1x1 convolution with {outputs} outputs, its "
                          "weights' classes: there is no classifier head to fit to the data's classes")
    return heads[-1]


def replace_head(model: torch.nn.Module, head: str, classes: int) -> None:
    """Give the layer named `head` `classes` outputs, newly initialised; every other layer keeps its weights."""
    parent, _, child = head.rpartition(".")
    old = model.get_submodule(head)
    bias = old.bias is not None
    new = (torch.nn.Linear(old.in_features, classes, bias=bias) if isinstance(old, torch.nn.Linear)
           else torch.nn.Conv2d(old.in_channels, classes, 1, bias=bias))
    setattr(model.get_submodule(parent), child, new.to(old.weight.device, old.weight.dtype))


def make_model(network: Network, pretrained: Pretrained | None, data_classes: int) -> torch.nn.Module:
    """The model to train: the pretrained one with its head fitted to the data's classes, or a random one with
    model.num_classes outputs (0: the data's)."""
    classes = network.num_classes or data_classes
    if classes < data_classes:
        raise ConfigError(f"model.num_classes={classes} is smaller than the {data_classes} classes in the data")
    if pretrained is None:
        return network.architecture(classes)
    model = pretrained.model
    if pretrained.classes != classes:
        head = find_head(model, pretrained.classes, network.name)
        replace_head(model, head, classes)
        log.info("model.weights=%s: every layer from its weights but the head, %s, new with %d outputs (the weights "
                 "had %d)", network.weights, head, classes, pretrained.classes)
    return model


def trained_model(state: dict, inference: Inference) -> torch.nn.Module:
    """A checkpoint's model, its architecture built again from the model option's settings, in eval mode."""
    network = build(OmegaConf.create({**inference.model, "weights": None}))  # the checkpoint has the weights
    model = network.architecture(network.num_classes or len(inference.classes))
    model.load_state_dict(validated_weights(state))
    return model.eval()
