"""reduction=ordered: a step's gradients and BatchNorm's running statistics are the same bits on 1, 2, 3 and 4
processes that train the same micro-batches, dealt as the sampler deals them, a shorter last group included."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.data.sampling import dealt
from {{ cookiecutter.package }}.loop.ordered import OrderedGradients

MICRO_BATCH = 2
STEP = 24  # micro-batches per step: 24, 12, 8 and 6 on each of 1, 2, 3 and 4 processes
GROUPS = (STEP, 12)  # a whole step, then the epoch's shorter last group, which every count divides too


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5))


def micro_batches() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = sum(GROUPS) * MICRO_BATCH
    return (torch.randn(images, 3, 12, 12, generator=generator).split(MICRO_BATCH),
            torch.randint(0, 5, (images,), generator=generator).split(MICRO_BATCH))


def gradients(network: torch.nn.Module, world: World) -> list[list[torch.Tensor]]:
    """Each group's gradients and the running statistics after it, as this process sums them with the others' in
    two steps: its micro-batches those the sampler deals it (`dealt`)."""
    torch.set_num_threads(1)  # the same kernels in every process, to the bit
    images, labels = micro_batches()
    accumulation, steps, first = OrderedGradients(STEP // world.size, world), [], 0
    for group in GROUPS:
        for batch in range(group // world.size):
            index = first + dealt(batch, world.size, world.rank)
            with accumulation.syncing(network):
                loss = torch.nn.functional.cross_entropy(network(images[index]), labels[index])
                accumulation.add(loss, MICRO_BATCH).backward()
        accumulation.finish(None)
        steps.append([*(param.grad.clone() for param in network.parameters()),
                      *(buffer.clone() for buffer in network.buffers())])
        network.zero_grad(set_to_none=True)
        first += group
    return steps


def process(rank: int, processes: int, store: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=processes)
    results[rank] = gradients(DistributedDataParallel(model()), World(rank, rank, processes, torch.device("cpu")))
    dist.destroy_process_group()


@pytest.mark.full
@pytest.mark.parametrize("processes", [2, 3, 4])
def test_ordered_gradients_are_the_same_bits_on_any_number_of_processes(processes, tmp_path):
    alone = gradients(model(), World(0, 0, 1, torch.device("cpu")))
    results = mp.Manager().dict()
    mp.spawn(process, args=(processes, str(tmp_path / "store"), results), nprocs=processes, join=True)
    for rank in range(processes):
        for step, (theirs, ours) in enumerate(zip(results[rank], alone)):
            assert all(torch.equal(their, our) for their, our in zip(theirs, ours)), (rank, step)


def test_the_running_statistics_are_within_rounding_of_batchnorms_own_micro_batch_after_micro_batch():
    ordered, plain = model(), model()
    gradients(ordered, World(0, 0, 1, torch.device("cpu")))
    for images in micro_batches()[0]:  # every micro-batch in order, as BatchNorm keeps them without help
        plain(images)
    for ours, its in zip(ordered.buffers(), plain.buffers()):
        torch.testing.assert_close(ours, its)
    assert not torch.equal(ordered[1].running_mean, model()[1].running_mean)  # they moved
