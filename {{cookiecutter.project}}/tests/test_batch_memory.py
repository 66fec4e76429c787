"""A training worker's batch buffers are used again only once the training process has released the batch in them."""
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package }}.core.distributed import ALONE
from {{ cookiecutter.package }}.data import batch_memory
from {{ cookiecutter.package }}.data.batch_memory import Lent, WorkerBuffers, batch_buffer
from {{ cookiecutter.package }}.data.decoder.batch import OneBuffer
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.format import folder
from {{ cookiecutter.package }}.data.images import make_splits
from {{ cookiecutter.package }}.data.loaders import make_loader, training_worker_start
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.staging import no_staging

PREFETCH = 2
LENT = PREFETCH + 2  # what training_worker_start keeps
BATCHES_PER_WORKER = 3 * LENT


class Indices(Dataset):
    def __len__(self) -> int:
        return 2 * BATCHES_PER_WORKER * 4

    def __getitem__(self, index: int) -> int:
        return index


allocations = 0  # shared memory a worker allocated: each worker process counts its own (forked, so patched too)


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


def batches(monkeypatch, persistent: bool = False) -> DataLoader:
    monkeypatch.setattr(batch_memory, "new_shared", counting(batch_memory.new_shared))
    return DataLoader(Indices(), batch_size=4, num_workers=2, prefetch_factor=PREFETCH,
                      collate_fn=fill_with_first_index, worker_init_fn=training_worker_start(PREFETCH),
                      persistent_workers=persistent, multiprocessing_context="fork", timeout=60)


def test_a_batch_dropped_when_the_next_is_taken_frees_its_buffer_for_the_worker(monkeypatch):
    counts = []
    for number, (images, allocated) in enumerate(batches(monkeypatch)):
        assert type(images) is torch.Tensor and images.shape == (4, 3, 5, 7)
        assert torch.all(images == number * 4 % 256), f"batch {number} was written over before it was taken"
        counts.append(allocated)
    assert len(counts) == 2 * BATCHES_PER_WORKER
    # The batch a worker collates, one it has prefetched and the one the loop holds: three buffers, reused.
    assert max(counts) <= PREFETCH + 1


def test_batches_the_training_process_keeps_are_never_written_again(monkeypatch):
    kept = list(batches(monkeypatch))  # every batch held at once: each worker runs out of free buffers
    assert [int(images.flatten()[0]) for images, _ in kept] == [number * 4 % 256 for number in range(len(kept))]
    assert all(torch.all(images == images.flatten()[0]) for images, _ in kept)
    assert max(allocated for _, allocated in kept) == BATCHES_PER_WORKER


def test_batches_an_epoch_left_early_had_made_free_their_buffers(monkeypatch):
    loader = batches(monkeypatch, persistent=True)
    for _ in range(3):  # each left after its first batch: the next epoch drops what the workers had made
        images, _ = next(iter(loader))
    del images
    counts = [allocated for _, allocated in loader]
    assert max(counts) <= LENT


def test_a_buffer_is_free_once_its_last_view_is_released():
    buffers = WorkerBuffers(LENT)
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
    buffers = WorkerBuffers(LENT)
    held = [ForkingPickler.loads(ForkingPickler.dumps(buffers.lend((16,)))) for _ in range(LENT)]
    del held  # every buffer free, and each too small for what follows
    larger = buffers.lend((batch_memory.ROUND_TO + 1,))
    assert larger.shape == (batch_memory.ROUND_TO + 1,) and len(buffers.buffers) == LENT
    assert buffers.buffers[larger.index].numel() == 2 * batch_memory.ROUND_TO


def reporting_lent(collate):
    """`collate`, and whether its batch's memory was lent."""
    def collate_and_report(samples):
        images, labels = collate(samples)
        return images, labels, isinstance(images.buffer if isinstance(images, OneBuffer) else images, Lent)
    return collate_and_report


@pytest.mark.parametrize("collate", ["cpu decoder", "batch decoder"])
def test_training_workers_lend_their_batches_and_validation_workers_do_not(tiny_root, collate):
    source = sources.folder(str(tiny_root), 32, 36, "raise")
    splits = make_splits(source, folder.Folder().stores(source, no_staging), PilDecoder())
    decoder_collate = PilDecoder().collate if collate == "cpu decoder" else \
        lambda samples: (OneBuffer([torch.zeros(4, dtype=torch.uint8) for _ in samples]), torch.tensor(0))
    lent = {train: [was_lent for *_, was_lent in make_loader(
        splits.train if train else splits.val, 4, train, 0, ALONE, num_workers=1, prefetch_factor=PREFETCH,
        pin_memory=False, persistent_workers=False, collate=reporting_lent(decoder_collate))]
        for train in (True, False)}
    assert lent[True] and all(lent[True])
    assert lent[False] and not any(lent[False])
