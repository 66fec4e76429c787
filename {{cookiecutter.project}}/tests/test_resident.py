"""staging=device: a pixel pack held in the device's memory and each batch cut there. Its crops draw from the loader
workers' distribution and are as faithful as theirs; every image is trained once an epoch, in the sampler's order,
with the same crops whatever the processes or the resume; progressive resizing grows them; what does not fit is
refused in one line. The save/load round trip of a run under it is test_save_load.py's, which globs conf/staging/."""
import math
import random
import sys

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.contracts import Layout, Stores
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.data import resident
from {{ cookiecutter.package }}.data.crops import CenterCrop, CropSchedule, TrainCrop
from {{ cookiecutter.package }}.data.decoder import Decoded, pixel_box
from {{ cookiecutter.package }}.data.fit import check_fit
from {{ cookiecutter.package }}.data.format.tensor import Tensor, TensorImages
from {{ cookiecutter.package }}.data.order import BlockOrder, RandomOrder

from helpers.images import photo
from helpers.machines import TWO_PROCESSES
from helpers.runs import summary

CPU = torch.device("cpu")
SIZES = [(int(width), int(height)) for width, height in np.random.default_rng(0).integers(24, 120, (120, 2))]


def pixel_pack(folder, sizes=SIZES, name="train"):
    """A format=tensor split of photos of `sizes` (width, height), labelled by index mod 3, written as pack writes it."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.u8"
    Tensor(None).write(path, ((np.asarray(photo(width, height, seed=index)), index % 3)
                              for index, (width, height) in enumerate(sizes)), 64)
    return TensorImages(path, {})


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pack")
    return resident.DevicePack(pixel_pack(folder), CPU), [np.asarray(photo(w, h, seed=i)) for i, (w, h) in
                                                           enumerate(SIZES)]


def worker_boxes(width: int, height: int, crop: TrainCrop, draws: int) -> np.ndarray:
    """(width, height) of `draws` boxes TrainCrop cuts from one image, as the loader workers draw them."""
    random.seed(7)
    boxes = [crop(width, height)[0] for _ in range(draws)]
    return np.array([(right - left, bottom - top) for left, top, right, bottom in boxes], dtype=np.float64)


def ks(first: np.ndarray, second: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical distributions."""
    values = np.sort(np.concatenate([first, second]))
    cdf = [np.searchsorted(np.sort(sample), values, side="right") / len(sample) for sample in (first, second)]
    return float(np.abs(cdf[0] - cdf[1]).max())


@pytest.mark.parametrize("size", [(40, 30), (28, 28), (90, 20)], ids=["4:3", "square", "panorama, often the fallback"])
def test_device_boxes_draw_from_the_workers_distribution(size):
    """20,000 boxes of one image each way: the area's share and the log-ratio distributions within a KS distance of
    0.02 (two samples of 20,000 from one distribution exceed it about once in 1,000), and as many mirrored."""
    width, height = size
    crop, draws = TrainCrop(32, (0.08, 1.0)), 20_000
    indices = np.arange(draws)
    boxes, flips = resident.train_boxes(np.full(draws, width), np.full(draws, height), crop,
                                        resident.uniforms(3, 1, indices))
    device = boxes[:, 2:].astype(np.float64)
    worker = worker_boxes(width, height, crop, draws)
    for shape in (lambda box: box[:, 0] * box[:, 1] / (width * height), lambda box: np.log(box[:, 0] / box[:, 1])):
        assert ks(shape(device), shape(worker)) < 0.02
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 0] + boxes[:, 2] <= width).all()
    assert (boxes[:, 1] + boxes[:, 3] <= height).all() and abs(flips.mean() - 0.5) < 0.02
    room = width - boxes[:, 2]  # the left edge uniform over the room the box leaves, ends included
    spread = boxes[room > 0, 0] / room[room > 0]
    assert abs(spread.mean() - 0.5) < 0.02 and spread.min() == 0 and spread.max() == 1


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    return 10 * math.log10(255 ** 2 / max(float(np.mean((image - reference) ** 2)), 1e-12))


def test_a_crop_cut_on_the_device_is_as_faithful_as_the_workers(pack):
    """Against torchvision's resized_crop (antialiased) of the same box, over 120 crops of 24-120 pixel photos to 32:
    the device's median 40.9 dB beside the workers' (OpenCV's) 40.0 dB; over the 18 crops twice the output or more
    each way, which both average over areas, 40.9 beside 39.8. Pixel for pixel within 2 of the workers' where
    neither averages."""
    pack, photos = pack
    indices = np.arange(len(photos))
    boxes, flips = resident.train_boxes(pack.widths, pack.heights, TrainCrop(32), resident.uniforms(0, 2, indices))
    cut = pack.crops(indices, boxes, flips, 32).numpy().astype(np.float64)
    device, worker, near = [], [], []
    for index, (left, top, width, height) in enumerate(boxes):
        reference = F.resized_crop(torch.from_numpy(photos[index].copy()).permute(2, 0, 1), int(top), int(left),
                                   int(height), int(width), [32, 32], antialias=True)
        reference = (reference.flip(-1) if flips[index] else reference).permute(1, 2, 0).numpy().astype(np.float64)
        workers = Decoded(photos[index], (left, top, left + width, top + height), bool(flips[index]), 32).resized()
        device.append(psnr(cut[index], reference))
        worker.append(psnr(workers.astype(np.float64), reference))
        if min(width, height) < 64:
            near.append(np.abs(cut[index] - workers).max())
    assert np.median(device) >= np.median(worker) - 0.5, (np.median(device), np.median(worker))
    assert max(near) <= 2 and sum(min(box[2:]) >= 64 for box in boxes) == 18


def test_centre_crops_are_the_workers_boxes(pack):
    pack, _ = pack
    crop = CenterCrop(32, 36)
    boxes = resident.center_boxes(pack.widths, pack.heights, crop)
    for index, (width, height) in enumerate(SIZES):
        left, top, right, bottom = pixel_box(crop(width, height)[0], width, height)
        assert boxes[index].tolist() == [left, top, right - left, bottom - top]


def epoch(pack, processes: int, workers: int, order, epoch: int = 1, skip: int = 0, began: Layout | None = None,
          stop_after: int | None = None, crop: TrainCrop | None = None) -> dict:
    """index -> its crop, for every image the processes of a job train in `epoch` (their first `stop_after` batches
    each); each process's trace checked against what it yielded."""
    crops = {}
    for rank in range(processes):
        batches = resident.DeviceBatches(pack, 5, World(rank, rank, processes, CPU), crop or TrainCrop(16), 0,
                                         order, Layout(processes, workers, 5))
        if began:
            batches.load_state({"layout": vars(began)})
        batches.set_epoch(epoch, skip)
        assert len(batches) == (len(SIZES) - skip) // processes // 5
        taken = []
        for number, (images, labels) in enumerate(batches):
            if number == stop_after:
                break
            indices = batches.trace.plan.indices(number)
            assert labels.tolist() == (indices % 3).tolist() and images.dtype == torch.uint8
            crops.update(zip(indices.tolist(), images))
            taken.append(indices)
        assert [index.tolist() for index in batches.trace.taken[:len(taken)]] == [index.tolist() for index in taken]
    return crops


@pytest.mark.parametrize("order", [RandomOrder(), BlockOrder(block=8, window=2)], ids=["random", "blocks"])
def test_every_image_once_an_epoch_with_its_own_crop_whatever_the_processes(pack, order):
    pack, _ = pack
    alone, shared = epoch(pack, 1, 1, order), epoch(pack, 2, 3, order)
    for crops, processes in ((alone, 1), (shared, 2)):
        assert len(SIZES) - len(crops) < processes * 5  # less at most one global batch
    if isinstance(order, RandomOrder):  # one order whatever the layout: the same images, each with its crop
        assert alone.keys() == shared.keys()
        assert all(torch.equal(alone[index], shared[index]) for index in alone)


def test_a_resume_on_another_layout_trains_the_rest_of_the_epoch_once(pack):
    pack, _ = pack
    order, began = BlockOrder(block=8, window=2), Layout(2, 3, 5)
    whole = epoch(pack, 2, 3, order)
    before = epoch(pack, 2, 3, order, stop_after=4)
    after = epoch(pack, 1, 2, order, skip=len(before), began=began)
    assert not before.keys() & after.keys() and before.keys() | after.keys() == whole.keys()
    assert all(torch.equal(whole[index], {**before, **after}[index]) for index in whole)


def test_the_crop_grows_with_progressive_resizing(pack):
    pack, _ = pack
    crop = TrainCrop(32, schedule=CropSchedule(32, 16, (0, 2)))
    sides = [next(iter(epoch(pack, 1, 1, RandomOrder(), epoch=number, crop=crop).values())).shape[0]
             for number in range(3)]
    assert sides == [16, 24, 32]


def test_validation_cuts_every_image_of_the_shard_once(pack):
    pack, photos = pack
    batches = [resident.DeviceBatches(pack, 7, World(rank, rank, 2, CPU), CenterCrop(32, 36), 0, None, None)
               for rank in range(2)]
    labels = [label for shard in batches for _, labels in shard for label in labels.tolist()]
    assert sorted(labels) == sorted(index % 3 for index in range(len(photos)))
    assert [images.shape for images, _ in batches[0]][0] == (7, 32, 32, 3)


def test_a_pack_that_does_not_fit_is_refused_in_one_line_naming_both_sizes(tmp_path, monkeypatch):
    stores = Stores(pixel_pack(tmp_path), pixel_pack(tmp_path, SIZES[:10], "val"), ["a", "b", "c"])
    needed = (tmp_path / "train.u8").stat().st_size + (tmp_path / "val.u8").stat().st_size
    monkeypatch.setattr(resident, "free_bytes", lambda device: needed + 2**30)  # a GiB over the pack
    resident.device_loaders(stores, TrainCrop(16), CenterCrop(16, 18), World(0, 0, 1, CPU), 4, 0, RandomOrder(),
                            Layout(1, 0, 4), reserve_gb=0.5)
    with pytest.raises(ConfigError) as refused:
        resident.device_loaders(stores, TrainCrop(16), CenterCrop(16, 18), World(0, 0, 1, CPU), 4, 0, RandomOrder(),
                                Layout(1, 0, 4), reserve_gb=2.0)
    assert str(refused.value) == (
        f"staging=device cannot hold the pack: the pack's {needed / 2**20:.1f} MiB do not fit in the cpu's "
        f"{(needed + 2**30) / 2**30:.2f} GiB free with staging.reserve_gb=2 to spare; train from it where it is with "
        "staging=none, whose loader workers crop it, lower staging.reserve_gb where the model needs less, or pack "
        "smaller images (pack.short_side)")


@pytest.mark.parametrize(("overrides", "refusal"), [
    (("format=folder", f"decoder={options.default('decoder')}"), "staging=device crops decoded pixels on the device, and format=folder stores encoded files: "
                         "pack them with format=tensor pack.short_side=<side> and train from that, or pick "
                         "staging=none"),
    (("format=tensor", "decoder=none", "augment=trivial_augment"),
     "augment=trivial_augment changes each crop in the loader's workers, which staging=device has none of: pass "
     "augment=none, or staging=none"),
])
def test_what_the_device_cannot_cut_is_refused_in_one_line(compose_tiny, overrides, refusal):
    cfg = compose_tiny("staging=device", *overrides)
    with pytest.raises(ConfigError) as refused:
        check_fit(cfg.format, cfg.staging, cfg.decoder, cfg.order, cfg.augment)
    assert str(refused.value) == refusal


@pytest.mark.gpu
def test_the_pack_on_a_gpu_cuts_the_crops_the_cpu_does(pack, tmp_path):
    cpu, _ = pack
    gpu = resident.DevicePack(pixel_pack(tmp_path), torch.device("cuda"))
    assert gpu.pixels.is_cuda and torch.equal(gpu.pixels.cpu(), cpu.pixels)
    indices = np.arange(len(SIZES))
    boxes, flips = resident.train_boxes(cpu.widths, cpu.heights, TrainCrop(32), resident.uniforms(0, 2, indices))
    difference = (gpu.crops(indices, boxes, flips, 32).cpu().int() - cpu.crops(indices, boxes, flips, 32).int()).abs()
    assert difference.max() <= 1  # float rounding of the same arithmetic on two devices


def on_the_device(packs) -> tuple[str, ...]:
    return ("format=tensor", "decoder=none", f"format.path={packs['tensor']}", "staging=device", "staging.reserve_gb=0",
            "train.epochs=2")


@pytest.mark.full  # two whole epochs, 4 s
def test_a_run_checks_each_epochs_coverage_with_no_loader_worker(train_in_process, packs):
    result = train_in_process(*on_the_device(packs), "loader.num_workers=auto")
    assert [(entry["checked"], entry["trained"] + entry["left_out"]) for entry in result.coverage] == [(True, 24)] * 2
    assert result.system["sys/loader_cpu"] == 0 and result.setup["workers_s"] < 1  # auto swept nothing


@pytest.mark.full  # torchrun and two processes, 20 s
def test_two_processes_each_hold_the_pack_and_train_every_image_once_an_epoch(tmp_path, train_cli, packs):
    run_dir = tmp_path / "run"
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")
    train_cli(run_dir, *on_the_device(packs), launcher=launcher, env=TWO_PROCESSES)
    result = summary(run_dir)
    assert result.processes == 2 and result.steps == 2 * 3  # 24 images, batches of 4 in each of 2 processes
    assert [(entry["checked"], entry["processes"], entry["trained"]) for entry in result.coverage] == [(True, 2, 24)] * 2


@pytest.mark.full  # a starved epoch, 4 s
def test_a_starved_run_on_a_pack_that_fits_is_advised_to_hold_it_on_the_device(train_in_process, packs):
    result = train_in_process("format=tensor", "decoder=none", f"format.path={packs['tensor']}",
                              "faults.read_delay_ms=20")
    advice = [suggestion for suggestion in result.suggestions if suggestion["key"] == "staging"]
    assert [suggestion["value"] for suggestion in advice] == [options.only("staging", "on_device")]
    assert "fit in the cpu's" in advice[0]["fact"] and "waited for data" in advice[0]["fact"]
