"""format=hf with format.streaming=true: the training split's Parquet files streamed by datasets, split by process
and by worker, shuffled again each epoch, every process given the same number of batches, a run stopped mid-epoch
resumed to the uninterrupted run's weights, and each bad input refused in one line."""
import importlib.util
import zlib

import pytest
import torch
from torch.utils.data import default_collate

from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.data.format import hf_stream
from {{ cookiecutter.package }}.data.images import Images

from helpers.processes import stopped_after_first_checkpoint
from helpers.runs import summary
from test_hf import hub_dataset, jpeg, open_hf, refusal

pytestmark = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="pip install -e '.[hf]'")

CPU = torch.device("cpu")
LABELS = {"train": [index % 3 for index in range(26)], "validation": [0, 1, 2, 0]}  # 4 files: 7, 7, 6 and 6 rows


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """The Stores of a folder in the Hub's layout with 4 training Parquet files of row groups of 3, its training split
    streamed."""
    tmp_path = tmp_path_factory.mktemp("stream")
    (tmp_path / "set/data").mkdir(parents=True)
    for split, part in hub_dataset(LABELS).items():
        for shard in range(4):
            part.shard(4, shard, contiguous=True).to_parquet(
                tmp_path / f"set/data/{split}-{shard:05d}-of-00004.parquet", batch_size=3)  # a row group a batch
    return open_hf(tmp_path / "set", tmp_path, streaming=True, shuffle_buffer=8)


def epoch_of(stores, epoch: int, rank: int = 0, world_size: int = 1, workers: int = 0, seed: int = 0,
             skip_images: int = 0) -> list[list[tuple[int, int]]]:
    """Each batch one process trains in `epoch`, as its images' (CRC-32, label)."""
    images = Images(stores.train, zlib.crc32, "raise", seed=seed)  # the payload's checksum, not its pixels
    loader = stores.train_loader(images, world=World(rank, rank, world_size, CPU), batch_size=2, seed=seed,
                                 collate=default_collate, worker_init_fn=None, num_workers=workers, prefetch_factor=2,
                                 pin_memory=False, persistent_workers=True)
    loader.set_epoch(epoch, skip_images)
    batches = [list(zip(crcs.tolist(), labels.tolist())) for crcs, labels in loader]
    assert len(batches) == len(loader) and loader.coverage() is None
    return batches


SOURCE = {(zlib.crc32(jpeg("train", index)), label) for index, label in enumerate(LABELS["train"])}  # as streamed


def test_an_epoch_streams_each_image_at_most_once_in_its_capped_batches(streamed, caplog):
    assert streamed.train.labels.tolist() == LABELS["train"] and streamed.classes == ["cat", "dog", "eel"]
    assert [streamed.train.read(index) for index in range(26)] == [  # by index, as an unreadable image's neighbour
        (jpeg("train", index), label) for index, label in enumerate(LABELS["train"])]
    assert streamed.train.name(13).endswith("train-00001-of-00004.parquet[6]")
    with caplog.at_level("INFO"):
        taken = [image for batch in epoch_of(streamed, 0) for image in batch]
    assert len(taken) == len(set(taken)) == 26 and set(taken) == SOURCE  # alone, with no worker: every whole batch
    assert "leaves out 0 of the 26 training images" in caplog.text


def test_two_ranks_of_two_workers_take_as_many_batches_and_disjoint_images(streamed, caplog):
    with caplog.at_level("INFO"):
        ranks = [epoch_of(streamed, 1, rank, 2, workers=2) for rank in (0, 1)]
    # Each process gets 2 of the 4 files, one per worker: 6 or 7 rows, 3 whole batches, whichever files it gets.
    assert len(ranks[0]) == len(ranks[1]) == hf_stream.least_batches([7, 7, 6, 6], 2, 2, 2) == 6
    taken = [image for batches in ranks for batch in batches for image in batch]
    assert len(taken) == len(set(taken)) == 24 and set(taken) < SOURCE
    assert "leaves out 2 of the 26 training images" in caplog.text


def test_the_order_is_drawn_again_each_epoch_and_again_the_same_for_the_seed(streamed):
    first = epoch_of(streamed, 0, workers=2)
    assert epoch_of(streamed, 0, workers=2) == first
    assert epoch_of(streamed, 1, workers=2) != first
    assert epoch_of(streamed, 0, workers=2, seed=1) != first


def test_a_resumed_epoch_drops_the_batches_trained(streamed):
    whole = epoch_of(streamed, 2, rank=1, world_size=2, workers=2)
    assert epoch_of(streamed, 2, rank=1, world_size=2, workers=2, skip_images=12) == whole[3:]  # 3 batches of 2, twice


def test_the_fewest_batches_hold_whichever_files_a_process_and_its_workers_get():
    assert hf_stream.least_batches([5, 5, 5, 5], 2, 2, 2) == 4  # a file per worker: 2 whole batches each
    assert hf_stream.least_batches([9, 1, 1, 1], 2, 1, 2) == 1  # a process may get the two smallest files
    assert hf_stream.least_batches([8, 8, 8], 2, 1, 2) == 6  # 3 files, 2 processes: every other row, 12 each
    assert hf_stream.least_batches([8], 1, 2, 2) == 4  # one file: the second worker streams nothing


def test_a_save_to_disk_folder_and_a_hub_name_are_refused_in_one_line(tmp_path):
    hub_dataset().save_to_disk(tmp_path / "saved")
    assert "is a save_to_disk folder, of Arrow files: format.streaming=true reads Parquet files; set " \
           "format.streaming=false" in refusal(tmp_path / "saved", tmp_path, streaming=True)
    assert "format.streaming=true reads a folder of Parquet files, not the datasets cache" in refusal(
        "someone/no-such-set", tmp_path, streaming=True)


EXACT = ("format=hf", "format.streaming=true", "train.epochs=3", "train.batch_size=2", "cudnn=deterministic",
         "loader.num_workers=2", "train.log_every=1")  # 11 steps an epoch: the pack's 24 images leave out 2


@pytest.mark.full
def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_runs_weights(tmp_path, cache_dir, tiny_root, packs,
                                                                           train_cli):
    """SIGTERM once a checkpoint is written: the resumed run reads the cut epoch's stream again, drops the batches
    trained, and ends where the uninterrupted run did, bit for bit."""
    train_cli(tmp_path / "straight", *EXACT)
    run_dir = tmp_path / "interrupted"
    stopped_after_first_checkpoint(run_dir, EXACT, cache_dir, tiny_root)
    stopped = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)["progress"]
    assert 0 < stopped["images_in_epoch"] < 22, f"the stop did not come mid-epoch: {stopped}"
    train_cli(run_dir, *EXACT, "resume=auto")
    expected = torch.load(tmp_path / "straight/last.pt", map_location="cpu", weights_only=False)["model"]
    resumed = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)["model"]
    assert summary(run_dir).steps == summary(tmp_path / "straight").steps == 33
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
