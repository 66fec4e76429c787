"""The training step's random draws (mixup and CutMix, dropout, stochastic depth), made from torch's generators,
which are seeded before each batch from the run's seed, this process's rank and the batch's place in the run: its
optimizer step and its place in that step's group (train.accumulate). So each process draws its own, as with timm's
seed + rank, and a resumed run draws what the uninterrupted one would have, with no generator state in the
checkpoint. The loader's crops and policies are seeded per image already (data/images.py)."""
import numpy as np
import torch


class BatchSeeds:
    def __init__(self, seed: int, rank: int):
        self.seed, self.rank = seed, rank

    def before(self, step: int, batch_in_step: int) -> None:
        """Seed torch's generators (the CPU's and every GPU's) for the batch at `step`, `batch_in_step`."""
        entropy = [self.seed, self.rank, step, batch_in_step]
        torch.manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]))
