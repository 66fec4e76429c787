"""A `format=hf` split read by index from Arrow files memory-mapped in each reading process: datasets' conversion of
Parquet files, a save_to_disk folder, or the datasets cache. A read gives the image column's encoded bytes (the
column cast to `datasets.Image(decode=False)`): the decoder decodes, never datasets. The labels are read once, as
one Arrow column, and checked as every split's are (`checked`, `class_numbers`).
"""
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ....contracts import Store
from ....core.errors import ConfigError
from ....core.files import one_process_at_a_time, version


@dataclass
class Rows:
    """Files that hold a split's rows end to end, and the first row of each."""
    paths: np.ndarray  # str: an array, where a list would be a Python object per file
    starts: np.ndarray

    @classmethod
    def of(cls, paths: list[str], counts: list[int]) -> "Rows":
        return cls(np.array(paths), np.cumsum([0, *counts])[:-1])

    def file(self, indices):
        return np.searchsorted(self.starts, indices, side="right") - 1


def image_bytes(dataset, column: str):
    """The image column's bytes and paths, as Arrow columns: cast to `datasets.Image(decode=False)`, which takes an
    Image feature, bytes or file paths alike, and decodes nothing."""
    import pyarrow.compute as pc
    from datasets import Image
    images = dataset.select_columns([column]).cast_column(column, Image(decode=False)).data.column(column)
    return pc.struct_field(images, "bytes"), pc.struct_field(images, "path")


def read_path(data: bytes | None, path: str | None) -> bytes:
    """An image's bytes; for one the data set holds by its path alone, the file's (none where it is gone: the decoder
    finds it unreadable, and it is skipped and counted)."""
    if data is not None:
        return data
    return Path(path).read_bytes() if path and Path(path).is_file() else b""


class HfImages(Store):
    """One split: its Arrow files, memory-mapped in the process that reads them; `name` is the file the image came
    from (a Parquet file, or the Arrow file itself) and its row there."""

    def __init__(self, arrow: Rows, sources: Rows, image_column: str, labels: np.ndarray):
        super().__init__(labels)
        self.arrow, self.sources, self.image_column = arrow, sources, image_column

    def open(self) -> None:
        from datasets import Dataset, concatenate_datasets
        self._bytes, self._paths = image_bytes(
            concatenate_datasets([Dataset.from_file(str(path)) for path in self.arrow.paths]), self.image_column)

    def close(self) -> None:
        self._bytes = self._paths = None  # the parent's maps: this process opens its own

    def payload(self, index: int) -> bytes:
        return read_path(self._bytes[index].as_py(), self._paths[index].as_py())

    def payloads(self, start: int, stop: int) -> list[bytes]:
        """One slice of the column: records start..stop-1 lie end to end in their Arrow file."""
        return list(map(read_path, self._bytes[start:stop].to_pylist(), self._paths[start:stop].to_pylist()))

    def name(self, index: int) -> str:
        file = self.sources.file(index)
        return f"{self.sources.paths[file]}[{index - self.sources.starts[file]}]"

    def files(self, indices: list[int]) -> list[Path]:
        return [Path(self.arrow.paths[file]) for file in np.unique(self.arrow.file(indices))]


def in_place(dataset) -> Rows:
    """The Arrow files `dataset` is read from, and their rows."""
    from datasets import Dataset
    paths = [cache["filename"] for cache in dataset.cache_files]
    return Rows.of(paths, [len(Dataset.from_file(path)) for path in paths])


def unreadable(file: Path, err: Exception) -> ConfigError:
    return ConfigError(f"{file} is not a readable Parquet file ({type(err).__name__}: {str(err).splitlines()[0][:200]}"
                       "): truncated or damaged; copy or write it again")


def converted(files: list[Path], cache_dir: str | None) -> tuple:
    """The data set of the Parquet `files`, which datasets converts into Arrow in `cache_dir` once, by the first process
    of a node while the others wait (a later start finds it there), and the Rows of `files`, which name its images.
    A damaged file is refused in one line naming it.

    datasets finds a conversion by its files' paths and mtimes alone, so a file rewritten with its mtime put back
    would be read as it was. Each conversion is kept in a folder of its own, named by the files and each one's
    version (core.files.version), and a new one removes the one it replaces."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    counts = []
    for file in files:
        try:
            counts.append(pq.read_metadata(file).num_rows)  # the footer: a truncated or foreign file fails here
        except (OSError, pa.ArrowException) as err:
            raise unreadable(file, err) from None
    base = Path(cache_dir or datasets.config.HF_DATASETS_CACHE).expanduser()
    names = hashlib.sha1("".join(f"{file.resolve()}\n" for file in files).encode()).hexdigest()[:12]
    versions = hashlib.sha1("".join(f"{version(file)}\n" for file in files).encode()).hexdigest()[:12]
    try:
        with one_process_at_a_time(base):
            dataset = datasets.load_dataset("parquet", data_files=list(map(str, files)), split="train",
                                            cache_dir=str(base / f"parquet-{names}-{versions}"))
            for stale in base.glob(f"parquet-{names}-*"):
                if stale.name != f"parquet-{names}-{versions}":
                    shutil.rmtree(stale, ignore_errors=True)
    except datasets.exceptions.DatasetGenerationError as err:  # a page damaged behind a sound footer: find its file
        for file in files:
            try:
                pq.read_table(file)
            except (OSError, pa.ArrowException) as damaged:
                raise unreadable(file, damaged) from None
        raise ConfigError(f"datasets could not convert the Parquet files in {files[0].parent}: {err.__cause__}") from None
    return dataset, Rows.of(list(map(str, files)), counts)


def from_cache(name: str, cache_dir: str | None):
    """The data set `name` from the datasets cache, offline: the start of a run's every rank downloads nothing."""
    import datasets
    online, datasets.config.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE, True  # read at each call
    cache = cache_dir or datasets.config.HF_DATASETS_CACHE
    try:
        return datasets.load_dataset(name, cache_dir=cache_dir)
    except (ConnectionError, FileNotFoundError):
        raise ConfigError(f"format.path={name}: no folder has that name here, and the datasets cache at {cache} does "
                          f"not hold it: load it there once online, datasets.load_dataset('{name}', cache_dir=...), "
                          "or pass the folder of its files") from None
    except ValueError as err:  # several of its configurations cached, say: datasets' words say which
        raise ConfigError(f"format.path={name}: the datasets cache at {cache} holds it, but not as one data set to "
                          f"read offline ({str(err).splitlines()[0]}): save the one to train on with save_to_disk "
                          "and pass that folder") from None
    finally:
        datasets.config.HF_HUB_OFFLINE = online


def checked(dataset, image: str, label: str, where: str, key: str) -> tuple[np.ndarray, list[str] | None]:
    """A split's labels as int64 class numbers, read as one Arrow column, and the names its ClassLabel gives them, once
    its image and label columns are found and hold what they must."""
    import pyarrow as pa
    for column, setting in ((image, "image_column"), (label, "label_column")):
        if column not in dataset.column_names:
            raise ConfigError(f"{where} has no column {column}: its columns are {', '.join(dataset.column_names)}; "
                              f"pass format.{setting}=<one of them>")
    try:
        image_bytes(dataset, image)
    except (TypeError, ValueError, pa.ArrowException):
        raise ConfigError(f"{where}: format.image_column={image} holds {dataset.features[image]}, not encoded images; "
                          "pass the column of images: an Image feature, bytes or file paths") from None
    feature = dataset.features[label]
    return class_numbers(dataset.data.column(label), feature, label, where, key), getattr(feature, "names", None)


def class_numbers(values, feature, label: str, where: str, key: str) -> np.ndarray:
    """The label column `values` as int64 class numbers, refused in one line where a row has none."""
    import pyarrow as pa
    if not pa.types.is_integer(values.type) or values.null_count:
        why = f"{values.null_count} rows without one" if pa.types.is_integer(values.type) else f"{feature}"
        raise ConfigError(f"{where}: format.label_column={label} holds {why}, not a class number per row; pass the "
                          f"column of class numbers, or make one with dataset.class_encode_column('{label}')")
    labels = values.to_numpy().astype(np.int64)
    if len(labels) and labels.min() < 0:
        raise ConfigError(f"{where}: format.label_column={label} holds {labels.min()}, the Hub's mark of an "
                          f"unlabelled row (as in test splits): pick a labelled split with format.{key}=")
    return labels
