"""A worker's batch buffers are used again only once the training process has released the batch in them."""
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package }}.data import batch_memory
from {{ cookiecutter.package }}.data.batch_memory import LENT_BUFFERS, WorkerBuffers, batch_buffer

BATCHES_PER_WORKER = 3 * LENT_BUFFERS


class Indices(Dataset):
    def __len__(self) -> int:
        return 2 * BATCHES_PER_WORKER * 4

    def __getitem__(self, index: int) -> int:
        return index


allocations = 0  # shared memory a worker allocated: each worker process counts its own


def counting(new_shared):
    def allocate(nbytes: int) -> torch.Tensor:
        global allocations
        allocations += 1
        return new_shared(nbytes)
    return allocate


def fill_with_first_index(indices: list[int]) -> tuple[torch.Tensor, int]:
    """A batch whose every byte is its first index, and the shared memory its worker has allocated so far."""
    images = batch_buffer((len(indices), 3, 5, 7))
    images.fill_(indices[0] % 256)
    return images, allocations


@pytest.fixture
def batches(monkeypatch):
    monkeypatch.setattr(batch_memory, "new_shared", counting(batch_memory.new_shared))
    return DataLoader(Indices(), batch_size=4, num_workers=2, prefetch_factor=2, collate_fn=fill_with_first_index,
                      timeout=60)


def test_a_batch_released_before_the_next_frees_its_buffer_for_the_worker(batches):
    counts = []
    for number, (images, allocated) in enumerate(batches):
        assert type(images) is torch.Tensor and images.shape == (4, 3, 5, 7)
        assert torch.all(images == number * 4 % 256), f"batch {number} was written over before it was taken"
        counts.append(allocated)
    assert len(counts) == 2 * BATCHES_PER_WORKER
    # Each worker allocated a buffer for each batch alive at once, then took them again, BATCHES_PER_WORKER times.
    assert max(counts) <= LENT_BUFFERS


def test_batches_the_training_process_keeps_are_never_written_again(batches):
    kept = list(batches)  # every batch held at once: each worker runs out of free buffers and allocates anew
    assert [int(images.flatten()[0]) for images, _ in kept] == [number * 4 % 256 for number in range(len(kept))]
    assert all(torch.all(images == images.flatten()[0]) for images, _ in kept)
    assert max(allocated for _, allocated in kept) == BATCHES_PER_WORKER


def test_a_buffer_is_free_once_its_last_view_is_released():
    buffers = WorkerBuffers()
    lent = buffers.lend((2, 8))
    received = ForkingPickler.loads(ForkingPickler.dumps(lent))  # as the training process unpickles it
    assert type(received) is torch.Tensor
    row = received[1]
    del received
    assert buffers.held[lent.index] == 1  # a view of the batch still holds it
    assert buffers.lend((2, 8)).index != lent.index
    del row
    assert buffers.held[lent.index] == 0
    again = buffers.lend((1, 8))  # a smaller batch fits the same buffer
    assert again.index == lent.index and again.data_ptr() == lent.data_ptr()


def test_a_batch_larger_than_every_free_buffer_gets_a_buffer_that_fits():
    buffers = WorkerBuffers()
    held = [ForkingPickler.loads(ForkingPickler.dumps(buffers.lend((16,)))) for _ in range(LENT_BUFFERS)]
    del held  # every buffer free, and each too small for what follows
    larger = buffers.lend((batch_memory.ROUND_TO + 1,))
    assert larger.shape == (batch_memory.ROUND_TO + 1,) and len(buffers.buffers) == LENT_BUFFERS
    assert buffers.buffers[larger.index].numel() == 2 * batch_memory.ROUND_TO
