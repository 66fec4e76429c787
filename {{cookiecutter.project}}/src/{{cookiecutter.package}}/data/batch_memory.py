"""The shared memory a loader worker assembles each batch in, used again once the training process has let go of it.

A worker hands its batch over in shared memory, as default_collate does: the training process maps the same pages,
with no copy. New shared memory each batch is what default_collate allocates, and it is dear: the kernel
allocates, zeroes and maps a new page 4 KiB at a time as the collate first writes it, 8.8 ms for a batch of 64
224 px crops on a 2-core VM, 137 µs an image, beside each image's decode of about 1.2 ms (docs/benchmarks.md).

So a worker whose loader asks for it (`lend_batches`, at the worker's start) keeps a few buffers. A batch in one of
them travels as a `Lent` tensor, which carries the buffer's number and the worker's flags (one shared byte per
buffer) with it. The training process rebuilds it as a plain tensor and sets the buffer's flag back to free when
that tensor's memory is released, every view of it included, whether the step took it or pin_memory copied it. A
worker never writes a buffer whose flag is set, and when all of them are, it allocates new shared memory as
before: a batch that the training process keeps is never overwritten, and nothing waits. The buffers stay
allocated for the worker's life, idle or not.
"""
import math
import weakref
from multiprocessing.reduction import ForkingPickler

import torch
from torch.utils.data import get_worker_info

ROUND_TO = 1 << 20  # buffers round up to whole MiB, so that a batch of encoded files a little larger fits next time


class Lent(torch.Tensor):
    """A batch in one of a worker's reused buffers; unpickled, a plain tensor that frees the buffer when released."""
    __torch_function__ = torch._C._disabled_torch_function_impl  # a tensor in all else, at no dispatch cost
    flags: torch.Tensor
    index: int


def receive(images: torch.Tensor, flags: torch.Tensor, index: int) -> torch.Tensor:
    """The training process's side of a `Lent` batch: a tensor over the same memory whose release frees the
    buffer. torch.from_numpy holds the array until the tensor's storage is freed, the last view of it included."""
    pixels = images.numpy()
    weakref.finalize(pixels, flags.numpy().__setitem__, index, 0)
    return torch.from_numpy(pixels)


def reduce_lent(lent: Lent):
    return receive, (lent.as_subclass(torch.Tensor), lent.flags, lent.index)


ForkingPickler.register(Lent, reduce_lent)


def new_shared(nbytes: int) -> torch.Tensor:
    """Uninitialised shared memory, as default_collate allocates its batches in a worker (share_memory_() would
    allocate private memory first, then copy it)."""
    buffer = torch.empty(0, dtype=torch.uint8)
    return buffer.set_(buffer.untyped_storage()._new_shared(nbytes))


class WorkerBuffers:
    """One worker's reused buffers, and their flags, set while a batch in the buffer is alive in any process."""

    def __init__(self, count: int):
        self.buffers: list[torch.Tensor] = []
        self.flags = torch.zeros(count, dtype=torch.uint8).share_memory_()
        self.held = self.flags.numpy()

    def lend(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A free buffer of at least `shape`'s bytes as a `Lent` tensor of that shape, or new shared memory."""
        nbytes = math.prod(shape)
        free = [index for index in range(len(self.buffers)) if not self.held[index]]
        fitting = [index for index in free if self.buffers[index].numel() >= nbytes]
        if fitting:
            index = fitting[0]
        else:
            if len(self.buffers) < len(self.held):
                index = len(self.buffers)
                self.buffers.append(torch.empty(0))
            elif free:  # a free buffer too small for this batch makes way for one that fits
                index = free[0]
            else:  # the training process holds a batch in every buffer
                return new_shared(nbytes).view(shape)
            self.buffers[index] = new_shared(math.ceil(nbytes / ROUND_TO) * ROUND_TO)
        self.held[index] = 1
        lent = self.buffers[index][:nbytes].view(shape).as_subclass(Lent)
        lent.flags, lent.index = self.flags, index
        return lent


_worker_buffers: WorkerBuffers | None = None  # set in a worker whose loader lends; the training process has none


def lend_batches(count: int) -> None:
    """In a loader worker, at its start: assemble batches in `count` buffers, each used again once the training
    process has released the batch in it."""
    global _worker_buffers
    _worker_buffers = WorkerBuffers(count)


def batch_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor for one batch, to be returned as it is: in a loader worker, in shared memory
    that reaches the training process without a copy, one of the worker's own buffers where its loader lends them."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    if _worker_buffers is None:
        return new_shared(math.prod(shape)).view(shape)
    return _worker_buffers.lend(shape)
