"""The data path: uint8 crops out of the workers, bad files skipped and counted, seeded augmentation."""
import io

import numpy as np
import pytest
import torch
from PIL import Image

from {{ cookiecutter.package }}.config import ConfigError
from {{ cookiecutter.package }}.data import (MEAN, STD, CenterCrop, ImageFiles, OnDevice, TrainCrop, image_folder,
                                             make_loader)
from {{ cookiecutter.package }}.distributed import World

CPU = torch.device("cpu")
ALONE = World(rank=0, local_rank=0, size=1, device=CPU)


def loader(dataset, batch_size: int, train: bool, world: World = ALONE, seed: int = 0, num_workers: int = 0):
    """make_loader with the CPU settings every test here shares."""
    return make_loader(dataset, batch_size, train, seed, world, num_workers=num_workers, prefetch_factor=2,
                       pin_memory=False, persistent_workers=False)


def encoded(image: Image.Image, format: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


def photo(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, width)[None, :, None] * np.ones((height, 1, 3))
    pixels = np.clip(base + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels).convert(mode)


ODD_FILES = {
    "rgb": encoded(photo(500, 375)),
    "grayscale": encoded(photo(500, 375, "L")),
    "cmyk": encoded(photo(500, 375, "CMYK")),
    "png_named_jpeg": encoded(photo(300, 200), "PNG"),
    "progressive": encoded(photo(500, 375), progressive=True),
    "large": encoded(photo(4000, 3000)),
    "tiny": encoded(photo(16, 16)),
}


@pytest.mark.parametrize("kind", ODD_FILES)
@pytest.mark.parametrize("transform", [TrainCrop(64), CenterCrop(64, 73)], ids=["train", "val"])
def test_any_image_becomes_a_uint8_rgb_crop(kind, transform):
    image = transform(ODD_FILES[kind])
    assert image.dtype == torch.uint8 and image.shape == (3, 64, 64)


def test_reduced_scale_decode_matches_full_decode():
    """The DCT-domain shortcut (decode at 1/4 scale) stays close to decoding everything and resizing."""
    data = encoded(photo(2000, 1500), quality=95)
    fast = CenterCrop(64, 73)(data).float()
    full = Image.open(io.BytesIO(data)).convert("RGB")
    side = 64 * 1500 / 73
    left, top = (2000 - side) / 2, (1500 - side) / 2
    reference = full.resize((64, 64), Image.BILINEAR, box=(left, top, left + side, top + side))
    difference = (fast - torch.from_numpy(np.array(reference)).permute(2, 0, 1).float()).abs()
    assert difference.mean() < 4


def test_validation_crop_is_deterministic():
    data = ODD_FILES["rgb"]
    assert torch.equal(CenterCrop(64, 73)(data), CenterCrop(64, 73)(data))


@pytest.fixture
def tree_with_bad_files(tmp_path):
    for split in ("train", "val"):
        for label in ("a", "b"):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for index in range(4):
                (folder / f"{index}.JPEG").write_bytes(encoded(photo(80, 60, seed=index)))
    good = (tmp_path / "train/a/0.JPEG").read_bytes()
    (tmp_path / "train/a/zero.JPEG").write_bytes(b"")
    (tmp_path / "train/a/truncated.JPEG").write_bytes(good[: len(good) // 2])
    (tmp_path / "train/b/text.JPEG").write_text("not an image")
    return tmp_path


def test_bad_files_are_skipped_counted_once_and_batches_keep_their_size(tree_with_bad_files):
    splits = image_folder(str(tree_with_bad_files), 32, 36, "skip")
    batches = loader(splits.train, 4, False, num_workers=2)
    for _ in range(2):  # two epochs, so each bad file is met twice, in a different worker process each time
        assert [len(labels) for _, labels in batches] == [4, 4, 3]
    assert splits.skipped_files(ALONE) == 3


def test_bad_file_raises_with_its_path_when_asked(tree_with_bad_files):
    splits = image_folder(str(tree_with_bad_files), 32, 36, "raise")
    bad_index = next(i for i, (path, _) in enumerate(splits.train.samples) if path.name == "zero.JPEG")
    with pytest.raises(RuntimeError, match="zero.JPEG"):
        splits.train[bad_index]


def test_missing_or_empty_root_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        image_folder(str(tmp_path / "nowhere"), 32, 36, "skip")
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError, match="has no class folders"):
        image_folder(str(tmp_path), 32, 36, "skip")
    (tmp_path / "train/cat").mkdir()
    with pytest.raises(ConfigError, match="holds no .JPEG"):
        image_folder(str(tmp_path), 32, 36, "skip")
    (tmp_path / "train/cat/1.JPEG").write_bytes(b"")
    with pytest.raises(ConfigError, match="val is not a folder"):
        image_folder(str(tmp_path), 32, 36, "skip")
    (tmp_path / "val/dog").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"train/ lacks: \['dog'\]"):
        image_folder(str(tmp_path), 32, 36, "skip")
    with pytest.raises(ConfigError, match="on_error"):
        ImageFiles([], TrainCrop(32), "ignore")


def augmented(seed: int, epochs: int = 2) -> list[torch.Tensor]:
    """Crops of one image repeated, through 2 workers: every difference comes from the random streams."""
    data = ODD_FILES["rgb"]

    class Same(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            return TrainCrop(16)(data), 0

    batches = loader(Same(), 2, False, seed=seed, num_workers=2)
    return [images for _ in range(epochs) for images, _ in batches]


def test_augmentation_differs_per_worker_and_epoch_and_repeats_per_seed():
    first, again, other = augmented(seed=1), augmented(seed=1), augmented(seed=2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    worker0_batch0, worker1_batch0 = first[0], first[1]
    assert not torch.equal(worker0_batch0, worker1_batch0)
    epoch0, epoch1 = first[:4], first[4:]
    assert not any(torch.equal(a, b) for a, b in zip(epoch0, epoch1))


def test_on_device_normalises_and_keeps_length():
    images = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    loader = OnDevice(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, torch.tensor([0, 1])),
                                                  batch_size=2), CPU)
    assert len(loader) == 1
    (normalised, labels), = list(loader)
    expected = (255 - torch.tensor(MEAN)) / torch.tensor(STD)
    assert normalised.dtype == torch.float32 and torch.allclose(normalised[0, :, 0, 0], expected)
    assert labels.tolist() == [0, 1]


def test_validation_shards_cover_every_image_once():
    dataset = torch.utils.data.TensorDataset(torch.arange(10))
    shards = [list(loader(dataset, 3, False, World(rank, rank, 3, CPU))) for rank in range(3)]
    seen = sorted(int(value) for shard in shards for (batch,) in shard for value in batch)
    assert seen == list(range(10))


def test_training_shards_are_disjoint_and_reshuffled_per_epoch():
    dataset = torch.utils.data.TensorDataset(torch.arange(12))

    def epoch(rank, number):
        shuffled = OnDevice(loader(dataset, 2, True, World(rank, rank, 2, CPU)), CPU)
        shuffled.set_epoch(number)
        return [int(value) for (batch,) in shuffled.loader for value in batch]

    assert sorted(epoch(0, 0) + epoch(1, 0)) == list(range(12))
    assert epoch(0, 0) != epoch(0, 1)
