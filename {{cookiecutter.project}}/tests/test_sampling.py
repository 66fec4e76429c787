"""The samplers: the layout the processes agree on, and the DataLoader's own workers reading each block as the
simulated turns of test_sampling_properties.py say they do."""
import zlib

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from {{ cookiecutter.package }}.contracts import Layout
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.data.sampling import EpochBatches, EpochSampler, agreed_layout

from helpers.epochs import BLOCKS, Job, agreed

def test_the_processes_agree_on_their_worker_counts_and_refuse_another_data_set_in_one_line():
    assert agreed(100, [2, 0, 5], 4) == Layout(3, (2, 1, 5), 4)
    rows = [[2, 1000, 0], [2, 1000, 0], [2, 998, 0]]  # rank 2's copy of the data set lacks two images
    with pytest.raises(ConfigError, match=r"^the processes disagree on the number of training images: rank 0 \(host "
                                          r"node0\) has 1000 and rank 2 \(host node0\) 998; every process must read"):
        agreed_layout(Job(rows), 2, 4, {"the number of training images": 1000, "the seed": 0})
    rows = [[2, zlib.crc32(b"order=blocks {'block': 64}")], [2, zlib.crc32(b"order=blocks {'block': 32}")]]
    with pytest.raises(ConfigError, match=r"^the processes disagree on the order's settings: rank 0 \(host node0\) and "
                                          r"rank 1 \(host node0\) differ, rank 0 has order=blocks \{'block': 64\}; "):
        agreed_layout(Job(rows), 2, 4, {"the order's settings": "order=blocks {'block': 64}"})


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


