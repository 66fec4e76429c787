"""The learning-rate schedule, stepped once per batch."""
import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, steps_per_epoch: int,
                  warmup_epochs: float, warmup_start: float, min_lr_ratio: float) -> LambdaLR:
    """Linear warm-up over warmup_epochs, then half a cosine down to min_lr_ratio at total_steps."""
    warmup = min(int(warmup_epochs * steps_per_epoch), total_steps - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return warmup_start + (1 - warmup_start) * step / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
