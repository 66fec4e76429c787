"""`format=hf`: a Hugging Face `datasets` data set: a local folder of Parquet files in the Hub's layout
(`data/train-00000-of-00004.parquet`, `train/*.parquet`), which datasets converts once into Arrow in
`format.cache_dir`; a folder `DatasetDict.save_to_disk` wrote, read in place; or a data set already in the datasets
cache, named as on the Hub (`user/name`) and loaded offline. Each split is read by index from its Arrow files
(arrow.py); with `format.streaming=true` the training split is read from its Parquet files where they are
(parquet.py).

pack writes Parquet shards in the Hub's naming (`train/train-00000-of-00002.parquet`,
`val/validation-00000-of-00001.parquet`) and a dataset card, README.md, whose features name the classes:
`datasets.load_dataset(<pack.out>)` and the Hub read the pack as it is.
"""
import json
import re
from pathlib import Path

from ....contracts import Format, Stores
from ....core.errors import ConfigError
from .. import META, SPLITS, check_folder, read_meta, split_file
from .arrow import HfImages, checked, converted, from_cache, in_place
from .parquet import streamed_train

HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")  # user/name: where no local folder has that name, a data set of the cache
KEYS = {"train": "train_split", "val": "val_split"}  # the setting that names each split
CARD_SPLITS = {"train": "train", "val": "validation"}  # each split's name in a pack's file names and card
ROWS_PER_GROUP = 100  # a Parquet row group of images, as datasets writes them
WRITES = ("write it with python -m {{ cookiecutter.package }}.pack format=hf pack.out=<folder>, or pass a folder of "
          "Parquet files, a save_to_disk folder or the Hub name (user/name) of a data set in the datasets cache")


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
