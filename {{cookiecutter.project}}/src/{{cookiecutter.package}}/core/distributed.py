"""One process per device under torchrun; a plain `python -m` run is a world of one.

    torchrun --standalone --nproc-per-node=8 -m {{ cookiecutter.package }}.train
"""
import datetime
import logging
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .errors import ConfigError


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

    def exchange(self, tensor: torch.Tensor, into: torch.Tensor) -> dist.Work:
        """Cut `tensor` into one equal part per process and send part p to process p: `into`, of its shape, gets
        each process's part for this one, in rank order. It runs in the background; wait on what this returns.
        Several processes only."""
        return dist.all_to_all_single(into, tensor, async_op=True)

    def gather_into(self, tensor: torch.Tensor, into: list[torch.Tensor]) -> None:
        """Every process's `tensor` (of one shape on all of them) into `into`, a tensor per process in rank order."""
        if self.size == 1:
            into[0].copy_(tensor)
            return
        dist.all_gather(into, tensor)

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

    def from_main(self, value):
        """Rank 0's `value`, in every process."""
        values = [value]
        if self.size > 1:
            dist.broadcast_object_list(values, src=0)
        return values[0]

    def hosts(self) -> list[str]:
        """Every process's host name, in rank order."""
        names = [socket.gethostname()] * self.size
        if self.size > 1:
            dist.all_gather_object(names, names[self.rank])
        return names

    def wrap(self, model: torch.nn.Module, sync_bn: bool, partly_frozen: bool = False) -> torch.nn.Module:
        """DDP around the model when there are several processes; BatchNorm statistics shared if `sync_bn`.
        `partly_frozen`: some parameters take no gradient for a while (train.freeze_epochs), which DDP, waiting for
        every parameter's gradient, must then look for at each step."""
        if self.size == 1:
            return model
        if sync_bn:
            if self.device.type != "cuda":
                raise ConfigError(f"distributed.sync_bn=true shares BatchNorm statistics over NCCL, and these "
                                  f"processes run on the {self.device.type}: pass distributed.sync_bn=false")
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda" else None,
                                       find_unused_parameters=partly_frozen)


def check_shared(run_dir: Path, world: World) -> None:
    """Stop every process in one line where the run folder is not one folder for all of them: each writes a token
    into it, and rank 0 must see every token. Nodes that each write a folder of their own would each keep checkpoints
    the others cannot resume from."""
    if world.size == 1:
        return
    start = world.from_main(secrets.token_hex(4))  # this start's tokens alone: an earlier start's may lie there
    tokens = run_dir / ".processes"
    tokens.mkdir(parents=True, exist_ok=True)
    (tokens / f"{start}-{world.rank}").touch()
    world.sum(torch.zeros(1, device=world.device))  # every token written before rank 0 looks
    hosts, refusal = world.hosts(), None
    if world.is_main:
        written = list(tokens.glob(f"{start}-*"))
        unseen = sorted(set(range(world.size)) - {int(path.name.rpartition("-")[2]) for path in written})
        if unseen:
            names = ", ".join(sorted({hosts[rank] for rank in unseen}))
            refusal = (f"the run folder {run_dir} is not one folder for every node: rank 0 (host {hosts[0]}) does not "
                       f"see what rank{'s' * (len(unseen) > 1)} {', '.join(map(str, unseen))} (host {names}) wrote "
                       "there, so each node would keep checkpoints the others cannot resume from: put hydra.run.dir "
                       "on a file system every node mounts (NFS, a shared volume)")
        for path in written:
            path.unlink()
        if not any(tokens.iterdir()):
            tokens.rmdir()
    refusal = world.from_main(refusal)
    if refusal:
        raise ConfigError(refusal)


class RankFilter(logging.Filter):
    """The console's filter (conf/train.yaml): every line of rank 0, and of the other ranks their warnings and errors
    alone, since a failure or a slow disk that one rank meets must reach the user; all of every rank's lines with
    `all_ranks` (distributed.log_all_ranks). The rank is read at each line, because under hydra/launcher=slurm it is
    set only once the task has started (`setup`). Each rank's log file keeps all its lines whatever this says."""

    def __init__(self, all_ranks: bool = False):
        super().__init__()
        self.all_ranks = all_ranks

    def filter(self, record: logging.LogRecord) -> bool:
        return self.all_ranks or record.levelno >= logging.WARNING or int(os.environ.get("RANK", 0)) == 0


ALONE = World(rank=0, local_rank=0, size=1, device=torch.device("cpu"))  # one process on the CPU, as the tools read


def setup(timeout_min: float = 30.0, run_dir: Path | None = None) -> World:
    """Read torchrun's RANK, LOCAL_RANK and WORLD_SIZE; join the process group (NCCL on GPUs, gloo on CPUs).

    A collective, or joining the group, that waits longer than `timeout_min` fails instead of hanging,
    so that torchrun can restart the workers. With NCCL, the flight recorder dumps into `run_dir` on a timeout.
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
        if device.type == "cuda" and run_dir is not None:
            record_flight(run_dir)
        timeout = datetime.timedelta(minutes=timeout_min)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout,
                                store=restart_store(timeout), rank=rank, world_size=size)
    return World(rank, local_rank, size, device)


FLIGHT_RECORDER_ENTRIES = 2000  # collectives kept per rank, as torchtitan keeps them


def record_flight(run_dir: Path) -> None:
    """Turn on PyTorch's NCCL flight recorder (before the group starts): each rank keeps its last collectives, with
    their state and call stacks, and writes them to `run_dir`/nccl_trace_rank_<N> when a collective times out.
    Read the dumps with `python -m torch.distributed.flight_recorder.fr_trace <run_dir> --prefix nccl_trace_rank_`.
    What the user set in the environment wins. Both names of each setting: PyTorch renamed them in 2.7."""
    for names, value in ((("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), str(FLIGHT_RECORDER_ENTRIES)),
                         (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
                         (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
                          str(run_dir / "nccl_trace_rank_"))):
        if not any(name in os.environ for name in names):
            os.environ.update(dict.fromkeys(names, value))


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


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model itself, without torch.compile or DistributedDataParallel around it, for portable checkpoints."""
    model = getattr(model, "_orig_mod", model)  # what torch.compile wrapped
    return model.module if isinstance(model, DistributedDataParallel) else model


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
