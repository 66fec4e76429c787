"""Assembling the loaders: the data, format, staging, decoder and prefetcher options, each built from its own
node, into training and validation batches that reach the step as normalised float images on the device.

The loop sees `Loaders` and nothing of which options were picked.
"""
import random
import signal
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from .config import RANGES, build
from .data import Images, Splits, ToDevice, make_splits
from .distributed import EpochSampler, Shard, World
from .prefetcher import NoPrefetcher
from .workers import pick_num_workers


@dataclass
class Loaders:
    train: NoPrefetcher
    val: NoPrefetcher
    num_workers: int  # as given, or as loader.num_workers=auto measured it
    splits: Splits

    @property
    def classes(self) -> list[str]:
        return self.splits.classes

    def skipped_files(self, world: World) -> int:
        """Unreadable files met so far, counted once each across workers and processes."""
        return self.splits.skipped_files(world)


def seed_worker(worker_id: int) -> None:
    """Seed Python's and NumPy's generators from the per-worker, per-epoch seed torch gives each worker."""
    # Ctrl-C and Slurm's SIGTERM reach the workers too; the training process alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


def make_loader(dataset: Images | Dataset, batch_size: int, train: bool, seed: int, world: World,
                num_workers: int, prefetch_factor: int, pin_memory: bool, persistent_workers: bool,
                collate=None) -> DataLoader:
    """Training batches are shuffled and full, a different share per process; validation covers each image once.

    The training sampler (a DistributedSampler) serves a single process too (one replica needs no process
    group); its order depends only on seed and epoch, so a resumed run sees the order the uninterrupted
    one would have, from the batch where it stopped.
    """
    sampler = (EpochSampler(dataset, world.size, world.rank, shuffle=True, seed=seed, drop_last=True)
               if train else Shard(dataset, world))
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=train, num_workers=num_workers,
        collate_fn=collate, pin_memory=pin_memory and world.device.type == "cuda",
        prefetch_factor=prefetch_factor if num_workers else None,
        persistent_workers=persistent_workers and num_workers > 0,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed + world.rank),  # a new worker base seed each epoch
    )


def make_loaders(data: DictConfig, format: DictConfig, staging: DictConfig, decoder: DictConfig,
                 prefetcher: DictConfig, loader: DictConfig, batch_size: int, seed: int, world: World,
                 memory_format: torch.memory_format, worker_error_at: int = -1) -> Loaders:
    """Build each option from its node and put them together; `worker_error_at` is faults.worker_error_at."""
    source = build(data)
    stores = build(format, source=source, stage=build(staging, world=world))
    chosen = build(decoder)
    chosen.check_device(world.device)
    splits = make_splits(source, stores, chosen, seed)
    splits.train.fail_at = worker_error_at
    settings = {key: value for key, value in loader.items() if key != RANGES}
    non_blocking = settings.pop("non_blocking")
    settings["num_workers"] = pick_num_workers(
        settings["num_workers"], splits.train, batch_size, lambda count: make_loader(
            splits.train, batch_size, True, seed, world, collate=chosen.collate,
            **{**settings, "num_workers": count, "persistent_workers": False}))
    to_device = ToDevice(chosen, world.device, non_blocking, memory_format)
    train, val = [build(prefetcher, to_device=to_device, loader=make_loader(
        dataset, batch_size, training, seed, world, collate=chosen.collate, **settings))
        for dataset, training in ((splits.train, True), (splits.val, False))]
    return Loaders(train, val, settings["num_workers"], splits)
