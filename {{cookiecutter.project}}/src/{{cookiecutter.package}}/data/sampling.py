"""Which images each process trains on, and in which order: one order per epoch, cut into micro-batches that the
processes take in turn, drawn for the layout of processes and workers that every process agreed on at start."""
import itertools
import logging
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from ..contracts import EpochOrder, Layout, Order
from ..core.errors import ConfigError
from ..core.distributed import World
from .order import FULL_SHUFFLE

log = logging.getLogger(__name__)


def dealt(batch, processes: int, rank: int):
    """Which micro-batch of the epoch's order, counted from where the processes took it up, is a process's
    `batch`-th: the processes take them in turn. Numbers or arrays."""
    return batch * processes + rank


@dataclass(frozen=True)
class EpochPlan:
    """One process's share of one epoch: its batches in training order (`drawn` is the whole epoch's order, cut into
    micro-batches of `batch_size` that the processes take in turn) and what it leaves out. Rank 0 leaves out the
    tail, fewer images than a micro-batch for each process, that no process takes."""
    epoch: int
    skip: int  # the images of the epoch all processes trained on before it was resumed: the first of `drawn`
    rank: int
    processes: int
    batch_size: int
    drawn: EpochOrder

    @property
    def batches(self) -> int:
        """This process's batches: as many as every process gets, of the micro-batches after the first `skip`."""
        return max(0, len(self.drawn.indices) - self.skip) // (self.batch_size * self.processes)

    @property
    def images(self) -> int:
        return self.batches * self.batch_size

    def positions(self, start: int, stop: int) -> np.ndarray:
        """Where this process's images start..stop-1 of the epoch sit in `drawn`: its batch b is the epoch's
        micro-batch b × processes + rank after the first `skip` images, so a step of the same global batch trains
        the same micro-batches on any number of processes."""
        image = np.arange(start, stop)
        micro_batch = dealt(image // self.batch_size, self.processes, self.rank)
        return self.skip + micro_batch * self.batch_size + image % self.batch_size

    def indices(self, batch: int) -> np.ndarray:
        return self.drawn.indices[self.positions(batch * self.batch_size, (batch + 1) * self.batch_size)]

    def keys(self, batch: int) -> list[tuple]:
        """What the data set is asked for each image of a batch: (index, epoch), and the run the order reads it
        with where it reads runs (data.images.Images)."""
        where = self.positions(batch * self.batch_size, (batch + 1) * self.batch_size)
        indices = self.drawn.indices[where].tolist()
        if self.drawn.run_starts is None:
            return [(index, self.epoch) for index in indices]
        return list(zip(indices, itertools.repeat(self.epoch), self.drawn.run_starts[where].tolist(),
                        self.drawn.run_stops[where].tolist()))

    def before(self) -> np.ndarray:
        """The images all processes trained on before the epoch was resumed."""
        return self.drawn.indices[:self.skip]

    def left_out(self) -> np.ndarray:
        """The images no process trains on in this epoch, on rank 0: those after the last micro-batch that every
        process gets one of (fewer than batch_size × processes), as a DataLoader with drop_last drops a partial
        batch."""
        tail = self.drawn.indices[self.skip + self.images * self.processes:] if self.rank == 0 else []
        return np.asarray(tail, dtype=np.int64)


class EpochSampler(Sampler):
    """The epochs' orders for one process, able to start the next epoch part-way, with as many processes as before
    or not.

    An epoch is one order of the data set whatever the number of processes, cut into micro-batches of batch_size
    images, and rank r takes every processes-th micro-batch from r: the micro-batches that make up a step are the
    same on any number of processes (given the same global batch), and what all processes together have trained on
    is always the order's beginning. A resumed run leaves that out and deals the rest over its own number of
    processes. The images after the last micro-batch every process gets one of sit out the epoch, as with a
    DataLoader's drop_last. The order is the order option's (data/order.py), drawn for the layout of the processes
    and workers reading it, which every process holds the same (`agreed_layout`): one order for all of them.
    """

    def __init__(self, dataset: Dataset, rank: int, seed: int, order: Order = FULL_SHUFFLE,
                 layout: Layout = Layout(1, 1, 1)):
        self.dataset, self.rank, self.seed, self.order = dataset, rank, seed, order
        self.layout = self.epoch_layout = layout
        self.resumed_layout = None
        self.epoch, self.skip = 0, 0

    @property
    def processes(self) -> int:
        return self.layout.processes

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Shuffle for `epoch`, leaving out its first `skip` images (those all processes trained on). A resumed
        epoch is drawn for the layout it began with (`resume_layout`): an order laid out for other readers is
        another order, and only the same one leaves out what was trained."""
        self.epoch, self.skip = epoch, skip
        self.epoch_layout, self.resumed_layout = self.resumed_layout or self.layout, None

    def resume_layout(self, layout: Layout) -> None:
        """The layout the epoch about to be resumed began with. Where it is not this run's, the order says in the log
        what that changes."""
        self.resumed_layout = layout
        if layout != self.layout and (changes := self.order.on_another_layout(layout, self.layout)):
            log.info(changes)

    def plan(self, epoch: int, skip: int, layout: Layout) -> EpochPlan:
        drawn = self.order.draw(len(self.dataset), torch.Generator().manual_seed(self.seed + epoch), layout)
        return EpochPlan(epoch, skip, self.rank, self.processes, self.layout.batch_size, drawn)

    def plans(self) -> Iterator[EpochPlan]:
        """This epoch's plan, then those of every later epoch, each as `set_epoch(epoch)` would draw it."""
        yield self.plan(self.epoch, self.skip, self.epoch_layout)
        for epoch in itertools.count(self.epoch + 1):
            yield self.plan(epoch, 0, self.layout)

    def __iter__(self):
        """The keys of this process's images of the epoch set last, in order (data.images.Images takes them)."""
        plan = self.plan(self.epoch, self.skip, self.epoch_layout)
        for batch in range(plan.batches):
            yield from plan.keys(batch)

    def __len__(self) -> int:
        """Images this process trains on in the epoch set last: its whole batches."""
        batch = self.layout.batch_size
        return max(0, len(self.dataset) - self.skip) // (batch * self.processes) * batch


class Shard(Sampler[int]):
    """Every rank-th index from `rank`, in order and without padding, so validation counts each image once."""

    def __init__(self, dataset: Dataset, world: World):
        self.indices = range(world.rank, len(dataset), world.size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class EpochBatches(Sampler[list]):
    """The epoch sampler's whole batches. `endless`: epoch after epoch, so that workers kept between epochs start
    the next epoch's first batches while the training process ends this one and validates, instead of every epoch
    opening with the training process waiting for a first batch to decode.

    Every batch handed to the DataLoader is noted in `dispatched` as (plan, batch number): the DataLoader hands
    batches over in the order it took them, so the loader knows which images each batch it yields holds."""

    def __init__(self, sampler: EpochSampler, endless: bool):
        self.sampler, self.endless = sampler, endless
        self.dispatched: deque[tuple[EpochPlan, int]] = deque()

    def __iter__(self):
        sampler = self.sampler
        plans = sampler.plans() if self.endless else [sampler.plan(sampler.epoch, sampler.skip, sampler.epoch_layout)]
        for plan in plans:
            for batch in range(plan.batches):
                self.dispatched.append((plan, batch))
                yield plan.keys(batch)

    def __len__(self) -> int:
        """Batches in the epoch set last."""
        return len(self.sampler) // self.sampler.layout.batch_size


def agreed_layout(world: World, workers: int, batch_size: int, *, data: dict[str, int], read_from: str,
                  settings: dict[str, float | str]) -> Layout:
    """The layout every process draws each epoch's order for: the worker count each process picked for itself, in
    one collective at start, which also checks what must be the same in every process for one order to serve them
    all: the data set's size, as each reads it from `read_from` (data.root, or a pack's format.path), and `settings`
    (the seed, the order's settings; words are compared by a checksum). A difference is refused in one line saying
    what to do: give every node the whole data set, or every process the same command line."""
    remedies = {**dict.fromkeys(data, f"every node must see the whole data set at {read_from}: copy all of it to "
                                      "each node's disk, or put it on a volume every node mounts"),
                **dict.fromkeys(settings, "every process must be given the same command line")}
    same_everywhere = {**data, **settings}
    values = [value if isinstance(value, (int, float)) else zlib.crc32(value.encode()) for value in
              same_everywhere.values()]
    rows = world.gather([workers, *values])
    for column, (what, mine) in enumerate(same_everywhere.items(), start=1):
        given = [row[column] for row in rows]
        if len(set(given)) > 1:
            hosts = world.hosts()
            odd = next(rank for rank, value in enumerate(given) if value != given[0])
            ranks = f"rank 0 (host {hosts[0]})", f"rank {odd} (host {hosts[odd]})"
            differ = (f"{ranks[0]} has {given[0]:g} and {ranks[1]} {given[odd]:g}" if isinstance(mine, (int, float))
                      else f"{ranks[0]} and {ranks[1]} differ, rank {world.rank} has {mine}")
            raise ConfigError(f"the processes disagree on {what}: {differ}; {remedies[what]}")
    return Layout(world.size, tuple(int(row[0]) for row in rows), batch_size)
