"""Gradient accumulation (`train.accumulate`): the gradients of this many batches, summed, make one optimizer step,
so that a run whose batch does not fit in memory trains as with a batch that many times larger (timm's
--grad-accum-steps). Each batch's loss counts 1/accumulate of the step's, and under DistributedDataParallel only the
step's last batch all-reduces its gradients (no_sync before it).

An epoch whose batches do not divide evenly ends with a shorter group: its gradients are scaled up to the mean of
the batches it had, and under DistributedDataParallel, whose hooks skipped them, averaged over the processes here.
"""
from contextlib import AbstractContextManager, nullcontext

import torch
from omegaconf import DictConfig

from ..core.distributed import World
from ..core.errors import ConfigError


def batches_per_step(train: DictConfig, processes: int) -> int:
    """The batches each process sums into a step: train.accumulate, or where train.global_batch is set, as many as
    make that many images a step on `processes` processes. A run defined by its global batch keeps its steps when it
    runs, or resumes, on another number of processes. A global batch that the processes' batches cannot make up is
    refused in one line naming the sizes that fit."""
    images, batch = train.global_batch, train.batch_size
    if images is None:
        return train.accumulate
    if isinstance(images, bool) or not isinstance(images, int) or images < 1:
        raise ConfigError(f"train.global_batch={images} is not a number of images: pass a whole number of at least 1, "
                          "or null to step every train.accumulate batches")
    if train.accumulate != 1:
        raise ConfigError(f"train.accumulate={train.accumulate} and train.global_batch={images} both set the step: "
                          "pass one of them (with train.global_batch, the accumulation follows from the process count)")
    if images % (batch * processes):
        fitting = [size for size in range(1, images // processes + 1) if images % (size * processes) == 0]
        nearest = sorted({size for size in [max((size for size in fitting if size < batch), default=None),
                                            min((size for size in fitting if size > batch), default=None)] if size})
        near = sorted({max(1, images // (batch * processes)), images // (batch * processes) + 1})
        instead = f"train.batch_size={' or '.join(map(str, nearest))}, or " if nearest else ""
        raise ConfigError(f"train.global_batch={images} is not a whole number of train.batch_size={batch} batches on "
                          f"each of {processes} process{'es' * (processes > 1)}: pass {instead}train.global_batch="
                          f"{' or '.join(str(rounds * batch * processes) for rounds in near)}")
    return images // (batch * processes)


class GradientAccumulation:
    def __init__(self, batches: int, world: World):
        self.batches, self.world = batches, world
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

    def finish(self, optimizer: torch.optim.Optimizer) -> int:
        """Before the optimizer steps: a short group's gradients made the mean of its batches, and the processes'.
        The group's images, which the step trains, this process's; the next group starts empty."""
        if self.pending < self.batches:
            grads = [param.grad for group in optimizer.param_groups for param in group["params"]
                     if param.grad is not None]
            for grad in grads:
                self.world.sum(grad)
            torch._foreach_mul_(grads, self.batches / (self.pending * self.world.size))
        images, self.pending, self.images = self.images, 0, 0
        return images
