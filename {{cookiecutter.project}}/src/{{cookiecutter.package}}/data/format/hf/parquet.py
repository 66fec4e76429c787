"""`format=hf` with `format.streaming=true`: the training split read from its Parquet files where they are, never
converted into Arrow. Pick it for a data set too large to convert once.

Parquet is read a row group at a time, so the split trains under `order=blocks`: each loader worker reads a run of
consecutive rows in one go (the row groups it spans, each once) and shuffles a window of runs in memory. Every
other part is the sampler's, as for any format: every image once an epoch (checked at its end), the same share
of whole batches for every process whatever the files' sizes, and a resume that leaves out exactly what was
trained, on any number of workers. Validation stays read by index, from Arrow, as without streaming.
"""
from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from ....contracts import Store
from .arrow import Rows, checked, class_numbers, read_path, unreadable

OPEN_FILES = 32  # Parquet files each reading process keeps open: a split may have thousands


@dataclass
class RowGroups:
    """Where each Parquet row group of a split lies: its first row in the split, its file and its number there."""
    starts: np.ndarray
    files: np.ndarray
    numbers: np.ndarray

    @classmethod
    def of(cls, groups_by_file: list[list[int]]) -> "RowGroups":
        """From each file's row groups' row counts, the files in the split's order."""
        sizes = [rows for groups in groups_by_file for rows in groups]
        return cls(np.cumsum([0, *sizes])[:-1], np.repeat(np.arange(len(groups_by_file)), list(map(len, groups_by_file))),
                   np.concatenate([np.arange(len(groups)) for groups in groups_by_file] or [np.zeros(0, np.int64)]))

    def spanned(self, start: int, stop: int) -> range:
        """The row groups that hold rows start..stop-1."""
        first, last = np.searchsorted(self.starts, [start, stop - 1], side="right") - 1
        return range(int(first), int(last) + 1)

    def mean_rows(self, size: int) -> float:
        return size / max(1, len(self.starts))


class ParquetRows(Store):
    """The training split in its Parquet files; `payloads` reads the row groups a run of rows spans, each once, and
    keeps none: a run-reading order (order.BlockReads) holds the run's images while its batches are cut."""

    def __init__(self, rows: Rows, groups: RowGroups, image_column: str, labels: np.ndarray):
        super().__init__(labels)
        self.rows, self.groups, self.image_column = rows, groups, image_column
        mean = groups.mean_rows(len(labels))
        self.single_read = (f"format.streaming=true reads each training image with its whole Parquet row group ({mean:.0f} "
                            "rows on average here)")

    def open(self) -> None:
        self._files: OrderedDict[int, object] = OrderedDict()  # file number -> ParquetFile, the oldest first

    def close(self) -> None:
        self._files = OrderedDict()

    def parquet(self, file: int):
        import pyarrow.parquet as pq
        if file in self._files:
            self._files.move_to_end(file)
        else:
            if len(self._files) >= OPEN_FILES:
                self._files.popitem(last=False)
            self._files[file] = pq.ParquetFile(self.rows.paths[file])
        return self._files[file]

    def read_group(self, group: int) -> list:
        """The image cells of one row group, as Python values (datasets' Image struct, bytes or a path)."""
        parquet = self.parquet(int(self.groups.files[group]))
        return parquet.read_row_group(int(self.groups.numbers[group]), columns=[self.image_column]).column(0).to_pylist()

    def payloads(self, start: int, stop: int) -> list[bytes]:
        self.ensure_open()
        cells = []
        for group in self.groups.spanned(start, stop):
            first = int(self.groups.starts[group])
            cells += self.read_group(group)[max(start, first) - first:stop - first]
        return [read_path(*image_of(cell)) for cell in cells]

    def payload(self, index: int) -> bytes:
        return self.payloads(index, index + 1)[0]

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


def group_rows(file: Path) -> list[int]:
    """The row counts of the file's row groups, from its footer."""
    import pyarrow.parquet as pq
    metadata = pq.read_metadata(file)
    return [metadata.row_group(group).num_rows for group in range(metadata.num_row_groups)]


def streamed_train(files: list[Path], image_column: str, label_column: str, where: str) -> tuple[ParquetRows, list]:
    """The training split's store and class names, from the Parquet files' footers, first row and label column: no
    image is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset
    from datasets.table import InMemoryTable
    sample = Dataset(InMemoryTable(refused_if_damaged(files[0], first_row)))
    _, names = checked(sample, image_column, label_column, where, "train_split")  # the columns, and what they hold
    groups = [refused_if_damaged(file, group_rows) for file in files]
    values = pa.chunked_array([chunk for file in files for chunk in refused_if_damaged(
        file, lambda file: pq.read_table(file, columns=[label_column]).column(0)).chunks],
        type=sample.data.column(label_column).type)
    store = ParquetRows(Rows.of(list(map(str, files)), list(map(sum, groups))), RowGroups.of(groups), image_column,
                        class_numbers(values, sample.features[label_column], label_column, where, "train_split"))
    return store, names
