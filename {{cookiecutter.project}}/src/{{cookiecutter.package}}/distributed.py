"""One process per device under torchrun; a plain `python -m` run is a world of one.

    torchrun --standalone --nproc-per-node=8 -m {{ cookiecutter.package }}.train

Every rank resolves the same run folder: under torchrun it is named after the rendezvous id, which all
ranks (and an elastic restart of them) share, instead of a timestamp each rank would read for itself.
"""
import datetime
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DistributedSampler, Sampler

from .config import ConfigError


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

    def gather(self, values: list[float]) -> list[list[float]]:
        """Every process's `values` (as many on each), in rank order."""
        table = torch.zeros(self.size, len(values), dtype=torch.float64, device=self.device)
        table[self.rank] = torch.tensor(values, dtype=torch.float64)
        return self.sum(table).tolist()

    def any(self, flags: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum of `flags` over all processes: set where any process set it (in place)."""
        if self.size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return flags

    def max(self, value: float) -> float:
        """The largest `value` of any process."""
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        if self.size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def wrap(self, model: torch.nn.Module, sync_bn: bool) -> torch.nn.Module:
        """DDP around the model when there are several processes; BatchNorm statistics shared if `sync_bn`."""
        if self.size == 1:
            return model
        if sync_bn:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda" else None)


def linear_lr(base: float, reference_batch: int, *, _root_) -> float:
    """`base` per `reference_batch` images of the global batch, train.batch_size times the processes of the job
    (torchrun's WORLD_SIZE): the linear scaling rule of Goyal et al. (arXiv:1706.02677)."""
    return base * _root_.train.batch_size * int(os.environ.get("WORLD_SIZE", 1)) / reference_batch


def setup(timeout_min: float = 30.0) -> World:
    """Read torchrun's RANK, LOCAL_RANK and WORLD_SIZE; join the process group (NCCL on GPUs, gloo on CPUs).

    A collective, or joining the group, that waits longer than `timeout_min` fails instead of hanging,
    so that torchrun can restart the workers.
    """
    if "RANK" not in os.environ and "SUBMITIT_EXECUTOR" in os.environ:  # a Slurm task of hydra/launcher=slurm
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export()  # RANK, WORLD_SIZE, MASTER_ADDR, ... from Slurm's
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    size = int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if size > 1 and not dist.is_initialized():
        timeout = datetime.timedelta(minutes=timeout_min)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout,
                                store=restart_store(timeout), rank=rank, world_size=size)
    return World(rank, local_rank, size, device)


def restart_store(timeout: datetime.timedelta) -> dist.Store | None:
    """The key-value store the process group is set up through, kept apart for each elastic restart.

    torchrun hands its workers the rendezvous's TCP store, and keeps that same store across restarts
    (pytorch/pytorch#135712): a restarted group that joins through it can read the previous group's
    addresses and fail with "connectFullMesh ... Connection refused", or hang. On one node every worker
    has the same TORCHELASTIC_RESTART_COUNT, so it names a fresh key space for each restart. On several
    nodes it does not (only the failed node's agent counts the restart), so there restarts need torchrun
    to give each restart its own store: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
    None means torchrun's default (env://), which is right outside that case.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if int(os.environ.get("GROUP_WORLD_SIZE", 1)) > 1:
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0:
            raise ConfigError("torchrun --max-restarts on several nodes needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                              "in torchrun's environment, or restarted workers may join through stale addresses "
                              "(pytorch/pytorch#135712); scripts/launch.sh sets it")
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}", store)


def run_name() -> str:
    """The run folder's name: torchrun's rendezvous id, the same on every rank, or the start time."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    return f"torchrun-{run_id}" if run_id != "none" else time.strftime("%Y-%m-%d/%H-%M-%S")


def rank_suffix() -> str:
    """'' on rank 0, '-rank<N>' elsewhere: each rank's log file name."""
    rank = int(os.environ.get("RANK", 0))
    return f"-rank{rank}" if rank else ""


# The resolvers train.yaml and the recipes use, registered with the functions: every entry point that composes
# train.yaml imports this module, through its own imports or those of data.py.
OmegaConf.register_new_resolver("run_name", run_name, replace=True)
OmegaConf.register_new_resolver("rank_suffix", rank_suffix, replace=True)
OmegaConf.register_new_resolver("linear_lr", linear_lr, replace=True)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model itself, without torch.compile or DistributedDataParallel around it, for portable checkpoints."""
    model = getattr(model, "_orig_mod", model)  # what torch.compile wrapped
    return model.module if isinstance(model, DistributedDataParallel) else model


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


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
