"""The network: any torchvision classification model by name (`model.name=resnet50`).

`model.channels_last=true` stores activations NHWC, the layout tensor-core convolutions want (the inputs
follow, converted on the device). `model.compile=true` applies torch.compile; the compilation is done by
a timed warm-up step before training, so its minutes never count as step time.
"""
import logging
import time

import torch
import torchvision

from ..core.config import ConfigError

log = logging.getLogger(__name__)


def torchvision_model(name: str, num_classes: int, data_classes: int, channels_last: bool,
                      compile: bool) -> torch.nn.Module:
    """A randomly initialised torchvision classifier with num_classes outputs (0 = data_classes).

    `compile` is applied by `compiled` once the model is on its device and wrapped for DDP.
    """
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ConfigError(f"model.name={name} is not a torchvision classification model; "
                          f"pick one of {', '.join(available)}")
    num_classes = num_classes or data_classes
    if num_classes < data_classes:
        raise ConfigError(f"model.num_classes={num_classes} is smaller than the {data_classes} classes in the data")
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def compiled(model: torch.nn.Module, enabled: bool, batch_shape: tuple[int, ...], precision,
             memory_format: torch.memory_format = torch.contiguous_format) -> torch.nn.Module:
    """torch.compile(model), compiled now on a batch of zeros, which leaves no trace: a training pass (forward
    and backward) and a validation one (forward without gradients), each a graph of its own.

    The zeros have the inputs' memory format: compiled for other strides, the first real step would compile
    again. The training pass updates the normalisation layers' running statistics, which are put back after it.
    """
    if not enabled:
        return model
    images = torch.zeros(batch_shape, device=next(model.parameters()).device).contiguous(
        memory_format=memory_format)  # only a compiled run needs it
    model = torch.compile(model)
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    start = time.perf_counter()
    model.train()
    with precision.autocast():
        output = model(images)
    output.float().sum().backward()
    model.eval()
    with torch.no_grad(), precision.autocast():
        model(images)
    if images.device.type == "cuda":
        torch.cuda.synchronize(images.device)
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    log.info("model.compile=true: compiled in %.1f s, before training; not counted in step times", seconds)
    return model
