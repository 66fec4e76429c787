"""format=hf: Hugging Face data sets read by index from Parquet in the Hub's layout, a save_to_disk folder or the
datasets cache by name, one epoch trained from Parquet, and each bad input refused in one line. The round trip of
pack's Parquet, the refusals every packed format shares and the runs from the packs are test_format.py's,
test_save_load.py's and test_zoo.py's, which glob conf/format/."""
import importlib.util
import json
import os
import re

import pytest
import torch

from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.format import META
from {{ cookiecutter.package }}.data.format import hf
from {{ cookiecutter.package }}.data.images import make_splits
from {{ cookiecutter.package }}.data.fit import check_fit
from {{ cookiecutter.package }}.data.loaders import make_loader
from {{ cookiecutter.package }}.data.staging import no_staging

from conftest import encoded, photo

# datasets, and the pyarrow it brings, are imported by the tests that use them: imported here, they would cost every
# test process a second as it collects.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="pip install -e '.[hf]'")

CPU = torch.device("cpu")
CLASSES = ["cat", "dog", "eel"]
LABELS = {"train": [2, 0, 1, 1, 0, 2, 0, 1, 2, 2, 1, 0], "validation": [0, 1, 2]}  # 3 batches of the tiny run's 4


def jpeg(split: str, index: int) -> bytes:
    return encoded(photo(48, 40, seed=index + 100 * (split == "validation")))


def hub_dataset(labels: dict = LABELS, image: str = "image", label: str = "label"):
    """A datasets.DatasetDict of real JPEGs with an Image feature and a ClassLabel, as the Hub's image classification
    sets have them."""
    import datasets

    features = datasets.Features({image: datasets.Image(), label: datasets.ClassLabel(names=CLASSES)})
    return datasets.DatasetDict({split: datasets.Dataset.from_dict(
        {image: [{"bytes": jpeg(split, index), "path": None} for index in range(len(values))], label: values},
        features=features) for split, values in labels.items()})


def hub_folder(root, dataset=None, shards: int = 2):
    """`dataset` (hub_dataset's) as the Hub keeps its Parquet: data/<split>-0000i-of-0000n.parquet."""
    (root / "data").mkdir(parents=True)
    for split, part in (dataset or hub_dataset()).items():
        for shard in range(shards):
            part.shard(shards, shard, contiguous=True).to_parquet(root / "data" / f"{split}-{shard:05d}-of-{shards:05d}.parquet")
    return root


def open_hf(path, tmp_path, **settings):
    return hf.Hf(str(path), cache_dir=str(tmp_path / "hf-cache"), **settings).stores(None, no_staging)


def refusal(path, tmp_path, **settings) -> str:
    with pytest.raises(ConfigError) as refused:
        open_hf(path, tmp_path, **settings)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_parquet_in_the_hubs_layout_is_read_with_its_labels_class_names_and_bytes(tmp_path):
    root = hub_folder(tmp_path / "set")
    stores = open_hf(root, tmp_path)
    assert stores.classes == CLASSES
    for split, store in (("train", stores.train), ("validation", stores.val)):
        assert store.labels.tolist() == LABELS[split] and store.labels.dtype == "int64"
        assert [store.read(index) for index in range(len(store))] == [
            (jpeg(split, index), label) for index, label in enumerate(LABELS[split])]
    assert stores.train.name(7) == f"{root / 'data/train-00001-of-00002.parquet'}[1]"  # 6 rows a shard
    converted = stores.train.files([0, 11])
    assert len(converted) == 1 and (tmp_path / "hf-cache") in converted[0].parents  # read from datasets' Arrow
    assert open_hf(root, tmp_path).train.files([0]) == converted  # converted once: a later start finds it


def test_a_parquet_file_rewritten_with_its_mtime_put_back_is_converted_again(tmp_path):
    """datasets finds a conversion by its files' paths and mtimes alone: a file relabelled and its mtime put back
    (cp -p, rsync -t, tar) was read with its old labels."""
    root = hub_folder(tmp_path / "set", shards=1)
    assert open_hf(root, tmp_path).train.labels.tolist() == LABELS["train"]
    file = root / "data/train-00000-of-00001.parquet"
    before = file.stat()
    relabelled = [(label + 1) % 3 for label in LABELS["train"]]
    hub_dataset({"train": relabelled})["train"].to_parquet(file)
    os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert open_hf(root, tmp_path).train.labels.tolist() == relabelled
    assert len(list((tmp_path / "hf-cache").glob("parquet-*"))) == 2, "a conversion a split: the stale one removed"


@pytest.mark.full  # a whole tiny run, 7 s on 2 cores; test_save_load.py's fast tier builds the run from pack's Parquet
def test_one_epoch_trains_from_parquet_in_the_hubs_layout(train_in_process, tmp_path):
    summary = train_in_process("format=hf", f"format.path={hub_folder(tmp_path / 'set')}",
                               f"format.cache_dir={tmp_path / 'hf-cache'}")
    assert summary.choices["format"] == "hf" and summary.steps == 3 and summary.skipped_files == 0
    assert [(entry["trained"], entry["left_out"]) for entry in summary.coverage] == [(12, 0)]
    assert torch.load(train_in_process.run_dir / "best.pt")["inference"]["classes"] == CLASSES


def test_a_save_to_disk_folder_is_read_in_place(tmp_path):
    hub_dataset().save_to_disk(tmp_path / "disk")
    stores = open_hf(tmp_path / "disk", tmp_path)
    assert stores.classes == CLASSES and stores.val.labels.tolist() == LABELS["validation"]
    assert stores.val.read(2) == (jpeg("validation", 2), 2)
    arrow = tmp_path / "disk/validation/data-00000-of-00001.arrow"
    assert stores.val.name(2) == f"{arrow}[2]" and stores.val.files([0, 2]) == [arrow]
    assert not (tmp_path / "hf-cache").exists()  # nothing converted, nothing copied


def test_a_data_set_in_the_datasets_cache_is_read_offline_by_its_hub_name(tmp_path, monkeypatch):
    """The cache as load_dataset('user/name') leaves it: user___name/default/0.0.0/<hash>/name-<split>.arrow, filled
    here from Parquet without the Hub. Reading it calls nothing of the Hub's."""
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    root, cache = hub_folder(tmp_path / "set", shards=1), tmp_path / "hf-cache"
    files = {split: [str(root / "data" / f"{split}-00000-of-00001.parquet")] for split in LABELS}
    Parquet(cache_dir=str(cache), dataset_name="name", config_id="default", data_files=files,
            hash="0123abcd").download_and_prepare()
    (cache / "name").rename(cache / "user___name")
    asked = []
    monkeypatch.setattr("huggingface_hub.HfApi.hf_hub_download", lambda self, *args, **kwargs: asked.append(args))
    monkeypatch.setattr("huggingface_hub.HfApi.dataset_info", lambda self, *args, **kwargs: asked.append(args))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as on a machine online
    monkeypatch.chdir(tmp_path)  # no folder user/name here
    stores = open_hf("user/name", tmp_path)
    assert stores.classes == CLASSES and stores.train.labels.tolist() == LABELS["train"]
    assert stores.train.read(5) == (jpeg("train", 5), LABELS["train"][5])
    assert asked == [] and datasets.config.HF_HUB_OFFLINE is False
    assert refusal("user/other", tmp_path) == (
        f"format.path=user/other: no folder has that name here, and the datasets cache at {cache} does not hold it: "
        "load it there once online, datasets.load_dataset('user/other', cache_dir=...), or pass the folder of its files")
    assert refusal("user/name", tmp_path, val_split="test") == (
        "user/name in the datasets cache has no split test: it has train, validation; name one with format.val_split=")
    Parquet(cache_dir=str(cache), dataset_name="name", config_name="other", config_id="other", data_files=files,
            hash="0123abcd").download_and_prepare()  # another configuration of the same revision
    (cache / "name/other").rename(cache / "user___name/other")
    assert re.fullmatch(rf"format.path=user/name: the datasets cache at {re.escape(str(cache))} holds it, but not as "
                        r"one data set to read offline \(There are multiple 'user/name' configurations in the cache: "
                        r"(default, other|other, default)\): save the one to train on with save_to_disk and pass that "
                        "folder", refusal("user/name", tmp_path))


def test_column_names_are_settings_and_bytes_without_datasets_metadata_are_read(tmp_path):
    """Parquet written by plain pyarrow: the images a binary column, the labels integers, no ClassLabel."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "set").mkdir()
    for split, labels in LABELS.items():
        pq.write_table(pa.table({"img": pa.array([jpeg(split, index) for index in range(len(labels))], pa.binary()),
                                 "fine_label": labels}), tmp_path / "set" / f"{split}.parquet")
    assert refusal(tmp_path / "set", tmp_path) == (f"{tmp_path / 'set'} (format.train_split=train) has no column "
                                                   "image: its columns are img, fine_label; pass "
                                                   "format.image_column=<one of them>")
    assert refusal(tmp_path / "set", tmp_path, image_column="img") == (
        f"{tmp_path / 'set'} (format.train_split=train) has no column label: its columns are img, fine_label; pass "
        "format.label_column=<one of them>")
    stores = open_hf(tmp_path / "set", tmp_path, image_column="img", label_column="fine_label")
    assert stores.classes == ["0", "1", "2"]  # numbered: no ClassLabel names them
    assert stores.train.read(3) == (jpeg("train", 3), 1) and stores.train.payloads(2, 5) == [
        jpeg("train", index) for index in range(2, 5)]


def test_a_split_named_otherwise_is_refused_naming_the_files_there(tmp_path):
    root = hub_folder(tmp_path / "set")
    assert refusal(root, tmp_path, val_split="val") == (
        f"{root} has no Parquet file of the split format.val_split=val (val-*.parquet, val.parquet or val/*.parquet) "
        "and no save_to_disk folder val/: it is not a packed data set, nor one in the Hub's layout with that split; it "
        "holds data/train-00000-of-00002.parquet, data/train-00001-of-00002.parquet, "
        "data/validation-00000-of-00002.parquet, data/validation-00001-of-00002.parquet: name their split with "
        "format.val_split=")


def test_labels_that_are_not_class_numbers_are_refused_in_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "names").mkdir()
    for split in LABELS:
        pq.write_table(pa.table({"image": pa.array([jpeg(split, 0)], pa.binary()), "label": ["cat"]}),
                       tmp_path / "names" / f"{split}.parquet")
    assert refusal(tmp_path / "names", tmp_path) == (
        f"{tmp_path / 'names'} (format.train_split=train): format.label_column=label holds Value('string'), not a "
        "class number per row; pass the column of class numbers, or make one with dataset.class_encode_column('label')")
    unlabelled = hub_folder(tmp_path / "test", hub_dataset({"train": [0, 1], "validation": [1, -1]}))
    assert refusal(unlabelled, tmp_path) == (
        f"{unlabelled} (format.val_split=validation): format.label_column=label holds -1, the Hub's mark of an "
        "unlabelled row (as in test splits): pick a labelled split with format.val_split=")
    assert re.fullmatch(rf"{re.escape(str(unlabelled))} \(format.train_split=train\): format.image_column=label holds "
                        r"ClassLabel\(.*\), not encoded images; pass the column of images: an Image feature, bytes or "
                        "file paths", refusal(unlabelled, tmp_path, image_column="label"))


def test_a_damaged_parquet_file_is_one_line_naming_it(tmp_path):
    root = hub_folder(tmp_path / "set")
    shard = root / "data/train-00001-of-00002.parquet"
    data = shard.read_bytes()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    shard.write_bytes(data[:4] + bytes(footer - 4) + data[footer:])  # pages zeroed, the footer sound
    assert re.fullmatch(rf"{re.escape(str(shard))} is not a readable Parquet file \(OSError: .*\): truncated or "
                        "damaged; copy or write it again", refusal(root, tmp_path))
    shard.write_bytes(data[:len(data) // 2])
    assert re.fullmatch(rf"{re.escape(str(shard))} is not a readable Parquet file \(\w+: .*\): truncated or "
                        "damaged; copy or write it again", refusal(root, tmp_path))


def test_a_single_split_saved_to_disk_is_refused_saying_what_to_save(tmp_path):
    hub_dataset()["train"].save_to_disk(tmp_path / "one")
    assert refusal(tmp_path / "one", tmp_path) == (f"{tmp_path / 'one'} holds one split, as Dataset.save_to_disk "
                                                   "writes it: save a DatasetDict of its train and validation splits "
                                                   "there instead")


def test_an_unreadable_image_is_skipped_and_counted_as_in_every_format(tmp_path):
    """Garbage bytes, and an image held by a path that is gone; one held by a path that is there is read."""
    import datasets

    (tmp_path / "photo.jpg").write_bytes(jpeg("train", 0))
    (tmp_path / "gone.jpg").write_bytes(jpeg("train", 0))  # removed once the Parquet is written
    images = [{"bytes": b"not a jpeg", "path": None}, {"bytes": None, "path": str(tmp_path / "gone.jpg")},
              {"bytes": None, "path": str(tmp_path / "photo.jpg")}, {"bytes": jpeg("train", 1), "path": None}]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    (tmp_path / "set").mkdir()
    for split in LABELS:
        datasets.Dataset.from_dict({"image": images, "label": [0, 1, 2, 1]}, features=features).to_parquet(
            tmp_path / "set" / f"{split}.parquet")
    (tmp_path / "gone.jpg").unlink()
    stores = open_hf(tmp_path / "set", tmp_path)
    assert stores.train.read(2)[0] == jpeg("train", 0)
    source = sources.folder(None, 16, 20, "skip", max_bad_fraction=0.5)
    splits = make_splits(source, stores, PilDecoder())
    batches = make_loader(splits.train, 2, False, 0, World(0, 0, 1, CPU), num_workers=0, prefetch_factor=2,
                          pin_memory=False, persistent_workers=False, collate=splits.decoder.collate)
    assert sum(len(labels) for _, labels in batches) == 4  # the bad images' places taken by others
    assert splits.skipped_files(World(0, 0, 1, CPU)) == 2


def test_pack_writes_parquet_in_the_hubs_naming_with_a_card_that_datasets_reads(packs, tmp_path):
    import datasets

    meta = json.loads((packs["hf"] / META).read_text())
    shards = sorted(path.name for path in (packs["hf"] / "train").iterdir())
    assert len(shards) > 1, "several shards: chunk_mb is small in the packs fixture"
    assert shards == [f"train-{index:05d}-of-{len(shards):05d}.parquet" for index in range(len(shards))]
    assert all(re.fullmatch(r"validation-\d{5}-of-\d{5}\.parquet", path.name) for path in (packs["hf"] / "val").iterdir())
    read = datasets.load_dataset(str(packs["hf"]), cache_dir=str(tmp_path / "hf-cache"))
    assert sorted(read) == ["train", "validation"] and read["train"].features["label"].names == meta["classes"]
    ours = open_hf(packs["hf"], tmp_path)
    for split, store in (("train", ours.train), ("validation", ours.val)):
        theirs = read[split].cast_column("image", datasets.Image(decode=False))
        assert theirs["label"] == store.labels.tolist()
        assert [row["bytes"] for row in theirs["image"]] == [store.read(index)[0] for index in range(len(store))]


def test_a_staging_that_copies_is_refused_saying_where_the_arrow_files_go(compose_tiny):
    cfg = compose_tiny("format=hf", "staging=tmpfs")
    with pytest.raises(ConfigError, match=r"^staging=tmpfs has nothing to copy: format=hf reads the Arrow files "
                                          r"datasets keeps .* point format.cache_dir at a tmpfs"):
        check_fit(cfg.format, cfg.staging, cfg.decoder, cfg.order)
