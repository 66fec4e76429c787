"""train.accumulate: the summed gradients of k batches of b step the optimizer as one batch of k x b would, a
shorter last group included, and under DistributedDataParallel too, whichever `reduction` sums them;
train.global_batch, the accumulation that keeps a step's images on any number of processes."""
import re

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel

from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.loop.accumulate import GradientAccumulation
from {{ cookiecutter.package }}.options import CONF, options

from helpers.epochs import per_step

SINGLE = World(0, 0, 1, torch.device("cpu"))
REDUCTIONS = options("reduction")


def summing(reduction: str, batches: int, world: World = SINGLE) -> GradientAccumulation:
    """The `reduction` option's accumulation of `batches` batches per step on `world`'s processes."""
    return build(OmegaConf.load(CONF / "reduction" / f"{reduction}.yaml"), batches=batches, world=world)


def data(images: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(images, 6, generator=generator), torch.randint(0, 3, (images,), generator=generator)


def one_batch_gradient(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    return model.weight.grad.clone()


def accumulated_gradient(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, batch: int,
                         accumulation: GradientAccumulation) -> torch.Tensor:
    model.zero_grad()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for start in range(0, len(inputs), batch):
        with accumulation.syncing(model):
            loss = torch.nn.functional.cross_entropy(model(inputs[start:start + batch]), labels[start:start + batch])
            accumulation.add(loss, len(labels[start:start + batch])).backward()
        if accumulation.due:  # as the loop steps the optimizer: it trains the group's images
            assert accumulation.finish(optimizer) == batch * accumulation.batches
    if accumulation.pending:  # as the loop ends an epoch
        assert accumulation.finish(optimizer) == len(inputs) % (batch * accumulation.batches)
    return getattr(model, "module", model).weight.grad.clone()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("batches", [4, 3], ids=["k batches", "a shorter last group"])
def test_k_batches_of_b_give_the_gradient_of_one_batch_of_k_times_b(batches, reduction):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    inputs, labels = data(2 * batches)
    accumulation = summing(reduction, 4)
    accumulated = accumulated_gradient(model, inputs, labels, batch=2, accumulation=accumulation)
    torch.testing.assert_close(accumulated, one_batch_gradient(model, inputs, labels))
    assert accumulation.pending == 0
    assert not torch.allclose(accumulated, one_batch_gradient(model, inputs[:2], labels[:2]))  # not one batch's


class RecordsNoSync(torch.nn.Linear):
    def __init__(self):
        super().__init__(6, 3)
        self.unsynced = 0

    def no_sync(self):
        self.unsynced += 1
        return torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor)


def test_only_the_last_batch_of_a_step_all_reduces():
    model = RecordsNoSync()
    inputs, labels = data(16)
    accumulated_gradient(model, inputs, labels, batch=2, accumulation=GradientAccumulation(4, SINGLE))
    assert model.unsynced == 6  # 3 of each step's 4 batches, in 2 steps


def ddp_process(rank: int, store: str, reduction: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(6, 3))
    inputs, labels = data(24)
    mine = slice(rank * 12, rank * 12 + 6)  # 3 batches of 2: a group of 4 cut short
    grad = accumulated_gradient(model, inputs[mine], labels[mine], batch=2,
                                accumulation=summing(reduction, 4, World(rank, rank, 2, torch.device("cpu"))))
    results[rank] = grad
    dist.destroy_process_group()


@pytest.mark.full
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_under_ddp_a_short_group_is_averaged_over_the_processes_too(reduction, tmp_path):
    results = mp.Manager().dict()
    mp.spawn(ddp_process, args=(str(tmp_path / "store"), reduction, results), nprocs=2, join=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    inputs, labels = data(24)
    both = torch.cat([inputs[0:6], inputs[12:18]]), torch.cat([labels[0:6], labels[12:18]])
    expected = one_batch_gradient(model, *both)
    torch.testing.assert_close(results[0], expected)
    torch.testing.assert_close(results[1], expected)


@pytest.mark.parametrize("processes", [1, 2, 4, 8])
def test_a_global_batch_keeps_the_steps_images_on_any_number_of_processes(processes):
    assert processes * per_step(256, 32, processes) * 32 == 256
    assert per_step(None, 32, processes, accumulate=3) == 3  # no global batch: train.accumulate as given


@pytest.mark.parametrize(("global_batch", "batch_size", "processes"), [(256, 64, 3), (250, 64, 2), (100, 64, 1),
                                                                       (6, 4, 4)])
def test_a_global_batch_the_processes_cannot_make_up_is_refused_naming_sizes_that_fit(global_batch, batch_size,
                                                                                    processes):
    with pytest.raises(ConfigError) as refused:
        per_step(global_batch, batch_size, processes)
    message = str(refused.value)
    assert message.startswith(f"train.global_batch={global_batch} is not a whole number of train.batch_size="
                              f"{batch_size} batches on each of {processes} process"), message
    offered = re.findall(r"train\.(batch_size|global_batch)=(\d+(?: or \d+)*)", message.partition(": pass ")[2])
    assert [key for key, _ in offered] in (["global_batch"], ["batch_size", "global_batch"]), message
    for key, values in offered:
        for value in map(int, values.split(" or ")):  # each offer, taken, is accepted
            fixed = (global_batch, value) if key == "batch_size" else (value, batch_size)
            assert processes * per_step(*fixed, processes) * fixed[1] == fixed[0]


def test_a_global_batch_beside_an_accumulation_or_of_no_images_is_refused():
    with pytest.raises(ConfigError, match=r"^train.accumulate=2 and train.global_batch=64 both set the step"):
        per_step(64, 8, 2, accumulate=2)
    with pytest.raises(ConfigError, match=r"^train.global_batch=0 is not a number of images"):
        per_step(0, 8, 2)
