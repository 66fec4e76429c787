"""The same run on any number of processes: with train.global_batch fixed, each step trains the same micro-batches
(data/sampling.py), draws the same mixes for them (loop/draws.py) and sums their gradients, so a step's weights
differ only by the order of floating-point sums."""
import pytest
import torch

from helpers.machines import TWO_PROCESSES
from helpers.processes import torchrun

# ResNet-18 with BatchNorm, fp32 on the CPU: one step of 16 images in micro-batches of 4, mixup and CutMix on. One
# process sums 4 micro-batches; two sum 2 each and all-reduce; four take one each.
ONE_STEP = ("model.name=resnet18", "train.batch_size=4", "train.global_batch=16", "train.max_steps=1",
            "train.mixup_alpha=0.2", "train.cutmix_alpha=1.0", "train.limit_val_batches=1")
TOLERANCE = 1e-5  # relative, each parameter tensor's norm
SAME_KERNELS = {"OMP_NUM_THREADS": "1"}  # as torchrun gives each process: each micro-batch's forward to the bit


def trained_parameters(run_dir) -> dict[str, torch.Tensor]:
    """The weights the run ended with, BatchNorm's running statistics left out: under DDP each process keeps its
    own, from its own micro-batches, and rank 0's are saved; training's forward pass does not read them."""
    weights = torch.load(run_dir / "last.pt", weights_only=False)["model"]
    return {name: value for name, value in weights.items() if not name.endswith(("running_mean", "running_var",
                                                                                  "num_batches_tracked"))}


def farthest(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    """The largest relative difference of a parameter tensor, by the norm of what the step changed in it."""
    return max(((ours[name] - theirs[name]).norm() / theirs[name].norm().clamp_min(1e-12)).item() for name in theirs)


@pytest.mark.full
@pytest.mark.parametrize("processes", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_a_step_of_a_global_batch_is_the_same_on_one_process_and_on_several(processes, tmp_path, train_cli):
    start, one, many = (tmp_path / name for name in ("start", "one", "many"))
    train_cli(start, *ONE_STEP, "optim.lr=1e-12", env=SAME_KERNELS)  # all but the initial weights
    train_cli(one, *ONE_STEP, env=SAME_KERNELS)
    train_cli(many, *ONE_STEP, launcher=torchrun(processes), env={**TWO_PROCESSES, **SAME_KERNELS})
    initial, single, several = map(trained_parameters, (start, one, many))
    step = {name: single[name] - initial[name] for name in single}
    assert farthest({name: several[name] - initial[name] for name in several}, step) < TOLERANCE
