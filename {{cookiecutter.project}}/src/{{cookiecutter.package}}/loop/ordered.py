"""`reduction=ordered`: every micro-batch's gradients summed one micro-batch at a time in the epoch's order, then
divided by their count. A sum in a fixed order gives the same bits whichever process computed each term, so a step
on 1, 2, 3 or 4 processes with the same train.global_batch gives the same gradients to the bit, and a run requeued
on another count stays the same run to the bit (docs/same-run.md).

One process needs nothing more: its backward passes add each micro-batch's gradients to the last's, in order.
Several each sum one shard of the parameters: after each micro-batch's backward pass, its gradients are cut into
one shard per process and sent on in the background, while the next micro-batch trains. At the step, each process
adds up its shard of every micro-batch in order, and the shards are gathered back. That moves about (batches + 1) ×
the gradients' size per process and step, where DDP's all-reduce moves about 2 ×, and each process holds its
micro-batches' gradients twice (sent and received) until the step.

BatchNorm's running statistics, which validation reads, follow the same rule (`RunningStatistics`).
"""
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from ..core.distributed import World
from ..data.sampling import dealt
from .accumulate import GradientAccumulation


class RunningStatistics:
    """BatchNorm's running statistics in the epoch's order: each micro-batch's forward pass updates them from the
    step's starting values, which are then put back, and at the step every process replays the micro-batches'
    updates one at a time in the epoch's order, each with the statistics its update weighed in. So they are the same
    bits on any number of processes, and within rounding of what BatchNorm itself would have kept, micro-batch after
    micro-batch. Norms that the step does not train (a frozen backbone's) keep theirs."""

    def __init__(self, model: torch.nn.Module):
        self.norms = [module for module in model.modules()
                      if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.track_running_stats]
        self.start: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # mean, variance, count: the step's
        self.trained: list[torch.nn.Module] = []  # the norms the step trains
        self.kept = torch.empty(0)  # [batches, values]: the trained norms' means and variances after each micro-batch

    def before(self) -> None:
        """At a step's first micro-batch: the values every micro-batch's update starts from."""
        self.start = [(norm.running_mean.clone(), norm.running_var.clone(), norm.num_batches_tracked.clone())
                      for norm in self.norms]

    def keep(self, batch: int, batches: int) -> None:
        """After micro-batch `batch`'s forward pass: its updated values kept, the step's starting values put back."""
        self.trained = [norm for norm in self.norms if norm.training]
        if not self.trained:
            return
        values = torch.cat([value for norm in self.trained for value in (norm.running_mean, norm.running_var)])
        if self.kept.shape != (batches, len(values)):
            self.kept = values.new_empty(batches, len(values))
        self.kept[batch] = values
        self.put_back()

    def put_back(self) -> None:
        """The step's starting values, back where a micro-batch's forward pass updated them."""
        for norm, (mean, variance, count) in zip(self.norms, self.start):
            norm.running_mean.copy_(mean)
            norm.running_var.copy_(variance)
            norm.num_batches_tracked.copy_(count)

    def replay(self, order: list[tuple[int, int, int]], world: World, batches: int) -> None:
        """Every process's micro-batches' updates, in `order` ((micro-batch, process, batch) from the first)."""
        if not self.trained:
            return
        every = [torch.empty_like(self.kept[:batches]) for _ in range(world.size)]
        world.gather_into(self.kept[:batches], into=every)
        started = dict(zip(self.norms, self.start))
        values = torch.cat([value for norm in self.trained for value in started[norm][:2]])
        counts = torch.cat([started[norm][2].expand(2 * len(norm.running_mean)) for norm in self.trained])
        momenta = torch.cat([torch.full((2 * len(norm.running_mean),), torch.nan if norm.momentum is None else
                                        norm.momentum, dtype=values.dtype) for norm in self.trained]).to(values.device)

        def factor(counts: torch.Tensor) -> torch.Tensor:  # as BatchNorm weighs a new batch: momentum, or 1 / count
            return torch.where(momenta.isnan(), 1 / (counts + 1).to(values.dtype), momenta)

        first = factor(counts)
        running = values.clone()
        for _, process, batch in order:
            statistics = (every[process][batch] - (1 - first) * values) / first  # the micro-batch's own
            weight = factor(counts)
            running = (1 - weight) * running + weight * statistics
            counts = counts + 1
        parts = iter(running.split([len(norm.running_mean) for norm in self.trained for _ in range(2)]))
        for norm in self.trained:
            norm.running_mean.copy_(next(parts))
            norm.running_var.copy_(next(parts))
            norm.num_batches_tracked += len(order)


class OrderedGradients(GradientAccumulation):
    def __init__(self, batches: int, world: World):
        super().__init__(batches, world)
        self.parameters: list[torch.nn.Parameter] = []  # those that train, in the model's order
        # On several processes: allocated at the first step, and reused from step to step.
        self.sent = torch.empty(0)  # [batches, processes × shard]: this process's micro-batches' gradients, flat
        self.received = torch.empty(0)  # [batches, processes, shard]: this process's shard of every process's
        self.summed = torch.empty(0)  # [shard]: this process's shard of the step's gradients
        self.total = torch.empty(0)  # [processes, shard]: the step's gradients, each shard summed by its process
        self.sending: list[dist.Work] = []
        self.statistics: RunningStatistics | None = None  # found in the model at its first micro-batch

    @contextmanager
    def syncing(self, model: torch.nn.Module) -> Iterator[None]:
        """Around a micro-batch's forward and backward, `add` called inside: DDP never all-reduces. One process
        lets the backward pass add each micro-batch's gradients to the last's, which is the order; several send
        each micro-batch's on, shard by shard."""
        if self.statistics is None:
            self.statistics = RunningStatistics(model)
        if self.pending == 0:
            self.statistics.before()
        self.parameters = [param for param in model.parameters() if param.requires_grad]
        with model.no_sync() if hasattr(model, "no_sync") else nullcontext():
            try:
                yield
            except BaseException:  # a checkpoint saved at the failure holds the step's starting statistics
                self.statistics.put_back()
                raise
        self.statistics.keep(self.pending - 1, self.batches)
        if self.world.size > 1:
            self.send(self.pending - 1)

    def send(self, batch: int) -> None:
        """This process's micro-batch `batch`'s gradients into their row of `sent`, and on in the background, a
        shard to each process. A parameter the micro-batch left unused counts zeros, as under DDP."""
        grads = [(param.grad if param.grad is not None else torch.zeros_like(param)).flatten()
                 for param in self.parameters]
        processes, size = self.world.size, sum(grad.numel() for grad in grads)
        shard = -(-size // processes)
        if self.total.shape != (processes, shard):  # the first step, or the first after a frozen backbone thaws
            self.sent = grads[0].new_zeros(self.batches, processes * shard)  # the last shard padded with zeros
            self.received = grads[0].new_empty(self.batches, processes, shard)
            self.summed, self.total = grads[0].new_empty(shard), grads[0].new_empty(processes, shard)
        torch.cat(grads, out=self.sent[batch, :size])
        for param in self.parameters:
            param.grad = None  # so that the next backward pass leaves its own, not a sum
        self.sending.append(self.world.exchange(self.sent[batch], into=self.received[batch].view(-1)))

    def add(self, loss: torch.Tensor, images: int) -> torch.Tensor:
        """The micro-batch's own loss: the step divides the sum of their gradients by their count at the end, by the
        same number on any layout."""
        super().add(loss, images)
        return loss

    def finish(self, optimizer: torch.optim.Optimizer) -> int:
        """Every micro-batch's gradients summed in the epoch's order (`dealt`: the step's micro-batch j is process
        j % processes's (j // processes)-th) and divided by their count, as the parameters' gradients: on several
        processes, each sums its shard of them, and the shards are gathered back."""
        processes = self.world.size
        order = sorted((dealt(batch, processes, process), process, batch)
                       for process in range(processes) for batch in range(self.pending))
        if processes == 1:  # the backward passes summed them in order
            for param in self.parameters:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
            sums = [param.grad for param in self.parameters]
        else:
            for work in self.sending:
                work.wait()
            self.sending = []
            _, process, batch = order[0]
            self.summed.copy_(self.received[batch, process])
            for _, process, batch in order[1:]:
                self.summed += self.received[batch, process]
            sums = [self.summed]
        torch._foreach_mul_(sums, 1 / len(order))  # one operation, element by element, whatever the layout
        if processes > 1:
            self.world.gather_into(self.summed, into=list(self.total))
            sizes = [param.numel() for param in self.parameters]
            for param, grad in zip(self.parameters, self.total.view(-1)[:sum(sizes)].split(sizes)):
                param.grad = grad.view_as(param)
        self.statistics.replay(order, self.world, self.pending)
        images, self.pending, self.images = self.images, 0, 0
        return images
