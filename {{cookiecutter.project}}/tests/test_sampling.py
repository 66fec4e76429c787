"""The samplers: the layout the processes agree on, and the DataLoader's own workers reading each block as the
simulated turns of test_sampling_properties.py say they do."""
import zlib

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from {{ cookiecutter.package }}.contracts import Layout
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.data.order import FULL_SHUFFLE
from {{ cookiecutter.package }}.data.sampling import EpochBatches, EpochSampler, agreed_layout

from helpers.epochs import BLOCKS, Job, Sized, agreed, per_step

def test_the_processes_agree_on_their_worker_counts_and_refuse_another_data_set_in_one_line():
    assert agreed(100, [2, 0, 5], 4) == Layout(3, (2, 1, 5), 4)
    rows = [[2, 1000, 0], [2, 1000, 0], [2, 998, 0]]  # rank 2's copy of the data set lacks two images
    with pytest.raises(ConfigError, match=r"^the processes disagree on the number of training images: rank 0 \(host "
                                          r"node0\) has 1000 and rank 2 \(host node0\) 998; every node must see the "
                                          r"whole data set at data.root=/data/imagenet: copy all of it to each node's "
                                          r"disk, or put it on a volume every node mounts$"):
        agreed_layout(Job(rows), 2, 4, data={"the number of training images": 1000},
                      read_from="data.root=/data/imagenet", settings={"the seed": 0})
    rows = [[2, zlib.crc32(b"order=blocks {'block': 64}")], [2, zlib.crc32(b"order=blocks {'block': 32}")]]
    with pytest.raises(ConfigError, match=r"^the processes disagree on the order's settings: rank 0 \(host node0\) and "
                                          r"rank 1 \(host node0\) differ, rank 0 has order=blocks \{'block': 64\}; "
                                          r"every process must be given the same command line$"):
        agreed_layout(Job(rows), 2, 4, data={}, read_from="data.root=/data/imagenet",
                      settings={"the order's settings": "order=blocks {'block': 64}"})


class WhoReads(Dataset):
    """Each key the sampler gives, as (index, the worker that got it)."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, key):
        return torch.tensor([key[0], get_worker_info().id])


def read_by(workers: int, skip: int = 0, began: Layout | None = None) -> list[tuple[int, int]]:
    sampler = EpochSampler(WhoReads(), 0, 0, BLOCKS, Layout(1, workers, 3))
    if began:
        sampler.resume_layout(began)
    sampler.set_epoch(2, skip)
    loader = DataLoader(WhoReads(), batch_sampler=EpochBatches(sampler, endless=False), num_workers=workers)
    return [tuple(pair.tolist()) for batch in loader for pair in batch]


def test_real_workers_read_each_block_as_the_simulation_says():
    """The DataLoader's own workers: the turns the property tests simulate are the DataLoader's."""
    readers = {}
    for index, worker in read_by(2):
        readers.setdefault(index // BLOCKS.block, set()).add(worker)
    assert len(readers) == 96 // BLOCKS.block and all(len(who) == 1 for who in readers.values()), readers


def test_resumed_on_its_own_layout_each_block_is_still_read_by_one_worker():
    """Stopped after three batches: the loader's next batch goes to worker 0, which began with worker 1's."""
    stopped = read_by(2)[:9]
    resumed = read_by(2, skip=9, began=Layout(1, 2, 3))
    assert sorted(index for index, _ in stopped + resumed) == list(range(96))
    readers = {}
    for index, worker in resumed:
        readers.setdefault(index // BLOCKS.block, set()).add(worker)
    assert all(len(who) == 1 for who in readers.values()), readers


def steps_of(size: int, processes: int, global_batch: int, batch: int, skip: int = 0, steps: int | None = None,
             epoch: int = 3) -> list[set]:
    """Each optimizer step of the epoch's order, from `skip` images in: the micro-batches its processes train, each
    the tuple of its images in order, as the loop groups each process's batches (global_batch / (batch ×
    processes) a step)."""
    accumulate = per_step(global_batch, batch, processes)
    layout, shares = Layout(processes, (1,) * processes, batch), []
    for rank in range(processes):
        plan = EpochSampler(Sized(size), rank, 0, FULL_SHUFFLE, layout).plan(epoch, skip, layout)
        shares.append([tuple(plan.indices(number).tolist()) for number in range(plan.batches)])
    taken = [{share[number] for share in shares for number in range(step * accumulate, (step + 1) * accumulate)}
             for step in range(len(shares[0]) // accumulate)]
    return taken[:steps]


def test_a_global_batch_trains_the_same_micro_batches_each_step_on_1_2_3_and_4_processes():
    """96 images, micro-batches of 2, 24 images a step: each step's 12 micro-batches, each the same images in the
    same order, whether one process sums 12 of them or four processes 3 each."""
    one = steps_of(96, 1, 24, 2)
    assert len(one) == 4 and all(len(step) == 12 for step in one)
    for processes in (2, 3, 4):
        assert steps_of(96, processes, 24, 2) == one, processes


def test_a_run_cut_on_4_processes_resumed_on_2_then_cut_and_resumed_on_3_trains_the_uninterrupted_steps():
    """The images all processes trained before a cut are the order's first (one step's on 4 processes, then two
    more on 2): resumed on any number, the rest of the epoch's steps are the uninterrupted run's, and every image of
    the epoch is trained once."""
    whole = steps_of(96, 1, 24, 2)
    cut = [*steps_of(96, 4, 24, 2, steps=1), *steps_of(96, 2, 24, 2, skip=24, steps=2),
           *steps_of(96, 3, 24, 2, skip=72)]
    assert cut == whole
    assert sorted(index for step in cut for micro_batch in step for index in micro_batch) == list(range(96))
