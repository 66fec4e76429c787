"""The same run on any number of processes: with train.global_batch fixed, each step trains the same micro-batches
(data/sampling.py) and draws the same mixes for them (loop/draws.py). Under reduction=allreduce a step's weights
then differ only by the order of floating-point sums; under reduction=ordered, which sums the micro-batches'
gradients and replays their running statistics in one order, a run's model is the same bits after 30 steps, and
across requeues that change the count."""
import pytest
import torch

from helpers.machines import TWO_PROCESSES
from helpers.processes import torchrun
from helpers.runs import summary

# ResNet-18 with BatchNorm, fp32 on the CPU: one step of 16 images in micro-batches of 4, mixup and CutMix on. One
# process sums 4 micro-batches; two sum 2 each and all-reduce; four take one each.
ONE_STEP = ("model.name=resnet18", "train.batch_size=4", "train.global_batch=16", "train.max_steps=1",
            "train.mixup_alpha=0.2", "train.cutmix_alpha=1.0", "train.limit_val_batches=1")
TOLERANCE = 1e-5  # relative, each parameter tensor's norm
SAME_KERNELS = {"OMP_NUM_THREADS": "1"}  # as torchrun gives each process: each micro-batch's forward to the bit
# The same, its gradients summed in order, in micro-batches of 2 and steps of 8 images for 5 epochs of 48 images: 6
# steps an epoch, 30 in all.
THIRTY_STEPS = ("model.name=resnet18", "reduction=ordered", "data.train_per_class=16", "train.batch_size=2",
                "train.global_batch=8", "train.epochs=5", "train.mixup_alpha=0.2", "train.cutmix_alpha=1.0",
                "train.limit_val_batches=1")
# Micro-batches of 2 and 24 images a step, which 1, 2, 3 and 4 processes make up: 2 steps an epoch, 8 in all.
REQUEUED = ("model.name=resnet18", "reduction=ordered", "data.train_per_class=16", "train.batch_size=2",
            "train.global_batch=24", "train.epochs=4", "train.mixup_alpha=0.2", "train.cutmix_alpha=1.0",
            "train.limit_val_batches=1")


def saved_model(run_dir) -> dict[str, torch.Tensor]:
    """The model the run ended with: its weights and BatchNorm's running statistics."""
    return torch.load(run_dir / "last.pt", weights_only=False)["model"]


def trained_parameters(run_dir) -> dict[str, torch.Tensor]:
    """The weights the run ended with, BatchNorm's running statistics left out: under reduction=allreduce each
    process keeps its own, from its own micro-batches, and rank 0's are saved; training's forward pass does not read
    them."""
    return {name: value for name, value in saved_model(run_dir).items()
            if not name.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def differing(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> list[str]:
    """The tensors of the model, weights and running statistics, that differ in any bit."""
    assert ours.keys() == theirs.keys()
    return [name for name in theirs if not torch.equal(ours[name], theirs[name])]


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


def several(processes: int) -> dict:
    """train_cli's launcher and environment for `processes` processes with one thread each."""
    return {"launcher": torchrun(processes), "env": {**TWO_PROCESSES, **SAME_KERNELS}}


@pytest.mark.full
@pytest.mark.parametrize("processes", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_thirty_steps_summed_in_order_end_with_the_same_model_on_one_process_and_on_several(processes, tmp_path,
                                                                                              train_cli):
    one, many = tmp_path / "one", tmp_path / "many"
    train_cli(one, *THIRTY_STEPS, env=SAME_KERNELS)
    train_cli(many, *THIRTY_STEPS, **several(processes))
    assert summary(one).steps == summary(many).steps == 30
    assert differing(saved_model(many), saved_model(one)) == []


@pytest.mark.full
@pytest.mark.slow
def test_a_run_requeued_from_4_to_2_to_3_processes_ends_with_the_model_of_one_uninterrupted_process(tmp_path,
                                                                                                       train_cli):
    """Cut half-way through epoch 1 (its step 3 of 8) on 4 processes by train.max_steps; resumed on 2, which fail
    half-way through epoch 2 in the middle of a step's micro-batches (a loader error): its gradients are lost, and
    resumed on 3, the step starts again at its first micro-batch. Both epochs' coverage checks hold across the
    change."""
    alone, requeued = tmp_path / "alone", tmp_path / "requeued"
    train_cli(alone, *REQUEUED, env=SAME_KERNELS)
    train_cli(requeued, *REQUEUED, "train.max_steps=3", **several(4))
    # Each of 2 processes reads 12 images a step: its 30th is in the middle of the resumed run's third step.
    failed = train_cli(requeued, *REQUEUED, "resume=auto", "faults.worker_error_at=30", check=False, **several(2))
    assert failed.returncode != 0 and "faults.worker_error_at=30" in failed.stderr
    train_cli(requeued, *REQUEUED, "resume=auto", **several(3))
    epochs = summary(requeued).coverage
    assert [(entry["checked"], entry["trained"] + entry["trained_before_resume"] + entry["left_out"])
            for entry in epochs] == [(True, 48)] * 4
    assert [(entry["processes"], entry["trained_before_resume"]) for entry in epochs] == [(4, 0), (2, 24), (3, 24),
                                                                                          (3, 0)]
    assert differing(saved_model(requeued), saved_model(alone)) == []
