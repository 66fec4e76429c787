"""Gradient accumulation (`train.accumulate`): the gradients of this many batches, summed, make one optimizer step,
so that a run whose batch does not fit in memory trains as with a batch that many times larger (timm's
--grad-accum-steps). Each batch's loss counts 1/accumulate of the step's, and under DistributedDataParallel only the
step's last batch all-reduces its gradients (no_sync before it).

An epoch whose batches do not divide evenly ends with a shorter group: its gradients are scaled up to the mean of
the batches it had, and under DistributedDataParallel, whose hooks skipped them, averaged over the processes here.
"""
from contextlib import AbstractContextManager, nullcontext

import torch

from ..core.distributed import World


class GradientAccumulation:
    def __init__(self, batches: int):
        self.batches = batches
        self.pending = 0  # batches whose gradients wait for the next optimizer step
        self.images = 0  # and their images, this process's

    def syncing(self, model: torch.nn.Module) -> AbstractContextManager:
        """Around a batch's forward and backward: DistributedDataParallel all-reduces only on the step's last."""
        last = self.pending + 1 == self.batches
        return nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()

    def add(self, loss: torch.Tensor, images: int) -> torch.Tensor:
        """The share of the step's loss that this batch of `images` images backs up."""
        self.pending, self.images = self.pending + 1, self.images + images
        return loss / self.batches

    @property
    def due(self) -> bool:
        """The step's batches are all in."""
        return self.pending == self.batches

    def finish(self, optimizer: torch.optim.Optimizer, world: World) -> int:
        """Before the optimizer steps: a short group's gradients made the mean of its batches, and the processes'.
        The group's images, which the step trains, this process's; the next group starts empty."""
        if self.pending < self.batches:
            grads = [param.grad for group in optimizer.param_groups for param in group["params"]
                     if param.grad is not None]
            for grad in grads:
                world.sum(grad)
            torch._foreach_mul_(grads, self.batches / (self.pending * world.size))
        images, self.pending, self.images = self.images, 0, 0
        return images
