"""The resolvers the YAML files use, registered on import: options.py, which every entry point imports for the
config folder, imports this module.

Every rank resolves the same run folder: under torchrun it is named after the rendezvous id, which all ranks
(and an elastic restart of them) share, instead of a timestamp each rank would read for itself.
"""
import os
import time

from omegaconf import OmegaConf

def linear_lr(base: float, reference_batch: int, *, _root_) -> float:
    """`base` per `reference_batch` images of the global batch, train.batch_size times the processes of the job
    (torchrun's WORLD_SIZE): the linear scaling rule of Goyal et al. (arXiv:1706.02677)."""
    return base * _root_.train.batch_size * int(os.environ.get("WORLD_SIZE", 1)) / reference_batch


CROP_SHARE = 0.875  # of the validation image's shorter side that its centre crop keeps: ImageNet's 224 of 256


def resize_for(crop_size: int) -> int:
    """data.val_resize where none is set: the shorter side whose centre crop of `crop_size` keeps CROP_SHARE of it."""
    return round(crop_size / CROP_SHARE)


NO_RENDEZVOUS_ID = "none"  # what torchrun sets TORCHELASTIC_RUN_ID to when the job was given no --rdzv-id


def run_name() -> str:
    """The run folder's name: torchrun's rendezvous id, the same on every rank, or the start time."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", NO_RENDEZVOUS_ID)
    return f"torchrun-{run_id}" if run_id != NO_RENDEZVOUS_ID else time.strftime("%Y-%m-%d/%H-%M-%S")


def rank_suffix() -> str:
    """'' on rank 0, '-rank<N>' elsewhere: each rank's log file name. Hydra names the file before a task of
    hydra/launcher=slurm has set RANK (core/distributed.py: setup), so there Slurm's task number stands in for it."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
    return f"-rank{rank}" if rank else ""


def rank_label() -> str:
    """'' on rank 0, '[rank <N>]' elsewhere: a log line's origin on a console every process writes to."""
    rank = int(os.environ.get("RANK", 0))
    return f"[rank {rank}]" if rank else ""


OmegaConf.register_new_resolver("run_name", run_name, replace=True)
OmegaConf.register_new_resolver("rank_suffix", rank_suffix, replace=True)
OmegaConf.register_new_resolver("rank_label", rank_label, replace=True)
OmegaConf.register_new_resolver("linear_lr", linear_lr, replace=True)
OmegaConf.register_new_resolver("resize_for", resize_for, replace=True)
