"""The optimizers: SGD with Nesterov momentum, the ImageNet standard, and AdamW, the usual one for vision
transformers and for fine-tuning. Both decay conv and linear weights only, and none a model names in its own
no_weight_decay(). optim.fused picks torch's fused kernel, one launch updating every parameter, over its default
foreach kernels."""
import fnmatch
from collections.abc import Sequence

import torch

from ..core import distributed
from ..core.errors import ConfigError


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on conv and linear weights only: decaying norm scales and biases hurts accuracy. A model that
    names what it keeps from decay (timm's `no_weight_decay()`: a vision transformer's position embedding and class
    token, whose ndim is 3) is asked too."""
    own = distributed.unwrap(model)
    spared = set(own.no_weight_decay()) if callable(getattr(own, "no_weight_decay", None)) else set()
    decay, no_decay = [], []
    for name, param in own.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 or named_in(name, spared) else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def named_in(name: str, patterns: set[str]) -> bool:
    """Whether the parameter `name`, or a module that holds it, matches one of `patterns` with fnmatch's wildcards,
    as timm matches them: XCiT names its position encoding's parameters 'pos_embed.*', and a model that names the
    module, 'pos_embed', means all of them too (timm itself matches parameter names only)."""
    parts = name.split(".")
    holders = [".".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(holder, pattern) for holder in holders for pattern in patterns)


KERNEL = ("fused", "foreach")  # a parameter group's keys that pick how the update runs, not what it computes


def keeping_its_kernel(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer`, whose kernel stays the one this run asked for when it loads a checkpoint: torch's load_state_dict
    takes every key of the saved parameter groups, so a run resumed with optim.fused=true would step with the
    kernel of the run that saved. Each state's `step` moves to where this kernel keeps it, too."""
    built = [{key: group[key] for key in KERNEL if key in group} for group in optimizer.param_groups]

    def restore(loaded: torch.optim.Optimizer) -> None:
        for group, kernel in zip(loaded.param_groups, built):
            group.update(kernel)
            for param in group["params"]:
                state = loaded.state.get(param, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = placed_step(state["step"], param, group)

    optimizer.register_load_state_dict_post_hook(restore)
    return optimizer


def placed_step(step: torch.Tensor, param: torch.Tensor, group: dict) -> torch.Tensor:
    """`step` where a fresh optimizer of `group`'s kernel puts it (torch's note "special device hosting for step"):
    a fused kernel reads it as float32 on the parameter's device, a capturable one on that device too, and the
    others on the host, where reading it costs no sync. torch's load_state_dict places it by the saved run's kernel
    instead, so a fused run resumed from a foreach one would fail its first step on a GPU, and the other way round
    would sync once per parameter at every step."""
    if group.get("fused"):
        return step.to(dtype=torch.float32, device=param.device)
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # as torch's own init
    return step.to(dtype=dtype, device=param.device if group.get("capturable") else "cpu")


def sgd(model: torch.nn.Module, lr: float, momentum: float, nesterov: bool, weight_decay: float,
        fused: bool) -> torch.optim.SGD:
    return keeping_its_kernel(torch.optim.SGD(decay_groups(model, weight_decay), lr=lr, momentum=momentum,
                                              nesterov=nesterov, fused=fused))


def adamw(model: torch.nn.Module, lr: float, betas: list[float], eps: float, weight_decay: float,
          fused: bool) -> torch.optim.AdamW:
    """torch's AdamW, its decay decoupled from the gradient as Loshchilov and Hutter define it."""
    if not (isinstance(betas, Sequence) and len(betas) == 2
            and all(isinstance(beta, (int, float)) and 0 <= beta < 1 for beta in betas)):
        shown = list(betas) if isinstance(betas, Sequence) and not isinstance(betas, str) else betas
        raise ConfigError(f"optim.betas={shown} must be two numbers from 0 up to, not including, 1, such as "
                          "[0.9,0.999]")
    return keeping_its_kernel(torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps,
                                                fused=fused))
