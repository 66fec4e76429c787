"""Epoch orders: the same seed draws the same order, ImageNet's blocks order is drawn well under a second, a worker
reads each run of its lane once, and blocks of a shuffled pack mix classes nearly as a full shuffle does."""
import time

import numpy as np
import pytest
import torch

from {{ cookiecutter.package }}.contracts import Layout, Store
from {{ cookiecutter.package }}.data.images import Images
from {{ cookiecutter.package }}.data.order import BlockOrder, BlockReads, RandomOrder
from {{ cookiecutter.package }}.tools.pack import write_order

from helpers.epochs import BLOCKS

def test_the_same_seed_draws_the_same_order_and_another_seed_another():
    for order in (RandomOrder(), BLOCKS):
        drawn = [order.draw(50, torch.Generator().manual_seed(seed), Layout(2, 3, 5)).indices for seed in (0, 0, 1)]
        assert sorted(drawn[0].tolist()) == list(range(50))
        assert (drawn[0] == drawn[1]).all() and not (drawn[0] == drawn[2]).all()


@pytest.mark.serial  # two draws timed in turn: another test's load would land on one more than the other
def test_the_blocks_order_of_imagenet_is_drawn_in_well_under_a_second():
    """What each process draws at every epoch's start; docs/benchmarks.md has the figure (scripts/order_speed.py)."""
    layout, generator = Layout(8, 8, 256), torch.Generator().manual_seed(0)
    BlockOrder(64, 8).draw(1_281_167, generator, layout)  # warm
    start = time.perf_counter()
    BlockOrder(64, 8).draw(1_281_167, generator, layout)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    RandomOrder().draw(1_281_167, generator, layout)
    # A ratio to a full shuffle drawn in the same test, not an absolute time: the machine's speed is not ours.
    assert seconds < 25 * (time.perf_counter() - start) + 0.05, seconds


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


def test_a_worker_reads_each_run_of_its_lane_once_in_one_request():
    store = Counted(10)
    blocks = BlockReads(store, block=4, window=2)
    keys = [(5, (4, 8)), (0, (0, 2)), (6, (4, 8)), (1, (0, 2)), (4, (4, 8)), (7, (4, 8)), (9, (8, 10)), (8, (8, 10))]
    assert [blocks.read(index, run) for index, run in keys] == [(f"image {index}", index) for index, _ in keys]
    assert store.runs == [(4, 8), (0, 2), (8, 10)] and store.singles == 0  # block 0's other run is another worker's
    blocks.read(2)  # asked without its run (an unreadable image's neighbour): its whole block
    assert store.runs[-1] == (0, 4)


def test_a_block_left_part_read_at_the_end_of_an_epoch_does_not_serve_the_next():
    """drop_last leaves some images of an epoch unasked: their block must not outlive the epoch in the worker."""
    store = Counted(8)
    images = Images(BlockReads(store, block=4, window=2), transform=lambda payload: payload, on_error="skip")
    assert images[(1, 0, 0, 4)] == ("image 1", 1) and images[(2, 0, 0, 4)] == ("image 2", 2)  # 0 and 3 dropped
    assert images[(3, 1, 0, 4)] == ("image 3", 3)
    assert store.runs == [(0, 4), (0, 4)]


def distinct_classes_per_batch(labels: np.ndarray, order, batch_size: int = 64) -> float:
    drawn = labels[order.draw(len(labels), torch.Generator().manual_seed(0), Layout(1, 2, batch_size)).indices]
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


def test_a_resume_on_another_layout_says_in_one_line_what_the_blocks_order_changes(caplog):
    """order=blocks draws its lanes for the processes and workers reading it; order=random draws one order for all."""
    from {{ cookiecutter.package }}.data.sampling import EpochSampler

    began, now = Layout(4, 2, 4), Layout(2, (1, 3), 4)
    with caplog.at_level("INFO"):
        EpochSampler(range(400), rank=0, seed=0, order=BLOCKS, layout=now).resume_layout(began)
        EpochSampler(range(400), rank=0, seed=0, order=BLOCKS, layout=now).resume_layout(now)  # nothing changes
        EpochSampler(range(400), rank=0, seed=0, order=RandomOrder(), layout=now).resume_layout(began)
    assert caplog.messages == [
        "order=blocks resumes on 2 processes with 1, 3 loader workers, and the epoch began on 4 processes with "
        "2, 2, 2, 2 loader workers: the rest of this epoch keeps its order, but the later epochs are drawn for the "
        "new layout, since each loader worker reads lanes of whole blocks, so they differ from those the first layout "
        "would have trained"]
