"""One process per device under torchrun; a plain `python -m` run is a world of one.

    torchrun --standalone --nproc-per-node=8 -m {{ cookiecutter.package }}.train hydra.run.dir=outputs/ddp
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, Sampler


@dataclass
class World:
    rank: int
    local_rank: int
    size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of `tensor` over all processes (in place)."""
        if self.size > 1:
            dist.all_reduce(tensor)
        return tensor

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.size == 1:
            return model
        return DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda" else None)


def setup() -> World:
    """Read torchrun's RANK, LOCAL_RANK and WORLD_SIZE; join the process group (NCCL on GPUs, gloo on CPUs)."""
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    size = int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(rank, local_rank, size, device)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model itself, without torch.compile or DistributedDataParallel around it, for portable checkpoints."""
    model = getattr(model, "_orig_mod", model)  # what torch.compile wrapped
    return model.module if isinstance(model, DistributedDataParallel) else model


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class Shard(Sampler[int]):
    """Every rank-th index from `rank`, in order and without padding, so validation counts each image once."""

    def __init__(self, dataset: Dataset, world: World):
        self.indices = range(world.rank, len(dataset), world.size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
