"""Which images each process trains on, and in which order: one permutation per epoch, strided over the processes."""
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from ..core.distributed import World


class EpochSampler(DistributedSampler):
    """DistributedSampler that can start its next epoch part-way, with as many processes as before or not.

    An epoch is one permutation of the data set whatever the number of processes, and rank r takes every
    world-th index of it from r, so what all processes together have trained on is always a prefix of it. A
    resumed run leaves out that prefix and strides over the rest with its own number of processes. The few
    images left over that do not divide among the processes sit out the epoch, as with drop_last.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Shuffle for `epoch`, leaving out its first `skip` images (those all processes trained on)."""
        super().set_epoch(epoch)
        self.skip = skip

    def __iter__(self):
        """(index, epoch) pairs: the data set seeds each image's augmentation from them."""
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        rest = order[self.skip:].tolist()
        return iter([(index, self.epoch) for index in rest[self.rank:len(self) * self.num_replicas:self.num_replicas]])

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
