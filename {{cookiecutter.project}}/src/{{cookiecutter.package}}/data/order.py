"""In which order an epoch visits the training images: `order=<option>`, an `Order` (contracts.py) each.

`order=random` draws every image anywhere in the data set: one small read per image, which a local SSD or
the page cache serve at no cost and a spinning disk or a network share at a seek or a round trip each.
`order=blocks` reads big and shuffles in memory, as FFCV's quasi-random order, webdataset's shuffle buffer
and MosaicML's shuffle blocks do: the epoch visits runs of consecutive records (blocks) in a random order,
shuffles the images of a window of several blocks among themselves, and gives each loader worker whole
windows, so that a worker reads each block once, in one request, and keeps it while it cuts its batches.
It needs a format whose records sit end to end (its `reads_runs` fact), and a pack whose training records
were written in a random order (pack does that), so that a block is a random mix of classes.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..contracts import Layout, Order, Store


class RandomOrder(Order):
    def permutation(self, size: int, generator: torch.Generator, layout: Layout) -> torch.Tensor:
        return torch.randperm(size, generator=generator)


FULL_SHUFFLE = RandomOrder()  # the default wherever an order is not asked for: validation, tools, tests


@dataclass
class BlockOrder(Order):
    block: int  # consecutive records read in one request
    window: int  # blocks whose images are shuffled together

    def permutation(self, size: int, generator: torch.Generator, layout: Layout) -> torch.Tensor:
        """Windows of shuffled blocks, handed out whole to the readers (process, worker), then laid out so that
        process r's share (every processes-th image from r) gives its worker w every workers-th batch from w."""
        starts = torch.randperm(-(-size // self.block), generator=generator) * self.block
        blocks = [torch.arange(start, min(start + self.block, size)) for start in starts.tolist()]
        windows = [torch.cat(blocks[first:first + self.window]) for first in range(0, len(blocks), self.window)]
        windows = [window[torch.randperm(len(window), generator=generator)] for window in windows]
        readers = layout.processes * layout.workers
        lanes = [torch.cat(windows[reader::readers] or [torch.empty(0, dtype=torch.long)]) for reader in range(readers)]
        shares = [interleave([lanes[process * layout.workers + worker] for worker in range(layout.workers)],
                             layout.batch_size) for process in range(layout.processes)]
        return interleave(shares, 1)

    def reads(self, store: Store) -> Store:
        return BlockReads(store, self.block, self.window)


def interleave(streams: list[torch.Tensor], step: int) -> torch.Tensor:
    """`step` items of each stream in turn; a stream that runs out leaves the turn to the others."""
    parts, position = [], 0
    while any(position < len(stream) for stream in streams):
        parts += [stream[position:position + step] for stream in streams if position < len(stream)]
        position += step
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)


class BlockReads(Store):
    """A store read a block at a time: the first image asked of a block reads all of it in one request
    (`Store.payloads`). The worker keeps a block until each of its images has been asked for, which under this
    order's layout happens within its window, never more than `window` blocks, and nothing from one epoch in the
    next (the images a drop_last leaves out are never asked): nothing read in one epoch serves the next, as
    nothing would from a data set larger than the memory."""

    def __init__(self, store: Store, block: int, window: int):
        super().__init__(store.labels)
        self.store, self.block, self.window = store, block, window

    def open(self) -> None:
        self.store.ensure_open()
        self.new_epoch()

    def new_epoch(self) -> None:
        self._blocks: dict[int, tuple[list[Any], set[int]]] = {}  # number -> (payloads, positions not yet asked)

    def payload(self, index: int) -> Any:
        number, start = index // self.block, index - index % self.block
        if number not in self._blocks:
            if len(self._blocks) >= self.window:
                del self._blocks[next(iter(self._blocks))]  # the oldest: a dict keeps its insertion order
            payloads = self.store.payloads(start, min(start + self.block, len(self.store)))
            self._blocks[number] = payloads, set(range(len(payloads)))
        payloads, waiting = self._blocks[number]
        waiting.discard(index - start)
        if not waiting:
            del self._blocks[number]
        return payloads[index - start]

    def name(self, index: int) -> str:
        return self.store.name(index)

    def files(self, indices: list[int]) -> list[Path]:
        return self.store.files(indices)
