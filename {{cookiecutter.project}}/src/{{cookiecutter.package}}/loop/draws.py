"""The training step's random draws (mixup and CutMix, dropout, stochastic depth), made from torch's generators,
which are seeded before each batch from the run's seed and the batch's place in the epoch's order: the micro-batch
it is (data/sampling.py's `dealt`). So each process draws its own, a run on another number of processes with the
same global batch draws the same for the same images, and a resumed run draws what the uninterrupted one would
have, with no generator state in the checkpoint. The loader's crops and policies are seeded per image already
(data/images.py)."""
import numpy as np
import torch

from ..data.sampling import dealt


class BatchSeeds:
    def __init__(self, seed: int, rank: int, processes: int, batch_size: int):
        self.seed, self.rank, self.processes, self.batch_size = seed, rank, processes, batch_size

    def micro_batch(self, images_in_epoch: int, batch_in_step: int) -> int:
        """The epoch's micro-batch this process trains as its `batch_in_step`-th batch of the step that starts
        `images_in_epoch` images into the epoch."""
        return images_in_epoch // self.batch_size + dealt(batch_in_step, self.processes, self.rank)

    def before(self, epoch: int, images_in_epoch: int, batch_in_step: int) -> None:
        """Seed torch's generators (the CPU's and every GPU's) for this process's batch `batch_in_step` of the step
        that starts `images_in_epoch` images into `epoch`."""
        entropy = [self.seed, epoch, self.micro_batch(images_in_epoch, batch_in_step)]
        torch.manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]))
