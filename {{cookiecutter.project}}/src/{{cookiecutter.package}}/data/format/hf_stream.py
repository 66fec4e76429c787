"""`format=hf` with `format.streaming=true`: the training split's Parquet files read as a `datasets`
IterableDataset, never converted into Arrow. Pick it for a data set too large to convert once.

datasets splits the stream by process (`split_dataset_by_node`) and by loader worker (over shards: a shard is a
Parquet file), and shuffles it in a seeded buffer drawn again each epoch (`set_epoch`). Every process trains the
same number of whole batches an epoch, the fewest any process is sure to get from the files' row counts, or
distributed training would hang on the process with one batch more. A run resumed mid-epoch reads the epoch's
stream again from its start and drops the batches already trained, most of them without decoding them.
Validation stays read by index, from Arrow, as without streaming.
"""
import logging
from itertools import count, islice
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from ...contracts import Store
from ...core.distributed import World
from .hf import Rows, checked, class_numbers, read_path, unreadable

log = logging.getLogger(__name__)

ROWS_READ = 64  # rows a worker reads from its Parquet file at once: their images are held until streamed


class ParquetRows(Store):
    """The training split in its Parquet files: the record being streamed, and by index the neighbour that replaces an
    unreadable image (rare: one row group read for it)."""
    streaming = None  # (index, payload) of the record this worker streams now

    def __init__(self, rows: Rows, image_column: str, labels: np.ndarray):
        super().__init__(labels)
        self.rows, self.image_column = rows, image_column

    def payload(self, index: int) -> bytes:
        if self.streaming is not None and self.streaming[0] == index:
            return self.streaming[1]
        import pyarrow.parquet as pq
        file = self.rows.file(index)
        parquet, row = pq.ParquetFile(self.rows.paths[file]), int(index - self.rows.starts[file])
        ends = np.cumsum([parquet.metadata.row_group(group).num_rows for group in range(parquet.num_row_groups)])
        group = int(np.searchsorted(ends, row, side="right"))
        cells = parquet.read_row_group(group, columns=[self.image_column]).column(0)
        return read_path(*image_of(cells[row - (int(ends[group - 1]) if group else 0)].as_py()))

    def name(self, index: int) -> str:
        file = self.rows.file(index)
        return f"{self.rows.paths[file]}[{index - self.rows.starts[file]}]"

    def files(self, indices: list[int]) -> list[Path]:
        return [Path(self.rows.paths[file]) for file in np.unique(self.rows.file(indices))]


def image_of(value) -> tuple[bytes | None, str | None]:
    """(bytes, path) of a Parquet image cell: datasets' Image struct, bytes, or a file path."""
    if isinstance(value, dict):
        return value.get("bytes"), value.get("path")
    return (value, None) if isinstance(value, bytes) else (None, value)


def records(paths: list[str], starts: list[int], image_column: str):
    """Each row of the Parquet files `paths` as (index in the split, image bytes): datasets hands each worker some
    of the files, with their first rows' indices beside them."""
    import pyarrow.parquet as pq
    for path, index in zip(paths, starts):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=ROWS_READ, columns=[image_column]):
            for value in batch.column(0).to_pylist():
                yield {"index": index, "image": read_path(*image_of(value))}
                index += 1


def least_batches(counts: list[int], world_size: int, workers: int, batch_size: int) -> int:
    """The whole batches every process yields an epoch at least, whichever files the epoch's shuffle hands it.

    With as many files as processes, or a multiple, datasets gives each process files, and each of its workers
    every `workers`-th of them; otherwise each process takes every `world_size`-th row of each worker's files.
    A worker's last partial batch is dropped, so the bound sums whole batches worker by worker, each worker given
    the smallest files there are."""
    smallest, by_files = sorted(counts), len(counts) % world_size == 0
    files = len(counts) // world_size if by_files else len(counts)
    least = 0
    for worker in range(max(1, workers)):
        rows = sum(smallest[:len(range(worker, files, max(1, workers)))])
        least += (rows if by_files else rows // world_size) // batch_size
    return least


class Decoded(IterableDataset):
    """One worker's share of the stream, batched: each record through `images` (data.Images), which seeds its crop
    by (epoch, index) and skips an unreadable image; a batch surely among those a resume drops is left empty."""

    def __init__(self, stream, store: ParquetRows, images, batch_size: int, epoch: int, dropped: int):
        self.stream, self.store, self.images = stream, store, images
        self.batch_size, self.epoch, self.dropped = batch_size, epoch, dropped

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        stream = iter(self.stream)
        for number in count():
            batch = list(islice(stream, self.batch_size))
            if len(batch) < self.batch_size:
                return  # the drop_last of every training loader
            # This worker's batch `number` is at most the loader's batch number * workers + worker: a worker that
            # runs out early only moves the others' batches forward.
            yield [] if number * workers + worker < self.dropped else [self.decoded(record) for record in batch]

    def decoded(self, record: dict):
        self.store.streaming = (record["index"], record["image"])
        return self.images[(record["index"], self.epoch)]


class Collated:
    """The training collate, on the batches Decoded groups; a dropped batch stays None."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples: list):
        return self.collate(samples) if samples else None


class StreamedHf:
    """The training loader of a streamed data set, a `ResumableLoader` (contracts/): a DataLoader over `Decoded`,
    started each epoch, taken for `batches` batches. Its workers end with the epoch, since they stop mid-stream."""

    def __init__(self, stream, store: ParquetRows, images, world: World, batches: int, batch_size: int, **settings):
        self.stream, self.store, self.images, self.world = stream, store, images, world
        self.batches, self.batch_size, self.settings = batches, batch_size, settings
        self.epoch, self.dropped = 0, 0

    def set_epoch(self, epoch: int, skip_images: int = 0) -> None:
        self.epoch, self.dropped = epoch, skip_images // (self.world.size * self.batch_size)
        self.stream.set_epoch(epoch)  # before the workers start: each takes a copy

    def __len__(self) -> int:
        return self.batches - self.dropped

    def __iter__(self):
        decoded = Decoded(self.stream, self.store, self.images, self.batch_size, self.epoch, self.dropped)
        batches = iter(DataLoader(decoded, batch_size=None, **self.settings))
        try:
            yield from islice(batches, self.dropped, self.batches)
        finally:
            # The workers stop mid-stream at the epoch's last batch: end them now, not when the iterator is collected.
            getattr(batches, "_shutdown_workers", lambda: None)()

    def state(self, epoch: int, images_done: int) -> dict:
        return {}  # the epoch and its images done are all a resume needs: it reads the stream again

    def load_state(self, state: dict) -> None:
        """Nothing to take back: set_epoch drops the batches trained."""

    def coverage(self) -> None:
        """datasets hands the workers their records itself: this loader cannot tell which a batch holds."""
        return None


def stream_loader(rows: Rows, counts: list[int], store: ParquetRows, image_column: str, shuffle_buffer: int):
    """The training split's loader factory (contracts.Stores.train_loader) for the Parquet files of `rows`."""
    from datasets import Features, IterableDataset as Stream, Value
    from datasets.distributed import split_dataset_by_node

    def train_loader(images, *, world: World, batch_size, seed, collate, worker_init_fn, num_workers, prefetch_factor,
                     pin_memory, persistent_workers):
        stream = Stream.from_generator(records, features=Features({"index": Value("int64"), "image": Value("binary")}),
                                       gen_kwargs={"paths": rows.paths.tolist(), "starts": rows.starts.tolist(),
                                                   "image_column": image_column})
        stream = split_dataset_by_node(stream.shuffle(seed=seed, buffer_size=shuffle_buffer), world.rank, world.size)
        batches = least_batches(counts, world.size, num_workers, batch_size)
        left_out = sum(counts) - batches * batch_size * world.size
        log.info("format.streaming: %d batches an epoch in each of %d processes, the fewest any is sure of; an epoch "
                 "leaves out %d of the %d training images", batches, world.size, left_out, sum(counts))
        del persistent_workers  # workers end with each epoch, stopped mid-stream at its last batch
        return StreamedHf(stream, store, images, world, batches, batch_size, collate_fn=Collated(collate),
                          num_workers=num_workers, worker_init_fn=worker_init_fn, pin_memory=pin_memory,
                          prefetch_factor=prefetch_factor if num_workers else None)

    return train_loader


def refused_if_damaged(file: Path, read):
    """read(file), or one line naming the damaged file."""
    import pyarrow as pa
    try:
        return read(file)
    except (OSError, pa.ArrowException) as err:
        raise unreadable(file, err) from None


def first_row(file: Path):
    """The file's first row, with its schema and datasets' features: a table of none where it has no row."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    parquet = pq.ParquetFile(file)
    return pa.Table.from_batches(list(islice(parquet.iter_batches(batch_size=1), 1)), parquet.schema_arrow)


def streamed_train(files: list[Path], image_column: str, label_column: str, where: str, shuffle_buffer: int) -> tuple:
    """The training split's store, class names and loader factory, from the Parquet files' footers, first row and
    label column: no image is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset
    from datasets.table import InMemoryTable
    sample = Dataset(InMemoryTable(refused_if_damaged(files[0], first_row)))
    _, names = checked(sample, image_column, label_column, where, "train_split")  # the columns, and what they hold
    counts = [refused_if_damaged(file, lambda file: pq.read_metadata(file).num_rows) for file in files]
    values = pa.chunked_array([chunk for file in files for chunk in refused_if_damaged(
        file, lambda file: pq.read_table(file, columns=[label_column]).column(0)).chunks],
        type=sample.data.column(label_column).type)
    rows = Rows.of(list(map(str, files)), counts)
    store = ParquetRows(rows, image_column, class_numbers(values, sample.features[label_column], label_column, where,
                                                           "train_split"))
    return store, names, stream_loader(rows, counts, store, image_column, shuffle_buffer)
