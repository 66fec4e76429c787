"""Every decoder agrees with every other: same labels, pixels within JPEG tolerance, same handling of odd files."""
import sys

import cv2
import pytest
import torch
from conftest import CONF, DEVICE, ODD_FILES, encoded, on_this_machine, photo
from hydra import compose, initialize_config_dir

from {{ cookiecutter.package }}.config import ConfigError, build
from {{ cookiecutter.package }}.data import CenterCrop, Images, TrainCrop, imagenet, make_splits
from {{ cookiecutter.package }}.decoder import TurboJpegDecoder, pil
from {{ cookiecutter.package }}.format import folder
from {{ cookiecutter.package }}.staging import no_staging
from test_data import ALONE, CPU, loader

DECODERS = sorted(path.stem for path in (CONF / "decoder").glob("*.yaml"))
NEEDS = {"turbojpeg": "simplejpeg", "dali": "nvidia.dali"}


def make_decoder(name: str, size: int, *overrides: str):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"decoder={name} needs pip install -e '.[{name}]'")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", [f"decoder={name}", f"data.crop_size={size}", "train.batch_size=32",
                                *on_this_machine(f"decoder={name}"), *overrides])
    return build(cfg.decoder)


def crops(decoder, files: list[bytes], crop, size: int, device: torch.device = DEVICE) -> torch.Tensor:
    """What the training step would receive, before normalisation: workers' transform, collate, upload to
    this machine's device; brought back to the CPU to compare."""
    transform = decoder.transform(crop, size)
    images, _ = decoder.collate([(transform(data), 0) for data in files])
    uploaded = decoder.upload(images, device, non_blocking=False)
    assert uploaded.device.type == device.type
    return uploaded.cpu()


def mean_difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference per image, in 0-255 levels."""
    return (a.float() - b.float()).abs().flatten(1).mean(1)


@pytest.mark.parametrize("name", DECODERS)
# Tolerances in 0-255 levels, mean per image, on noisy test images: the resize filters differ slightly.
@pytest.mark.parametrize(("size", "resize", "tolerance"), [(224, 256, 4.0), (64, 73, 6.0)],
                         ids=["224px", "64px-reduced-decode"])
def test_every_odd_file_decodes_like_pil(name, size, resize, tolerance):
    """CMYK, grayscale, PNG named .JPEG, progressive, EXIF-rotated, 4000x3000 and 16x16 all match Pillow."""
    files = list(ODD_FILES.values())
    reference = crops(pil(), files, CenterCrop(size, resize), size)
    result = crops(make_decoder(name, size), files, CenterCrop(size, resize), size)
    assert result.dtype == torch.uint8 and result.shape == (len(files), 3, size, size)
    differences = dict(zip(ODD_FILES, mean_difference(result, reference).tolist()))
    assert max(differences.values()) < tolerance, differences


@pytest.mark.parametrize("name", DECODERS)
def test_no_decoder_applies_exif_orientation(name):
    """The EXIF-rotated file holds the same pixels as the plain one; a decoder that rotated it would differ."""
    decoded = crops(make_decoder(name, 64), [ODD_FILES["rgb"], ODD_FILES["exif_rotated"]], CenterCrop(64, 73), 64)
    assert mean_difference(decoded[:1], decoded[1:]).item() < 1.0
    left, right = decoded[0, :, :, :8].float().mean(), decoded[0, :, :, -8:].float().mean()
    assert right - left > 40  # the ramp still runs left to right: nothing turned it


@pytest.mark.parametrize("name", DECODERS)
def test_random_crops_have_the_size_asked_and_flip_both_ways(name):
    torch.manual_seed(0)
    files = [ODD_FILES["rgb"]] * 24
    result = crops(make_decoder(name, 48), files, TrainCrop(48, scale=(0.9, 1.0)), 48)
    assert result.shape == (24, 3, 48, 48)
    ramp = result[:, :, :, -8:].float().mean((1, 2, 3)) - result[:, :, :, :8].float().mean((1, 2, 3))
    assert (ramp > 40).any() and (ramp < -40).any()  # mirrored ones run right to left


@pytest.mark.parametrize("name", DECODERS)
def test_decoders_agree_on_a_data_set_labels_and_pixels(name, tiny_root):
    source = imagenet(str(tiny_root), 224, 256, "raise")
    stores = folder.build(source, no_staging)

    def validation_batch(decoder):
        splits = make_splits(source, stores, decoder)
        images, labels = next(iter(loader(splits.val, 12, False, collate=decoder.collate)))
        return decoder.upload(images, DEVICE, False).cpu(), labels

    (reference, reference_labels), (result, labels) = validation_batch(pil()), validation_batch(make_decoder(name, 224))
    assert torch.equal(labels, reference_labels)
    assert mean_difference(result, reference).max() < 4.0


@pytest.mark.parametrize("name", DECODERS)
def test_bad_files_are_skipped_the_same_way_by_every_decoder(name, tree_with_bad_files):
    source = imagenet(str(tree_with_bad_files), 32, 36, "skip")
    splits = make_splits(source, folder.build(source, no_staging), make_decoder(name, 32))
    batches = [labels for _, labels in loader(splits.train, 4, False, num_workers=2, collate=splits.decoder.collate)]
    assert [len(labels) for labels in batches] == [4, 4, 3]
    assert splits.skipped_files(ALONE) == 3


@pytest.mark.parametrize("name", ["nvjpeg", "dali"])
def test_gpu_decoders_refuse_a_run_without_a_gpu(name):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"decoder={name} needs pip install -e '.[{name}]'")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        decoder = build(compose("train", [f"decoder={name}"]).decoder)
    with pytest.raises(ConfigError, match=f"decoder={name} decodes on the GPU and this run has none"):
        decoder.check_device(CPU)


def test_missing_simplejpeg_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[turbojpeg\]'"):
        TurboJpegDecoder()


def test_opencv_decoder_keeps_opencv_to_one_thread():
    make_decoder("opencv", 32)
    assert cv2.getNumThreads() == 1


def test_images_keep_the_store_label_whatever_the_decoder(tiny_root):
    source = imagenet(str(tiny_root), 32, 36, "raise")
    stores = folder.build(source, no_staging)
    dataset = Images(stores.val, pil().transform(CenterCrop(32, 36), 32), "raise")
    assert [dataset[i][1] for i in range(len(dataset))] == stores.val.labels.tolist()
    assert sorted(set(stores.val.labels.tolist())) == [0, 1, 2]


def test_reduced_scale_decode_stays_close_to_a_full_decode():
    """The DCT-domain shortcut (decode at 1/4 scale) stays close to decoding everything and resizing."""
    data = encoded(photo(2000, 1500), quality=95)
    fast = crops(pil(), [data], CenterCrop(64, 73), 64)
    full = crops(make_decoder("torchvision", 64), [data], CenterCrop(64, 73), 64)
    assert mean_difference(fast, full).item() < 4


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nvjpeg", "dali"])
def test_gpu_decoders_decode_whole_batches_on_the_gpu_like_pillow(name):
    """The real device path: nvJPEG (through torchvision, or DALI's mixed backend), crops and flips on the GPU."""
    decoder = make_decoder(name, 224)
    assert decoder.decode_device == "cuda"
    files = [data for kind, data in ODD_FILES.items() if kind not in ("cmyk", "png_named_jpeg")]  # the GPU's own
    result = crops(decoder, files, CenterCrop(224, 256), 224)
    reference = crops(pil(), files, CenterCrop(224, 256), 224, CPU)
    assert mean_difference(result, reference).max() < 4.0
