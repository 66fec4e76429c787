"""Epochs read without starting a process, for the sampler's and the coverage check's tests: each process's
sampler and batch sampler as make_loader builds them, and the DataLoader's turns simulated (batch k of a process goes
to its worker k % workers)."""
from collections import Counter
from dataclasses import dataclass

from omegaconf import OmegaConf
from torch.utils.data import Dataset

from {{ cookiecutter.package }}.contracts import Layout
from {{ cookiecutter.package }}.data.coverage import Coverage, EpochTrace
from {{ cookiecutter.package }}.data.order import BlockOrder
from {{ cookiecutter.package }}.data.sampling import EpochBatches, EpochSampler, agreed_layout
from {{ cookiecutter.package }}.loop.accumulate import batches_per_step

BLOCKS = BlockOrder(block=4, window=2)
WIDE = BlockOrder(block=8, window=4)


def per_step(global_batch, batch_size: int, processes: int, accumulate: int = 1) -> int:
    """The batches each process sums into a step, as train.py derives them from these train.* settings."""
    return batches_per_step(OmegaConf.create({"global_batch": global_batch, "batch_size": batch_size,
                                              "accumulate": accumulate}), processes)


class Sized(Dataset):
    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


class Job:
    """The processes of one job, without a process group: `gather` returns every process's row, as the window's
    all-reduce does, from what each process would give."""

    def __init__(self, rows_of: list, rank: int = 0):
        self.rows_of, self.rank = rows_of, rank
        self.size = len(rows_of)

    def gather(self, values: list[float]) -> list[list[float]]:
        return [[float(value) for value in row] for row in self.rows_of]

    def hosts(self) -> list[str]:
        return [f"node{rank // 8}" for rank in range(self.size)]


def agreed(size: int, workers: list[int], batch: int, order=BLOCKS, seed: int = 0) -> Layout:
    """The layout the processes of a job with these worker counts agree on, as make_loaders asks for it."""
    rows = [[count, size, seed, batch] for count in workers]
    return agreed_layout(Job(rows), workers[0], batch, data={"images": size}, read_from="data.root=/data",
                         settings={"seed": seed, "batch": batch})


@dataclass
class Reads:
    """What a simulated epoch read: each key a process's worker was given, by (rank, worker)."""
    trained: Counter  # index -> times trained
    readers: dict  # run -> {(rank, worker)}
    traces: list  # each process's EpochTrace
    runs: int = 0


def read_epoch(size: int, layout: Layout, order, workers: list[int], seed: int = 0, epoch: int = 3, skip: int = 0,
               began: Layout | None = None, stop_after: int | None = None) -> Reads:
    """Each process's sampler and batch sampler as make_loader builds them, each batch k of process r handed to its
    worker k % workers[r], as the DataLoader does; `stop_after` batches per process, or the whole epoch."""
    reads = Reads(Counter(), {}, [])
    for rank, count in enumerate(workers):
        sampler = EpochSampler(Sized(size), rank, seed, order, layout)
        if began:
            sampler.resume_layout(began)
        sampler.set_epoch(epoch, skip)
        batches = EpochBatches(sampler, endless=False)
        trace = None
        for number, keys in enumerate(batches):
            if number == stop_after:
                break
            plan, dispatched = batches.dispatched.popleft()
            trace = trace or EpochTrace(plan, count)
            trace.took(plan.indices(dispatched))
            for key in keys:
                reads.trained[key[0]] += 1
                run = tuple(key[2:]) or (key[0], key[0] + 1)
                reads.readers.setdefault(run, set()).add((rank, number % max(1, count)))
        reads.traces.append(trace or EpochTrace(sampler.plan(epoch, skip, sampler.epoch_layout), count))
    return reads


def assert_every_image_once(reads: Reads, size: int, before: Counter | None = None):
    """Trained once, left out once (the documented drop: the tail after the last micro-batch every process gets one
    of) or trained before."""
    left_out = Counter(int(index) for trace in reads.traces for index in trace.plan.left_out())
    seen = reads.trained + left_out + (before or Counter())
    assert set(seen) == set(range(size)) and set(seen.values()) <= {1}, (
        f"missed {size - len(seen)}, doubled {sum(1 for times in seen.values() if times > 1)}")
    for trace in reads.traces:  # rank 0 leaves out the tail, fewer images than a micro-batch for each process
        plan = trace.plan
        tail = (size - plan.skip) % (plan.batch_size * plan.processes) if plan.rank == 0 else 0
        assert len(plan.left_out()) == tail


def records(reads: Reads, images_in_epoch: int) -> list:
    """Every process's record, as the window's gather carries them, once all processes trained `images_in_epoch`."""
    return [trace.record(images_in_epoch) for trace in reads.traces]


def trained_by_all(reads: Reads) -> int:
    """The images of the epoch all processes trained on, resumed ones included, as Run counts them."""
    plan = reads.traces[0].plan
    return plan.skip + sum(reads.trained.values())


def stopped_and_resumed(coverage: Coverage, reads: Reads) -> Coverage:
    """The coverage a run resumed from a checkpoint written after `reads` starts with."""
    images = trained_by_all(reads)
    coverage.window(records(reads, images), images)
    resumed = Coverage(coverage.size)
    resumed.load_state_dict(coverage.state_dict(images, reads.traces[0]))
    return resumed


def assert_each_run_read_by_one_worker(reads: Reads, order, size: int, layout: Layout):
    assert all(len(who) == 1 for who in reads.readers.values()), "a run read by two workers"
    if isinstance(order, BlockOrder):
        runs = sorted(reads.readers)
        assert all(start // order.block == (stop - 1) // order.block for start, stop in runs), "a run across blocks"
        assert all(stop <= next_start for (_, stop), (next_start, _) in zip(runs, runs[1:])), "overlapping runs"
        blocks = -(-size // order.block)
        assert len(runs) <= blocks + sum(layout.workers), "a block is cut only where a lane ends"


