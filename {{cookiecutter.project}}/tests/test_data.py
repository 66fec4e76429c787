"""The data path: uint8 crops out of the workers, bad files skipped and counted, a failing disk not taken for
bad files, seeded augmentation."""
import errno
import multiprocessing
import os
import re
import time

import numpy as np
import pytest
import torch

from {{ cookiecutter.package }} import contracts
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import ALONE, World
from {{ cookiecutter.package }}.core.failures import end_workers, explain
from {{ cookiecutter.package }}.core.files import STORAGE_FAILED
from {{ cookiecutter.package }}.data.crops import TrainCrop
from {{ cookiecutter.package }}.data.decoder import decoding
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.device import MEAN, STD, ToDevice
from {{ cookiecutter.package }}.data.format import folder
from {{ cookiecutter.package }}.data.format.folder import FileIndex, ImageFiles, list_split
from {{ cookiecutter.package }}.data.images import (FileChanged, Images, StorageFailed, UnreadableImage, WrongDataSet,
                                                  make_splits)
from {{ cookiecutter.package }}.data.loaders import make_loader
from {{ cookiecutter.package }}.data.prefetcher import NoPrefetcher
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.staging import no_staging

from helpers.images import ODD_FILES
from helpers.loaders import loader
from helpers.machines import CPU

def folder_splits(root, size: int = 32, resize: int = 36, on_error: str = "skip", decoder=None):
    """The splits train.py would build for data=folder format=folder staging=none."""
    source = sources.folder(str(root), size, resize, on_error)
    return make_splits(source, folder.Folder().stores(source, no_staging), decoder or PilDecoder())


def test_bad_files_are_skipped_counted_once_and_batches_keep_their_size(tree_with_bad_files):
    splits = folder_splits(tree_with_bad_files)
    batches = loader(splits.train, 4, False, num_workers=2, collate=splits.decoder.collate)
    for _ in range(2):  # two epochs, so each bad file is met twice, in a different worker process each time
        assert [len(labels) for _, labels in batches] == [4, 4, 3]
    assert splits.skipped_files(ALONE) == 3


def test_bad_file_raises_with_its_path_when_asked(tree_with_bad_files):
    splits = folder_splits(tree_with_bad_files, on_error="raise")
    bad_index = next(i for i, path in enumerate(splits.train.store.paths) if path.name == "zero.JPEG")
    with pytest.raises(UnreadableImage, match="zero.JPEG"):
        splits.train[bad_index]


def test_a_root_at_a_file_is_refused_saying_a_folder_is_wanted(tmp_path):
    (tmp_path / "photos.zip").write_bytes(b"PK")
    with pytest.raises(ConfigError) as refused:
        sources.folder(str(tmp_path / "photos.zip"), 32, 36, "skip")
    assert str(refused.value) == f"data.root={tmp_path / 'photos.zip'} is a file; pass the folder that holds " \
                                 "train/<class>/ and val/<class>/"


def test_missing_or_empty_root_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as refused:
        sources.folder(str(tmp_path / "nowhere"), 32, 36, "skip")
    assert str(refused.value) == f"data.root={tmp_path / 'nowhere'} does not exist; pass the folder that holds " \
                                 "train/<class>/ and val/<class>/"
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError, match="has no class folders"):
        folder_splits(tmp_path)
    (tmp_path / "train/cat").mkdir()
    with pytest.raises(ConfigError) as refused:
        folder_splits(tmp_path)
    assert str(refused.value) == f"{tmp_path / 'train'} holds no image files (.jpg, .jpeg, .png, .ppm, .bmp, .pgm, " \
                                 f".tif, .tiff, .webp); put each class's images in {tmp_path / 'train'}/<class>/"
    (tmp_path / "train/cat/1.JPEG").write_bytes(b"")
    with pytest.raises(ConfigError, match="val is not a folder"):
        folder_splits(tmp_path)
    (tmp_path / "val/dog").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"train/ lacks: \['dog'\]"):
        folder_splits(tmp_path)
    with pytest.raises(ConfigError, match="on_error"):
        Images(ImageFiles(FileIndex.of(tmp_path, [], [])), PilDecoder().transform(TrainCrop(32)), "ignore")


def augmented(seed: int, epochs: int = 2) -> list[torch.Tensor]:
    """Crops of one image repeated, through 2 workers: every difference comes from the random streams."""
    data = ODD_FILES["rgb"]

    class Same(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            return PilDecoder().transform(TrainCrop(16))(data), 0

    batches = loader(Same(), 2, False, seed=seed, num_workers=2, collate=PilDecoder().collate)
    return [images for _ in range(epochs) for images, _ in batches]


def test_augmentation_differs_per_worker_and_epoch_and_repeats_per_seed():
    first, again, other = augmented(seed=1), augmented(seed=1), augmented(seed=2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    worker0_batch0, worker1_batch0 = first[0], first[1]
    assert not torch.equal(worker0_batch0, worker1_batch0)
    epoch0, epoch1 = first[:4], first[4:]
    assert not any(torch.equal(a, b) for a, b in zip(epoch0, epoch1))


def test_to_device_normalises_into_nchw_float():
    images = torch.zeros((2, 4, 4, 3), dtype=torch.uint8)  # NHWC, as CPU decoders' workers deliver them
    images[0] = 255
    normalised, labels = ToDevice(PilDecoder(), CPU, non_blocking=False)((images, torch.tensor([0, 1])))
    assert normalised.shape == (2, 3, 4, 4) and normalised.is_contiguous()
    expected = (255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert normalised.dtype == torch.float32 and torch.allclose(normalised[0, :, 0, 0], expected)
    assert torch.allclose(normalised[1, :, 2, 3], -torch.tensor(MEAN) / torch.tensor(STD))
    assert labels.tolist() == [0, 1]


@pytest.mark.gpu
def test_normalising_a_batch_on_the_gpu_is_one_kernel_into_channels_last():
    from torch.profiler import ProfilerActivity, profile

    images = torch.randint(0, 256, (8, 32, 32, 3), dtype=torch.uint8)  # NHWC, as the workers deliver them
    to_device = ToDevice(PilDecoder(), torch.device("cuda"), False, torch.channels_last)
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        normalised, _ = to_device((images, torch.tensor([0])))
        torch.cuda.synchronize()
    kernels = [event.name for event in profiled.events()
               if event.device_type == torch.autograd.DeviceType.CUDA and not event.name.startswith("Memcpy")]
    assert len(kernels) == 1, kernels
    assert normalised.is_contiguous(memory_format=torch.channels_last)
    expected = (images.permute(0, 3, 1, 2).float() - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(
        1, 3, 1, 1)
    assert torch.allclose(normalised.cpu(), expected, atol=1e-5)


def test_validation_shards_cover_every_image_once():
    dataset = torch.utils.data.TensorDataset(torch.arange(10))
    shards = [list(loader(dataset, 3, False, World(rank, rank, 3, CPU))) for rank in range(3)]
    seen = sorted(int(value) for shard in shards for (batch,) in shard for value in batch)
    assert seen == list(range(10))


class Keys(torch.utils.data.Dataset):
    """Hands back the key the sampler asked for."""

    def __len__(self):
        return 12

    def __getitem__(self, key):
        return torch.tensor(key)


def test_training_shards_are_disjoint_reshuffled_per_epoch_and_name_their_epoch():
    def epoch(rank, number):
        shuffled = NoPrefetcher(loader(Keys(), 2, True, World(rank, rank, 2, CPU)), to_device=lambda batch: batch)
        shuffled.set_epoch(number)
        keys = [key.tolist() for batch in shuffled.loader for key in batch]
        assert {epoch for _, epoch in keys} == {number}  # the data set seeds augmentation from (index, epoch)
        return [index for index, _ in keys]

    assert sorted(epoch(0, 0) + epoch(1, 0)) == list(range(12))
    assert epoch(0, 0) != epoch(0, 1)


class CountedKeys(Keys):
    """Keys, counting every key the workers fetched."""

    def __init__(self):
        self.fetched = multiprocessing.Value("i", 0)

    def __getitem__(self, key):
        with self.fetched.get_lock():
            self.fetched.value += 1
        return super().__getitem__(key)


def test_workers_kept_between_epochs_start_the_next_epoch_and_every_epoch_gets_its_own_images():
    """Workers kept between epochs fetch the next epoch's first batches before it is asked for, and an epoch taken
    whole after one taken whole, after one left part-way, or resumed, gets the images and order set_epoch gives."""
    def alone(epoch: int, skip: int = 0) -> list:
        one = loader(Keys(), 2, True)
        one.set_epoch(epoch, skip)
        return [batch.tolist() for batch in one]

    dataset = CountedKeys()
    kept = make_loader(dataset, 2, True, 0, ALONE, num_workers=2, prefetch_factor=2, pin_memory=False,
                       persistent_workers=True)
    kept.set_epoch(0)
    assert [batch.tolist() for batch in kept] == alone(0)
    ahead = 2 * 2 * 2  # prefetch_factor batches of 2 keys for each of 2 workers
    deadline = time.monotonic() + 30
    while dataset.fetched.value < 12 + ahead and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert dataset.fetched.value == 12 + ahead  # epoch 1's first batches, and no more, before set_epoch(1)
    kept.set_epoch(1)
    assert [batch.tolist() for batch in kept] == alone(1)
    kept.set_epoch(2)
    part_way = iter(kept)
    assert [next(part_way).tolist() for _ in range(2)] == alone(2)[:2]
    kept.set_epoch(3)
    assert [batch.tolist() for batch in kept] == alone(3)
    kept.set_epoch(4, skip_images=4)
    assert [batch.tolist() for batch in kept] == alone(4, 4)


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2), (1, 4)])
def test_a_resumed_epoch_trains_each_image_left_once_whatever_the_number_of_processes(before, after):
    def shard(rank, world, skip_images):
        shuffled = NoPrefetcher(loader(Keys(), 2, True, World(rank, rank, world, CPU)), to_device=lambda batch: batch)
        shuffled.set_epoch(3, skip_images)
        return [key.tolist()[0] for batch in shuffled.loader for key in batch]

    stopped = [shard(rank, before, 0)[:4] for rank in range(before)]  # two batches of 2 each, then a stop
    resumed = [shard(rank, after, 4 * before) for rank in range(after)]
    assert sorted(sum(stopped + resumed, [])) == list(range(12))
    assert len({len(part) for part in resumed}) == 1  # the same number of steps for every process


def test_augmentation_depends_on_the_image_and_epoch_not_on_the_worker_or_the_order(tiny_root):
    splits = folder_splits(tiny_root, size=16, resize=18)

    def crops(keys) -> list[np.ndarray]:
        return [splits.train[key][0].resized() for key in keys]

    first = crops((index, 3) for index in range(4))
    again = crops((index, 3) for index in reversed(range(4)))[::-1]  # another order, same draws
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    other_epoch = crops((index, 4) for index in range(4))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other_epoch))


class Store:
    """A store whose images are good or bad as asked, counting its reads."""
    when_changed = contracts.Store.when_changed

    def __init__(self, bad: set[int], size: int = 40):
        self.bad, self.labels, self.reads = bad, list(range(size)), 0

    def __len__(self):
        return len(self.labels)

    def read(self, index, run=None):
        self.reads += 1
        return (b"bad" if index in self.bad else b"good"), self.labels[index]

    def name(self, index):
        return f"image {index}"


def decode(data):
    with decoding():
        if data == b"bad":
            raise OSError("cannot identify image file")  # what Pillow raises for a file it cannot read
    return torch.zeros(1)


def test_only_a_decoding_error_makes_an_image_unreadable_a_bug_raises():
    images = Images(Store(bad=set()), lambda data: 1 / 0, "skip")  # a bug in our own transform
    with pytest.raises(ZeroDivisionError):
        images[0]
    assert images.bad_flags().sum() == 0
    skipped = Images(Store(bad={3}), decode, "skip")
    assert skipped[3][1] == 4 and skipped.bad_flags().tolist()[3] == 1  # the next image took its place


def test_replacing_a_bad_image_reads_a_bounded_number_and_a_wrong_data_set_stops():
    store = Store(bad=set(range(40)))
    with pytest.raises(WrongDataSet, match="are unreadable"):
        Images(store, decode, "skip", max_bad_fraction=1.0)[0]
    assert store.reads <= 11  # not the whole data set
    half = Images(Store(bad=set(range(0, 40, 2))), decode, "skip")
    with pytest.raises(WrongDataSet, match=r"^11 of the 40 training images are unreadable, more than "
                                           r"data.max_bad_fraction=0.01 allows \(10\)"):
        for index in range(40):
            half[index]
    tolerant = Images(Store(bad=set(range(0, 40, 2))), decode, "skip", max_bad_fraction=0.6)
    assert len([tolerant[index] for index in range(40)]) == 40


class FailedStorage(Store):
    """A store on a disk or mount that failed: every read raises OSError `code`, as the kernel returns it."""

    def __init__(self, code: int):
        super().__init__(bad=set())
        self.code = code

    def read(self, index, run=None):
        self.reads += 1
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", sorted(STORAGE_FAILED), ids=errno.errorcode.get)
def test_a_read_the_storage_failed_stops_the_run_and_is_never_skipped_as_an_unreadable_image(code):
    store = FailedStorage(code)
    images = Images(store, decode, "skip")
    reason = rf"{os.strerror(code)} \({errno.errorcode[code]}\)"
    with pytest.raises(StorageFailed, match=rf"^could not read image 3: {reason}: the storage failed, not the image"):
        images[3]
    assert store.reads == 1 and images.bad_count.value == 0 and images.bad_flags().sum() == 0


def test_a_storage_failure_in_a_loader_worker_is_one_line_naming_the_image_and_the_errno():
    images = Images(FailedStorage(errno.EIO), decode, "skip")
    with pytest.raises(StorageFailed) as raised:
        list(loader(images, 4, False, num_workers=2))
    # The traceback holds the loader's iterator: its workers end here, not when the garbage collector, in whatever
    # test it runs, would wait 20 s for them.
    end_workers()
    line = explain(raised.value)
    assert re.fullmatch(r"could not read image \d+: Input/output error \(EIO\): the storage failed, not the image: "
                        r"check the disk, the mount or the server it is on \(in loader worker [01]\)", line), line


CHANGED = {errno.ENOENT: f"the data set changed since it was opened: {contracts.Store.when_changed}",
           errno.ENOTDIR: "the data set changed since it was opened",
           errno.EISDIR: "the data set changed since it was opened",
           errno.EACCES: "this user may not read it: give it read permission (chmod a+r), or run as a user who may",
           errno.EPERM: "this user may not read it"}


@pytest.mark.parametrize("code", sorted(CHANGED), ids=errno.errorcode.get)
def test_a_file_gone_turned_folder_or_forbidden_since_the_listing_stops_the_run_in_one_line_naming_it(code):
    store = FailedStorage(code)
    images = Images(store, decode, "skip")
    with pytest.raises(FileChanged) as raised:
        images[3]
    assert str(raised.value).startswith(f"could not read image 3: {os.strerror(code)} ({errno.errorcode[code]}): "
                                        f"{CHANGED[code]}")
    assert store.reads == 1 and images.bad_flags().sum() == 0


def test_a_file_removed_while_workers_read_the_tree_is_one_line_naming_it(tmp_path):
    split = tmp_path / "train"
    for index in range(4):
        (split / "cat").mkdir(parents=True, exist_ok=True)
        (split / "cat" / f"{index}.JPEG").write_bytes(b"\xff\xd8")
    files = ImageFiles(list_split(split)[0])
    (split / "cat" / "2.JPEG").unlink()
    with pytest.raises(FileChanged) as raised:
        list(loader(Images(files, lambda data: torch.zeros(1), "skip"), 4, False, num_workers=1))
    end_workers()
    line = explain(raised.value)
    assert line == (f"could not read {split / 'cat' / '2.JPEG'}: No such file or directory (ENOENT): the data set "
                    "changed since it was opened: put the file back, or list the tree again with format.reindex=true "
                    "(a kept index may be stale) (in loader worker 0)"), line


def test_the_same_few_bad_images_read_again_and_again_are_judged_once():
    """What stopped a run in its fourth epoch: re-reads of the same three files counted as new ones."""
    images = Images(Store(bad={3, 17, 29}), decode, "skip")
    for _ in range(20):  # twenty epochs, each meeting all three
        assert len([images[index] for index in range(40)]) == 40
    assert images.bad_count.value == 3 and images.bad_flags().sum() == 3


class OtherProcess:
    """Stands in for a World of two processes: the other one found `theirs` unreadable since the last share."""
    size, device = 2, CPU

    def __init__(self, theirs: set[int], length: int):
        self.flags = torch.zeros(length, dtype=torch.uint8)
        self.flags[list(theirs)] = 1
        self.new = len(theirs)

    def sum(self, counts: torch.Tensor) -> torch.Tensor:
        return counts + torch.tensor([self.new, 0])

    def any(self, flags: torch.Tensor) -> torch.Tensor:
        return torch.maximum(flags, self.flags)


def test_processes_judge_the_union_of_what_each_found_and_a_resume_keeps_it():
    from {{ cookiecutter.package }}.data.images import Splits

    mine, theirs = {0, 2, 4, 6, 8, 10}, {6, 8, 11, 13, 15, 17}  # 6 each, 10 distinct: within BAD_ALLOWED
    train = Images(Store(bad=mine), decode, "skip")
    splits = Splits(train, Images(Store(bad=set()), decode, "skip"), ["x"], None)
    for index in range(20):
        train[index]
    splits.share_unreadable(OtherProcess(theirs, 40))
    assert train.bad_count.value == 10 and sorted(splits.state_dict()["train"]) == sorted(mine | theirs)
    resumed = Splits(Images(Store(bad=mine), decode, "skip"), Images(Store(bad=set()), decode, "skip"), ["x"], None)
    resumed.load_state_dict(splits.state_dict())
    for index in range(20):  # the same images again: nothing new, nothing counted twice
        resumed.train[index]
    assert resumed.train.bad_count.value == 10
    with pytest.raises(WrongDataSet, match=r"^11 of the 40 training images are unreadable"):
        splits.share_unreadable(OtherProcess({19}, 40))  # one more anywhere is one too many, in every process


@pytest.mark.parametrize("size", [32, 64, 224])
def test_full_detail_side_is_the_least_at_which_every_crop_keeps_its_pixels(size):
    import random

    crop = TrainCrop(size)
    side = crop.full_detail_side()
    random.seed(0)
    smallest = min(min(box[2] - box[0], box[3] - box[1]) for box, _ in (crop(side, side) for _ in range(20000)))
    assert size - 1 <= smallest < size + 0.05 * size  # rounding aside, the smallest crops are just the size


def test_a_folder_without_pack_json_is_refused_with_the_command_that_writes_one(tmp_path):
    from {{ cookiecutter.package }}.data.format import read_meta

    with pytest.raises(ConfigError) as refused:
        read_meta(tmp_path, "hdf5")
    assert str(refused.value) == (f"{tmp_path} has no pack.json: it is not a packed data set, or its pack did not "
                                  "finish; write it with python -m {{ cookiecutter.package }}.pack pack.out=<folder>")
