"""The optimizer: SGD with Nesterov momentum, the ImageNet standard."""
import torch


def sgd(model: torch.nn.Module, lr: float, momentum: float, nesterov: bool, weight_decay: float) -> torch.optim.SGD:
    """Weight decay on conv and linear weights only: decaying norm scales and biases hurts accuracy."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov)
