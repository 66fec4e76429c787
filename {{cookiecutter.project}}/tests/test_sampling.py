"""The samplers: the DataLoader's own workers read each block of an epoch in blocks as the layout says they do."""
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from {{ cookiecutter.package }}.contracts import Layout
from {{ cookiecutter.package }}.data.sampling import EpochBatches, EpochSampler

from {{ cookiecutter.package }}.data.order import BlockOrder

BLOCKS = BlockOrder(block=4, window=2)

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


