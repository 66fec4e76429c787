"""order=blocks: whole windows per loader worker, each block read once in one request, batches nearly as mixed
as a full shuffle's, and a resumed epoch that trains each image left once."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from {{ cookiecutter.package }}.contracts import Layout, Store
from {{ cookiecutter.package }}.data.images import Images
from {{ cookiecutter.package }}.data.order import BlockOrder, BlockReads, RandomOrder
from {{ cookiecutter.package }}.data.sampling import EpochSampler
from {{ cookiecutter.package }}.tools.pack import write_order

BLOCKS = BlockOrder(block=4, window=2)


class WhoReads(Dataset):
    """Each (index, epoch) the sampler gives, as (index, the worker that got it)."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, key):
        return torch.tensor([key[0], get_worker_info().id])


def read_by(workers: int, processes: int, rank: int, skip: int = 0, began: Layout | None = None) -> list[tuple[int, int]]:
    sampler = EpochSampler(WhoReads(), processes, rank, 0, BLOCKS, workers, batch_size=3)
    if began:
        sampler.resume_layout(began)
    sampler.set_epoch(2, skip)
    loader = DataLoader(WhoReads(), batch_size=3, sampler=sampler, num_workers=workers, drop_last=True)
    return [tuple(pair.tolist()) for batch in loader for pair in batch]


@pytest.mark.parametrize("processes", [1, 2])
def test_each_block_is_read_by_one_worker_of_one_process(processes):
    readers = {}
    for rank in range(processes):
        for index, worker in read_by(2, processes, rank):
            readers.setdefault(index // BLOCKS.block, set()).add((rank, worker))
    assert len(readers) == 96 // BLOCKS.block and all(len(who) == 1 for who in readers.values()), readers
    assert len(set().union(*readers.values())) == 2 * processes  # and every worker of every process reads


def test_a_resumed_epoch_trains_each_image_left_once_on_any_layout():
    """Begun on two processes of two workers each, stopped after four batches each, resumed on one."""
    stopped = [index for index, _ in read_by(2, 2, rank=0)[:12] + read_by(2, 2, rank=1)[:12]]
    resumed = read_by(2, 1, rank=0, skip=24, began=Layout(2, 2, 3))
    assert sorted(stopped + [index for index, _ in resumed]) == list(range(96))
    redrawn = read_by(2, 1, rank=0, skip=24)  # for the layout it resumes on: another order, so not the rest
    assert sorted(stopped + [index for index, _ in redrawn]) != list(range(96))


def test_resumed_on_its_own_layout_each_block_is_still_read_by_one_worker():
    """Stopped after three batches: the loader's next batch goes to worker 0, which began with worker 1's."""
    stopped = read_by(2, 1, rank=0)[:9]
    resumed = read_by(2, 1, rank=0, skip=9, began=Layout(1, 2, 3))
    assert sorted(index for index, _ in stopped + resumed) == list(range(96))
    readers = {}
    for index, worker in resumed:
        readers.setdefault(index // BLOCKS.block, set()).add(worker)
    assert all(len(who) == 1 for who in readers.values()), readers


class Counted(Store):
    """A store that counts its reads of runs, and of single images."""

    def __init__(self, size: int):
        super().__init__(np.arange(size))
        self.runs, self.singles = [], 0

    def payload(self, index: int):
        self.singles += 1
        return f"image {index}"

    def payloads(self, start: int, stop: int):
        self.runs.append((start, stop))
        return [f"image {index}" for index in range(start, stop)]

    def name(self, index: int) -> str:
        return str(index)


def test_a_worker_reads_each_block_of_its_window_once_in_one_request():
    store = Counted(10)
    blocks = BlockReads(store, block=4, window=2)
    order = [5, 0, 6, 1, 4, 3, 7, 2, 9, 8]  # blocks 1 and 0 shuffled together, then block 2 (the short one)
    assert [blocks.read(index) for index in order] == [(f"image {index}", index) for index in order]
    assert store.runs == [(4, 8), (0, 4), (8, 10)] and store.singles == 0
    blocks.read(2)  # the next epoch: block 0 was read whole, so it is read again, not kept from before
    assert store.runs[-1] == (0, 4)


def test_a_block_left_part_read_at_the_end_of_an_epoch_does_not_serve_the_next():
    """drop_last leaves some images of an epoch unasked: their block must not outlive the epoch in the worker."""
    store = Counted(8)
    images = Images(BlockReads(store, block=4, window=2), transform=lambda payload: payload, on_error="skip")
    assert images[(1, 0)] == ("image 1", 1) and images[(2, 0)] == ("image 2", 2)  # 0 and 3 dropped
    assert images[(3, 1)] == ("image 3", 3)
    assert store.runs == [(0, 4), (0, 4)]


def distinct_classes_per_batch(labels: np.ndarray, order, batch_size: int = 64) -> float:
    drawn = labels[order.permutation(len(labels), torch.Generator().manual_seed(0), Layout(1, 2, batch_size))]
    batches = drawn[:len(drawn) // batch_size * batch_size].reshape(-1, batch_size)
    return float(np.mean([len(set(batch.tolist())) for batch in batches]))


def test_blocks_of_a_shuffled_pack_mix_classes_nearly_as_a_full_shuffle_does():
    """100 classes of 50 images, as pack writes them (shuffled) and as the tree lists them (class by class)."""
    by_class = np.repeat(np.arange(100), 50)
    packed = by_class[write_order(len(by_class), "train")]
    shuffled = distinct_classes_per_batch(packed, RandomOrder())
    default = BlockOrder(block=64, window=8)
    assert distinct_classes_per_batch(packed, default) > 0.95 * shuffled
    assert distinct_classes_per_batch(by_class, default) < 0.5 * shuffled  # why pack shuffles what it writes
