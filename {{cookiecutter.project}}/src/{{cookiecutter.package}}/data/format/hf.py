"""`format=hf`: a Hugging Face `datasets` data set, read by index from Arrow files memory-mapped in each reading process:
a local folder of Parquet files in the Hub's layout (`data/train-00000-of-00004.parquet`, `train/*.parquet`), which
datasets converts once into Arrow in `format.cache_dir`; a folder `DatasetDict.save_to_disk` wrote, read in place; or a
data set already in the datasets cache, named as on the Hub (`user/name`) and loaded offline.

A read gives the image column's encoded bytes (the column cast to `datasets.Image(decode=False)`): the decoder
decodes, never datasets. The labels are read once, as one Arrow column. pack writes Parquet shards in the Hub's naming
(`train/train-00000-of-00002.parquet`, `val/validation-00000-of-00001.parquet`) and a dataset card, README.md, whose
features name the classes: `datasets.load_dataset(<pack.out>)` and the Hub read the pack as it is.
"""
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...contracts import Format, Store, Stores
from ...core.errors import ConfigError
from . import META, SPLITS, check_folder, read_meta, split_file

HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")  # user/name: where no local folder has that name, a data set of the cache
KEYS = {"train": "train_split", "val": "val_split"}  # the setting that names each split
CARD_SPLITS = {"train": "train", "val": "validation"}  # each split's name in a pack's file names and card
ROWS_PER_GROUP = 100  # a Parquet row group of images, as datasets writes them
WRITES = ("write it with python -m {{ cookiecutter.package }}.pack format=hf pack.out=<folder>, or pass a folder of "
          "Parquet files, a save_to_disk folder or the Hub name (user/name) of a data set in the datasets cache")


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


def of_split(relative: Path, split: str) -> bool:
    """Whether a file is the split's, as the Hub names them: split-00000-of-00004.parquet, split.parquet, split/..."""
    return split in relative.parts[:-1] or re.match(rf"{re.escape(split)}([-_.]|$)", relative.name) is not None


def split_files(folder: Path, split: str, key: str) -> list[Path]:
    """The split's Parquet files under `folder`; refused in one line naming those that are there."""
    found = sorted(path.relative_to(folder) for path in folder.rglob("*.parquet"))
    if files := [folder / path for path in found if of_split(path, split)]:
        return files
    listed = ", ".join(map(str, found[:4])) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    raise ConfigError(f"{folder} has no Parquet file of the split format.{key}={split} ({split}-*.parquet, "
                      f"{split}.parquet or {split}/*.parquet) and no save_to_disk folder {split}/: it is not a packed "
                      "data set, nor one in the Hub's layout with that split; " + (
                          f"it holds {listed}: name their split with format.{key}=" if found
                          else "it holds no .parquet file"))


def unreadable(file: Path, err: Exception) -> ConfigError:
    return ConfigError(f"{file} is not a readable Parquet file ({type(err).__name__}: {str(err).splitlines()[0][:200]}"
                       "): truncated or damaged; copy or write it again")


def converted(files: list[Path], cache_dir: str | None) -> tuple:
    """The data set of the Parquet `files`, which datasets converts into Arrow in `cache_dir` once (a later start finds
    it there), and the Rows of `files`, which name its images. A damaged file is refused in one line naming it."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    counts = []
    for file in files:
        try:
            counts.append(pq.read_metadata(file).num_rows)  # the footer: a truncated or foreign file fails here
        except (OSError, pa.ArrowException) as err:
            raise unreadable(file, err) from None
    try:
        dataset = datasets.load_dataset("parquet", data_files=list(map(str, files)), split="train", cache_dir=cache_dir)
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


class Hf(Format):
    suffix = ""  # each split is a folder of Parquet shards

    def __init__(self, path: str | None, image_column: str = "image", label_column: str = "label",
                 train_split: str = "train", val_split: str = "validation", cache_dir: str | None = None,
                 streaming: bool = False):
        self.path, self.image_column, self.label_column, self.cache_dir = path, image_column, label_column, cache_dir
        self.splits = {"train": train_split, "val": val_split}
        self.streaming = streaming

    def stores(self, source, stage) -> Stores:
        """Both splits at format.path, the training split streamed where format.streaming says so; `stage` is never
        asked: this format's facts say it reads the files where they are (the loader assembly refuses a staging)."""
        folder, meta = Path(self.path).expanduser(), None
        indexed = ("val",) if self.streaming else SPLITS  # a streamed training split is never converted
        if not folder.exists() and HUB_NAME.fullmatch(self.path):
            if self.streaming:
                raise ConfigError(f"format.path={self.path}: format.streaming=true reads a folder of Parquet files, not "
                                  "the datasets cache: pass the folder of its files, or set format.streaming=false")
            cached = from_cache(self.path, self.cache_dir)
            splits = {split: (self.in_cache(cached, split), None) for split in indexed}
        else:
            check_folder(folder, WRITES)
            meta = read_meta(folder, "hf") if (folder / META).exists() else None  # pack's: it names each split's folder
            splits = {split: self.in_folder(folder, meta, split) for split in indexed}
        stores, names = {}, {}
        where = {split: f"{self.path} (format.{KEYS[split]}={self.splits[split]})" for split in SPLITS}
        for split, (dataset, sources) in splits.items():
            labels, names[split] = checked(dataset, self.image_column, self.label_column, where[split], KEYS[split])
            stores[split] = HfImages(arrow := in_place(dataset), sources or arrow, self.image_column, labels)
        if self.streaming:
            from .hf_stream import streamed_train
            stores["train"], names["train"] = streamed_train(
                self.parquet_files(folder, meta, "train"), self.image_column, self.label_column, where["train"])
        classes = meta["classes"] if meta else names["train"] or [str(label) for label in range(
            1 + max((int(store.labels.max()) for store in stores.values() if len(store)), default=0))]
        return Stores(stores["train"], stores["val"], classes)

    def in_cache(self, cached, split: str):
        if self.splits[split] not in cached:
            raise ConfigError(f"{self.path} in the datasets cache has no split {self.splits[split]}: it has "
                              f"{', '.join(cached)}; name one with format.{KEYS[split]}=")
        return cached[self.splits[split]]

    def in_folder(self, folder: Path, meta: dict | None, split: str) -> tuple:
        """(data set, the Rows of the files it was converted from, or None where it is read in place) of a split of a
        local folder."""
        if meta is None and (folder / self.splits[split] / "state.json").is_file():  # DatasetDict.save_to_disk's
            from datasets import load_from_disk
            return load_from_disk(str(folder / self.splits[split])), None
        return converted(self.parquet_files(folder, meta, split), self.cache_dir)

    def parquet_files(self, folder: Path, meta: dict | None, split: str) -> list[Path]:
        """The split's Parquet files in a local folder: pack's, or in the Hub's layout."""
        name = self.splits[split]  # the files' split, where no pack.json names its folder
        if meta is None and (folder / "state.json").is_file():
            raise ConfigError(f"{folder} holds one split, as Dataset.save_to_disk writes it: save a DatasetDict of "
                              f"its {self.splits['train']} and {self.splits['val']} splits there instead")
        if meta is None and (folder / name / "state.json").is_file():  # only a streamed split asks for its files here
            raise ConfigError(f"{folder / name} is a save_to_disk folder, of Arrow files: format.streaming=true reads "
                              "Parquet files; set format.streaming=false, which reads these in place")
        return sorted(split_file(folder, meta, split).glob("*.parquet")) if meta else split_files(folder, name, KEYS[split])

    def write(self, path: Path, records, chunk_mb: float) -> None:
        """One split as Parquet shards of about `chunk_mb` megabytes in the folder `path`, named as the Hub names them
        (train-00000-of-00002.parquet): the images as datasets' Image feature, the labels as class numbers, which the
        card `publish` writes names."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from datasets import Features, Image, Value
        path.mkdir()
        schema = Features({"image": Image(), "label": Value("int64")}).arrow_schema  # with datasets' metadata
        shards, rows, size = [], [], 0

        def write_shard():  # a shard's images are held until it is written: chunk_mb of them
            shards.append(path / f".{len(shards)}.parquet")
            pq.write_table(pa.table({"image": [{"bytes": data, "path": None} for data, _ in rows],
                                     "label": [label for _, label in rows]}, schema=schema), shards[-1],
                           row_group_size=ROWS_PER_GROUP, compression="none")  # JPEG bytes do not compress

        for data, label in records:
            rows.append((data, label))
            size += len(data)
            if size >= chunk_mb * 2**20:
                write_shard()
                rows, size = [], 0
        if rows or not shards:  # an empty split is still one shard, which holds the columns
            write_shard()
        for index, shard in enumerate(shards):
            shard.rename(path / f"{CARD_SPLITS.get(path.name, path.name)}-{index:05d}-of-{len(shards):05d}.parquet")

    def publish(self, written: Path, out: str) -> None:
        """A dataset card beside the shards, as the Hub keeps one: its features name the classes pack.json lists, and
        its configs map each split to its folder; then the pack goes to `out`."""
        import yaml  # datasets' and Hydra's own dependency
        classes = json.loads((written / META).read_text())["classes"]
        names = {str(label): name for label, name in enumerate(classes)}  # as the Hub's cards key them
        card = {"dataset_info": {"features": [{"name": "image", "dtype": "image"},
                                              {"name": "label", "dtype": {"class_label": {"names": names}}}]},
                "configs": [{"config_name": "default", "data_files": [
                    {"split": CARD_SPLITS[split], "path": f"{split}/*.parquet"} for split in SPLITS]}]}
        (written / "README.md").write_text(f"---\n{yaml.safe_dump(card, sort_keys=False)}---\n")
        super().publish(written, out)
