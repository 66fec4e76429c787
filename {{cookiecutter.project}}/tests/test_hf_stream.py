"""format=hf with format.streaming=true: the training split read from its Parquet files where they are, a run of rows
at a time under order=blocks, on the layouts the Hub has (equal files and a short last one, fewer files than
workers, files that do not divide among the processes): every image once an epoch, less at most one global batch,
each row group read once per run, a run stopped mid-epoch resumed on another worker count to the uninterrupted
run's weights, and each bad input refused in one line."""
import importlib.util
import zlib
from collections import Counter
from dataclasses import replace
from itertools import islice

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import default_collate

from {{ cookiecutter.package }}.contracts import Layout
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.data.format.hf import parquet
from {{ cookiecutter.package }}.data.images import Images
from {{ cookiecutter.package }}.data.fit import check_order
from {{ cookiecutter.package }}.data.loaders import training_loader
from {{ cookiecutter.package }}.data.order import BlockOrder, RandomOrder
from {{ cookiecutter.package }}.options import CONF

from helpers.processes import stopped_after_first_checkpoint
from helpers.runs import summary
from test_hf import CLASSES, hub_dataset, open_hf, refusal

pytestmark = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="pip install -e '.[hf]'")

CPU = torch.device("cpu")
# The Hub's usual layout: equal files and a short last one; files that two processes cannot share evenly; one file,
# fewer than the workers. Row counts per file.
LAYOUTS = {"7 equal files and a short one": [40] * 7 + [12], "3 uneven files": [50, 50, 21], "one file": [90]}


def payload(index: int) -> bytes:
    return f"image {index}".encode()  # read back through its CRC-32, never decoded


INDEX_OF = {zlib.crc32(payload(index)): index for index in range(1024)}


def hub_parquet(folder, rows: list[int], group_rows: int = 10):
    """Training Parquet files of `rows` rows each, in row groups of `group_rows`, with datasets' Image and ClassLabel
    features, as the Hub's data/train-0000i-of-0000n.parquet, and a validation file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import ClassLabel, Features, Image

    schema = Features({"image": Image(), "label": ClassLabel(names=CLASSES)}).arrow_schema
    (folder / "data").mkdir(parents=True)
    first = 0
    for number, count in enumerate(rows):
        indices = range(first, first + count)
        pq.write_table(pa.table({"image": [{"bytes": payload(index), "path": None} for index in indices],
                                 "label": [index % 3 for index in indices]}, schema=schema),
                       folder / "data" / f"train-{number:05d}-of-{len(rows):05d}.parquet", row_group_size=group_rows)
        first += count
    pq.write_table(pa.table({"image": [{"bytes": payload(0), "path": None}], "label": [0]}, schema=schema),
                   folder / "data" / "validation-00000-of-00001.parquet")
    return folder


def epoch(stores, processes: int, workers: int, order, batch_size: int = 4, epoch: int = 1, skip: int = 0,
          began: Layout | None = None, stop_after: int | None = None, started: bool = True) -> tuple[list[int], list]:
    """The images each process of a job trains in `epoch` (its first `stop_after` batches), read through `workers`
    real loader workers (or, not `started`, in this process, in the order the sampler gives those workers), as the
    indices their bytes say; and each process's trace of the epoch, which must hold the same."""
    reading = replace(stores, train=order.reads(stores.train))  # as make_loaders builds the loader
    trained, traces = [], []
    for rank in range(processes):
        images = Images(reading.train, zlib.crc32, "raise", seed=0)
        loader = training_loader(reading, images, batch_size, 0, World(rank, rank, processes, CPU), default_collate,
                                 order, Layout(processes, workers, batch_size), num_workers=workers if started else 0,
                                 prefetch_factor=2, pin_memory=False, persistent_workers=False)
        if began:
            loader.load_state({"layout": vars(began)})
        loader.set_epoch(epoch, skip)
        mine = []
        for crcs, labels in islice(loader, stop_after):
            mine += [INDEX_OF[crc] for crc in crcs.tolist()]
            assert labels.tolist() == [index % 3 for index in mine[-len(labels):]]
        assert np.concatenate(loader.coverage().taken).tolist() == mine, "traced as read"
        trained += mine
        traces.append(loader.coverage())
    return trained, traces


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_epoch_trains_every_image_once_less_a_global_batch_on_the_hubs_layouts(tmp_path, layout):
    stores = open_hf(hub_parquet(tmp_path / "set", LAYOUTS[layout]), tmp_path, streaming=True)
    size = sum(LAYOUTS[layout])
    assert stores.train.labels.tolist() == [index % 3 for index in range(size)]
    for processes in (1, 2):
        for workers in (1, 2, 3, 4):
            # Real loader workers for 2 processes of 4 each; the other layouts' turns are the sampler's alike, and run
            # without starting any (each start of a worker costs a fork).
            trained, traces = epoch(stores, processes, workers, BlockOrder(block=8, window=2),
                                    started=processes * workers == 8)
            counts = Counter(trained)
            assert max(counts.values()) == 1, f"{processes} x {workers}: an image trained twice"
            assert size - len(counts) < processes * 4, f"{processes} x {workers}: {size - len(counts)} left out"
            left_out = {int(index) for trace in traces for index in trace.plan.left_out()}
            assert left_out == set(range(size)) - set(counts), "what is left out is what the sampler says"


def test_a_run_of_rows_reads_each_row_group_it_spans_once(tmp_path, monkeypatch):
    """1,024 images in row groups of 100: an epoch under order=blocks reads a group per run (two where a run spans
    two), where reading image by image read a group per image."""
    stores = open_hf(hub_parquet(tmp_path / "set", [256] * 4, group_rows=100), tmp_path, streaming=True)
    reads = Counter()
    read_group = parquet.ParquetRows.read_group
    monkeypatch.setattr(parquet.ParquetRows, "read_group",
                        lambda self, group: reads.update([group]) or read_group(self, group))
    order = BlockOrder(block=64, window=2)
    trained, traces = epoch(stores, 1, 0, order, batch_size=16)  # no worker: the reads happen in this process
    assert len(trained) == 1024
    runs = len({(int(start), int(stop)) for start, stop in zip(traces[0].plan.drawn.run_starts,
                                                               traces[0].plan.drawn.run_stops)})
    assert sum(reads.values()) <= 2 * runs <= 2 * (1024 // 64 + 1)
    assert set(reads) == set(range(len(stores.train.groups.starts)))  # every group read, none more than its runs ask


def test_a_resumed_epoch_on_another_worker_count_trains_the_rest_once(tmp_path):
    """Stopped after 5 batches a process with 2 processes of 3 workers; resumed with 1 worker each: the rest of the
    epoch is drawn for the layout it began with, so the two parts are the whole epoch once."""
    stores = open_hf(hub_parquet(tmp_path / "set", LAYOUTS["7 equal files and a short one"]), tmp_path, streaming=True)
    order, began = BlockOrder(block=8, window=2), Layout(2, 3, 4)
    whole, _ = epoch(stores, 2, 3, order)
    before, _ = epoch(stores, 2, 3, order, stop_after=5)
    after, _ = epoch(stores, 2, 1, order, skip=len(before), began=began)
    assert sorted(before + after) == sorted(whole) and not set(before) & set(after)


def test_streaming_under_an_order_that_reads_image_by_image_is_refused_in_one_line(tmp_path):
    stores = open_hf(hub_parquet(tmp_path / "set", [30, 30], group_rows=10), tmp_path, streaming=True)
    with pytest.raises(ConfigError) as refused:
        check_order(stores, OmegaConf.load(CONF / "order/random.yaml"))
    assert str(refused.value) == (
        "format.streaming=true reads each training image with its whole Parquet row group (10 rows on average here), "
        "and order=random reads one image at a time: pass order=blocks, which reads a run of consecutive records at "
        "once (order.block: a multiple of the rows a read takes wastes none)")
    check_order(stores, OmegaConf.load(CONF / "order/blocks.yaml"))
    assert RandomOrder().reads(stores.train) is stores.train


def test_names_labels_and_bytes_read_by_index(tmp_path):
    root = tmp_path / "set"
    (root / "data").mkdir(parents=True)
    for split, part in hub_dataset().items():
        for shard in range(2):
            part.shard(2, shard, contiguous=True).to_parquet(
                root / "data" / f"{split}-{shard:05d}-of-00002.parquet", batch_size=4)  # row groups of 4
    from datasets import Image

    stores = open_hf(root, tmp_path, streaming=True)
    source = hub_dataset()["train"].cast_column("image", Image(decode=False))
    assert stores.classes == CLASSES and stores.train.labels.tolist() == source["label"]
    assert [stores.train.read(index)[0] for index in range(len(source))] == [row["bytes"] for row in source["image"]]
    assert stores.train.payloads(3, 9) == [row["bytes"] for row in source["image"][3:9]]  # across files and groups
    assert stores.train.name(7) == f"{root / 'data/train-00001-of-00002.parquet'}[1]"  # 6 rows a file


def test_a_save_to_disk_folder_and_a_hub_name_are_refused_in_one_line(tmp_path):
    hub_dataset().save_to_disk(tmp_path / "saved")
    assert "is a save_to_disk folder, of Arrow files: format.streaming=true reads Parquet files; set " \
           "format.streaming=false" in refusal(tmp_path / "saved", tmp_path, streaming=True)
    assert "format.streaming=true reads a folder of Parquet files, not the datasets cache" in refusal(
        "someone/no-such-set", tmp_path, streaming=True)


EXACT = ("format=hf", "format.streaming=true", "order=blocks", "order.block=4", "order.window=2", "train.epochs=2",
         "train.batch_size=2", "cudnn=deterministic", "loader.num_workers=2", "train.log_every=1")  # 12 steps an epoch


@pytest.mark.full
def test_a_run_stopped_mid_epoch_resumes_on_another_worker_count_to_the_uninterrupted_runs_weights(
        tmp_path, cache_dir, tiny_root, packs, train_cli):
    """SIGTERM once the first epoch's checkpoint is written, then a resume with one loader worker instead of two: the
    cut epoch goes on in the order it began with, each epoch's coverage is checked, and the run ends where the
    uninterrupted run did, bit for bit."""
    train_cli(tmp_path / "straight", *EXACT)
    run_dir = tmp_path / "interrupted"
    stopped_after_first_checkpoint(run_dir, EXACT, cache_dir, tiny_root)
    stopped = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)["progress"]
    assert stopped["epoch"] == 1 and 0 < stopped["images_in_epoch"] < 24, f"the stop did not come mid-epoch: {stopped}"
    train_cli(run_dir, *EXACT, "resume=auto", "loader.num_workers=1")
    expected = torch.load(tmp_path / "straight/last.pt", map_location="cpu", weights_only=False)["model"]
    resumed = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)["model"]
    assert summary(run_dir).steps == summary(tmp_path / "straight").steps == 24
    coverage = summary(run_dir).coverage
    assert [entry["checked"] for entry in coverage] == [True, True]
    assert coverage[1]["trained_before_resume"] == stopped["images_in_epoch"] and coverage[1]["workers"] == [1]
    assert all(entry["trained"] + entry["left_out"] + entry["trained_before_resume"] == 24 for entry in coverage)
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
