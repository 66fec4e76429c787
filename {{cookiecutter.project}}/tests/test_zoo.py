"""Every decoder and every format against the zoo of the web's JPEGs (helpers/zoo.py): each gives Pillow's verdict on
each file, readable or not, and where it is readable, Pillow's pixels within JPEG tolerance. The decoders and formats
come from conf/, each skipped with its install command where its package is missing."""
import numpy as np
import pytest
import torch

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.contracts import Box, Crop
from {{ cookiecutter.package }}.core.distributed import ALONE
from {{ cookiecutter.package }}.data.crops import CenterCrop
from {{ cookiecutter.package }}.data.decoder import Decoded, Unreadable
from {{ cookiecutter.package }}.data.format import folder
from {{ cookiecutter.package }}.data.images import make_splits
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.staging import no_staging
from {{ cookiecutter.package }}.tools.pack import pack

from helpers.decoders import DECODERS, make_decoder, mean_difference, uploaded
from helpers.loaders import loader
from helpers.machines import DEVICE, installed
from helpers.packs import open_pack
from helpers.zoo import ZOO, pillow_reads, write_tree

# Pillow warns of the zoo's broken EXIF segment, broken on purpose, wherever it decodes that file.
pytestmark = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")


class TopLeftQuarter(Crop):
    """The top-left quarter of the image: a region decode stops above whatever is wrong further down the file."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, width: int, height: int) -> tuple[Box, bool]:
        return (0, 0, width / 2, height / 2), False


CROP = CenterCrop(64, 73)
# The verdict on a file is the same whatever the crop: the full-height square reaches the file's last rows, the top-left
# quarter stops well above them. One output size for all: DALI builds its pipeline for the first it is given.
CROPS = {"centre": CROP, "full_height": CenterCrop(64, 64), "top_left": TopLeftQuarter(64)}
# Mean levels (0-255) per image: the batch decoders' resize filters differ slightly from OpenCV's at this size, as in
# test_decoder's parity tests.
TOLERANCE = 6.0
CPU_DECODERS = [name for name in DECODERS if not options.facts("decoder", name).gpu]
ENCODED_FORMATS = installed("format", [name for name in options.having("format", "packed")
                                       if not options.facts("format", name).holds_pixels])
READABLE = [kind for kind, data in ZOO.items() if pillow_reads(data) is not None]


@pytest.fixture(scope="session")
def zoo_root(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("zoo"))


def pillow_crop(pixels: np.ndarray, crop: Crop) -> torch.Tensor:
    """`crop` of Pillow's pixels, CHW, resized as the CPU decoders' collate resizes it."""
    box, flip = crop(pixels.shape[1], pixels.shape[0])
    return torch.from_numpy(Decoded(pixels, box, flip, crop.size).resized()).permute(2, 0, 1)


def outcome(decoder, data: bytes, crop: Crop) -> torch.Tensor | str:
    """`crop` of `data` as the training step gets it from `decoder` (worker transform, collate, upload), or what went
    wrong: "unreadable", as its worker found it, or the exception it raised."""
    try:
        item = decoder.transform(crop)(data)
    except Unreadable:
        return "unreadable"
    except Exception as err:  # noqa: BLE001 - the test reports every file's fate, not the first traceback
        return f"raised {type(err).__name__} in the worker: {str(err).splitlines()[0][:120]}"
    try:
        images, _ = decoder.collate([(item, 0)])
        return uploaded(decoder, images, DEVICE)[0].cpu()
    except Exception as err:  # noqa: BLE001
        return f"raised {type(err).__name__} at upload: {str(err).splitlines()[0][:120]}"


def disagreement(kind: str, result: torch.Tensor | str, crop: Crop = CROP) -> str | None:
    """How `result`, the decoder's `crop` of the zoo file `kind`, differs from Pillow's verdict on the file, or None."""
    expected = pillow_reads(ZOO[kind])
    if expected is None:
        if isinstance(result, torch.Tensor):
            return "Pillow refuses it, the decoder gives pixels"
        return None if result == "unreadable" else result
    if not isinstance(result, torch.Tensor):
        return f"Pillow reads it, the decoder: {result}"
    difference = mean_difference(result[None], pillow_crop(expected, crop)[None]).item()
    return f"{difference:.1f} levels from Pillow's pixels" if difference >= TOLERANCE else None


@pytest.mark.parametrize("name", DECODERS)
def test_every_decoder_gives_pillows_verdict_and_pixels_on_every_zoo_file(name):
    """In the zoo's order, on one thread, as one worker meets files: the good files after the bad header included."""
    decoder = make_decoder(name)
    found = {(kind, where): disagreement(kind, outcome(decoder, data, crop), crop)
             for kind, data in ZOO.items() for where, crop in CROPS.items()}
    assert not {key: why for key, why in found.items() if why}, f"decoder={name}"


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_a_cpu_decoder_decodes_itself_every_zoo_file_it_says_it_reads(name):
    """Pillow stands in for a CPU decoder only on the files its `reads` turns down: a file it takes, its own decode
    gives Pillow's pixels, warnings and all, rather than failing over to Pillow unseen."""
    decoder = make_decoder(name)
    taken = [kind for kind in READABLE if decoder.reads(ZOO[kind])]
    assert "baseline" in taken and "extraneous_bytes_before_end" in taken
    for kind in taken:
        pixels, expected = decoder.decode(ZOO[kind], 1), pillow_reads(ZOO[kind])
        assert pixels.shape == expected.shape, kind
        assert np.abs(pixels.astype(int) - expected).mean() < TOLERANCE, kind


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_a_zoo_file_pillow_refuses_leaves_a_cpu_decoder_decoding_the_next_one_itself(name):
    """Per-thread library state (TurboJPEG's handle) outlives every refused file: the good file read next on the same
    thread is still the decoder's own to decode, not Pillow's for the rest of the worker's life."""
    decoder, good = make_decoder(name), ZOO["after_a_bad_header"]
    transform = decoder.transform(CROP)
    for kind in [kind for kind in ZOO if kind not in READABLE]:
        with pytest.raises(Unreadable):
            transform(ZOO[kind])
        assert decoder.reads(good), f"after {kind}"
        assert np.abs(decoder.decode(good, 1).astype(int) - pillow_reads(good)).mean() < TOLERANCE, f"after {kind}"


@pytest.mark.parametrize("name", DECODERS)
def test_the_zoo_through_a_loader_worker_keeps_what_pillow_reads_and_skips_the_rest(name, zoo_root):
    """The data set of the zoo, one class per file, read by one worker process under data.on_error=skip."""
    source = sources.folder(str(zoo_root), CROP.size, CROP.resize, "skip")
    splits = make_splits(source, folder.Folder().stores(source, no_staging), make_decoder(name))
    val = loader(splits.val, 8, False, num_workers=1, collate=splits.decoder.collate)
    batches = [(images.cpu(), labels) for images, labels in splits.decoder.uploads(val, DEVICE, False)]
    images, labels = torch.cat([images for images, _ in batches]), torch.cat([labels for _, labels in batches])
    assert {splits.classes[label] for label in labels.tolist()} == set(READABLE)
    assert splits.skipped_files(ALONE) == len(ZOO) - len(READABLE)
    found = {splits.classes[label]: disagreement(splits.classes[label], image) for image, label in zip(images, labels)}
    assert not {kind: why for kind, why in found.items() if why}, f"decoder={name}"


@pytest.mark.parametrize("format", ENCODED_FORMATS)
def test_every_encoded_format_packs_the_zoo_files_pillow_reads_byte_for_byte(format, zoo_root, tmp_path):
    """pack leaves out what Pillow refuses and keeps the rest as it was: every decoder then reads a packed file as it
    reads the file itself."""
    report = pack(zoo_root, format, tmp_path / "packed", None, 90, 1, False, "skip")
    assert report["skipped"] == 2 * (len(ZOO) - len(READABLE))  # in both splits
    stores = open_pack(format, tmp_path / "packed")
    for split in ("train", "val"):
        store = getattr(stores, split)
        records = {stores.classes[label]: payload for payload, label in map(store.read, range(len(store)))}
        assert records == {kind: ZOO[kind] for kind in READABLE}, split
