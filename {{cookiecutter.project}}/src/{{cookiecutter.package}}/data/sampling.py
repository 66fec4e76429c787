"""Which images each process trains on, and in which order: one permutation per epoch, strided over the processes."""
import itertools
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from ..contracts import Layout, Order
from ..core.distributed import World
from .order import FULL_SHUFFLE


class EpochSampler(DistributedSampler):
    """DistributedSampler that can start its next epoch part-way, with as many processes as before or not.

    An epoch is one permutation of the data set whatever the number of processes, and rank r takes every
    world-th index of it from r, so what all processes together have trained on is always a prefix of it. A
    resumed run leaves out that prefix and strides over the rest with its own number of processes. The few
    images left over that do not divide among the processes sit out the epoch, as with drop_last. The
    permutation is the order option's (data/order.py), told the layout of the processes and workers reading it.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, order: Order = FULL_SHUFFLE,
                 workers: int = 0, batch_size: int = 1):
        super().__init__(dataset, num_replicas, rank, seed=seed)
        self.order, self.layout = order, Layout(num_replicas, max(1, workers), batch_size)
        self.epoch_layout, self.resumed_layout = self.layout, None
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Shuffle for `epoch`, leaving out its first `skip` images (those all processes trained on). A resumed
        epoch is drawn for the layout it began with (`resume_layout`): an order laid out for the readers draws
        another permutation for others, and only the same one leaves out what was trained."""
        super().set_epoch(epoch)
        self.skip = skip
        self.epoch_layout, self.resumed_layout = self.resumed_layout or self.layout, None

    def resume_layout(self, layout: Layout) -> None:
        """The layout the epoch about to be resumed began with."""
        self.resumed_layout = layout

    def pairs(self, epoch: int, skip: int, layout: Layout) -> list[tuple[int, int]]:
        """(index, epoch) pairs of this process in `epoch` drawn for `layout`, after its first `skip` images: the data
        set seeds each image's augmentation from them."""
        order = self.order.permutation(len(self.dataset), torch.Generator().manual_seed(self.seed + epoch), layout)
        rest = order[skip:].tolist()
        count = max(0, len(self.dataset) - skip) // self.num_replicas
        return [(index, epoch) for index in rest[self.rank:count * self.num_replicas:self.num_replicas]]

    def __iter__(self):
        return iter(self.pairs(self.epoch, self.skip, self.epoch_layout))

    def epochs(self) -> Iterator[list[tuple[int, int]]]:
        """This epoch's pairs, then those of every later epoch, each as `set_epoch(epoch)` would give them."""
        yield self.pairs(self.epoch, self.skip, self.epoch_layout)
        for epoch in itertools.count(self.epoch + 1):
            yield self.pairs(epoch, 0, self.layout)

    def __len__(self) -> int:
        return max(0, len(self.dataset) - self.skip) // self.num_replicas


class Shard(Sampler[int]):
    """Every rank-th index from `rank`, in order and without padding, so validation counts each image once."""

    def __init__(self, dataset: Dataset, world: World):
        self.indices = range(world.rank, len(dataset), world.size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class EpochBatches(Sampler[list]):
    """The epoch sampler's batches, the last partial one left out. `endless`: epoch after epoch, so that workers kept
    between epochs start the next epoch's first batches while the training process ends this one and validates,
    instead of every epoch opening with the training process waiting for a first batch to decode."""

    def __init__(self, sampler: EpochSampler, batch_size: int, endless: bool):
        self.sampler, self.batch_size, self.endless = sampler, batch_size, endless

    def __iter__(self):
        for pairs in self.sampler.epochs() if self.endless else [list(self.sampler)]:
            for start in range(0, len(pairs) - self.batch_size + 1, self.batch_size):
                yield pairs[start:start + self.batch_size]

    def __len__(self) -> int:
        """Batches in the epoch set last."""
        return len(self.sampler) // self.batch_size
