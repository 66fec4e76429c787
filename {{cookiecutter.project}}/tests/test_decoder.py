"""Every decoder agrees with every other: same labels, pixels within JPEG tolerance, same handling of odd
files. The decoders come from conf/decoder/*.yaml, and what each needs from its own `_facts_`."""
import importlib
import io
import logging
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict
from PIL import Image

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.contracts import Crop
from {{ cookiecutter.package }}.core import packages
from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.distributed import ALONE
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.packages import DISTRIBUTION, installs_here, this_machine
from {{ cookiecutter.package }}.data.crops import CenterCrop, TrainCrop
from {{ cookiecutter.package }}.data.decoder import (KEPT_OUTPUTS, CpuDecoder, DecodeCrop, Decoded, Unreadable,
                                                     pillow_decode, pixel_box, scaled)
from {{ cookiecutter.package }}.data.decoder.jpeg import header_size, jpeg_frame, without_app1
from {{ cookiecutter.package }}.data.decoder import nvjpeg
from {{ cookiecutter.package }}.data.decoder.batch import BatchDecoder, Encoded, EncodedOrPixels
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.format import folder
from {{ cookiecutter.package }}.data.images import Images, make_splits
from {{ cookiecutter.package }}.data.fit import check_fit
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.staging import no_staging

from helpers.decoders import DECODERS, compose_decoder, make_decoder, mean_difference, uploaded
from helpers.images import ODD_FILES, encoded, photo
from helpers.loaders import loader
from helpers.machines import CPU, DEVICE, installed, on_this_machine
from helpers.paths import CONF, PROJECT
from helpers.processes import QUIET, error_line
from helpers.runs import summary
from helpers.zoo import ZOO, pillow_reads

def crops(decoder, files: list[bytes], crop, device: torch.device = DEVICE) -> torch.Tensor:
    """What the training step would receive, before normalisation: workers' transform, collate, upload to
    this machine's device; brought back to the CPU to compare."""
    uploaded = upload(decoder, files, crop, device)
    assert uploaded.device.type == device.type
    return uploaded.cpu()


def upload(decoder, files: list[bytes], crop, device: torch.device = DEVICE) -> torch.Tensor:
    """The batch on `device`, as the training loop gets it: nothing waits for the device."""
    transform = decoder.transform(crop)
    images, _ = decoder.collate([(transform(data), 0) for data in files])
    return uploaded(decoder, images, device, non_blocking=True)


@pytest.mark.parametrize("name", DECODERS)
# Tolerances in 0-255 levels, mean per image, on noisy test images: the resize filters differ slightly.
@pytest.mark.parametrize(("size", "resize", "tolerance"), [(224, 256, 4.0), (64, 73, 6.0)],
                         ids=["224px", "64px-reduced-decode"])
def test_every_odd_file_decodes_like_pil(name, size, resize, tolerance):
    """CMYK, grayscale, PNG named .JPEG, progressive, EXIF-rotated, 4000x3000 and 16x16 all match Pillow."""
    files = list(ODD_FILES.values())
    reference = crops(PilDecoder(), files, CenterCrop(size, resize))
    result = crops(make_decoder(name), files, CenterCrop(size, resize))
    assert result.dtype == torch.uint8 and result.shape == (len(files), 3, size, size)
    differences = dict(zip(ODD_FILES, mean_difference(result, reference).tolist()))
    assert max(differences.values()) < tolerance, differences


# EXIF orientations in the forms the web has them: 3 and 8, 6 with a thumbnail, 6 stored as a LONG (which Pillow
# reads), 6 in a second APP1 segment after an XMP packet.
EXIF_FILES = ["exif_rotated_little_endian", "exif_rotated_big_endian", "exif_with_thumbnail",
              "exif_orientation_as_long", "xmp_before_exif"]


@pytest.mark.parametrize("name", DECODERS)
def test_no_decoder_applies_exif_orientation(name):
    """The EXIF-rotated file holds the same pixels as the plain one; a decoder that rotated it would differ."""
    decoder = make_decoder(name)
    decoded = crops(decoder, [ODD_FILES["rgb"], ODD_FILES["exif_rotated"]], CenterCrop(64, 73))
    assert mean_difference(decoded[:1], decoded[1:]).item() < 1.0
    left, right = decoded[0, :, :, :8].float().mean(), decoded[0, :, :, -8:].float().mean()
    assert right - left > 40  # the ramp still runs left to right: nothing turned it
    files = [ZOO[kind] for kind in EXIF_FILES]
    decoded, as_stored = crops(decoder, files, CenterCrop(64, 73)), crops(PilDecoder(), files, CenterCrop(64, 73))
    differences = dict(zip(EXIF_FILES, mean_difference(decoded, as_stored).tolist()))
    assert max(differences.values()) < 6.0, differences


@pytest.mark.parametrize("kind", EXIF_FILES)
def test_a_jpeg_without_app1_has_no_orientation_left_and_the_same_pixels(kind):
    """What TorchCodec is given, so that it turns no image by an orientation it reads its own way."""
    hidden = bytes(without_app1(ZOO[kind]))
    assert jpeg_frame(ZOO[kind]).app1 and not jpeg_frame(hidden).app1
    assert 0x0112 not in Image.open(io.BytesIO(hidden)).getexif()
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(hidden)).convert("RGB")), pillow_reads(ZOO[kind]))


@pytest.mark.parametrize("name", DECODERS)
def test_random_crops_have_the_size_asked_and_flip_both_ways(name):
    torch.manual_seed(0)
    files = [ODD_FILES["rgb"]] * 24
    result = crops(make_decoder(name), files, TrainCrop(48, scale=(0.9, 1.0)))
    assert result.shape == (24, 3, 48, 48)
    ramp = result[:, :, :, -8:].float().mean((1, 2, 3)) - result[:, :, :, :8].float().mean((1, 2, 3))
    assert (ramp > 40).any() and (ramp < -40).any()  # mirrored ones run right to left


@pytest.mark.parametrize("name", DECODERS)
def test_decoders_agree_on_a_data_set_labels_and_pixels(name, tiny_root):
    source = sources.folder(str(tiny_root), 224, 256, "raise")
    stores = folder.Folder().stores(source, no_staging)

    def validation_batch(decoder):
        splits = make_splits(source, stores, decoder)
        images, labels = next(iter(loader(splits.val, 12, False, collate=decoder.collate)))
        return uploaded(decoder, images, DEVICE).cpu(), labels

    (reference, reference_labels), (result, labels) = validation_batch(PilDecoder()), validation_batch(make_decoder(name))
    assert torch.equal(labels, reference_labels)
    assert mean_difference(result, reference).max() < 4.0


@pytest.mark.parametrize("name", DECODERS)
def test_bad_files_are_skipped_the_same_way_by_every_decoder(name, tree_with_bad_files):
    source = sources.folder(str(tree_with_bad_files), 32, 36, "skip")
    splits = make_splits(source, folder.Folder().stores(source, no_staging), make_decoder(name))
    batches = [labels for _, labels in loader(splits.train, 4, False, num_workers=2, collate=splits.decoder.collate)]
    assert [len(labels) for labels in batches] == [4, 4, 3]
    assert splits.skipped_files(ALONE) == 3


def test_each_decoder_is_one_yaml_one_module_and_declares_its_facts():
    """A new decoder is conf/decoder/<name>.yaml and decoder/<name>.py: its tests and bench row follow."""
    for name in options.options("decoder"):
        node = compose_decoder(name)
        module, _, cls = node._target_.rpartition(".")
        assert module.endswith(f".decoder.{name}"), f"decoder={name} builds {node._target_}"
        decoder_class = getattr(importlib.import_module(module), cls) if not options.facts("decoder", name).missing() \
            else None
        facts = options.facts("decoder", name)  # unknown keys would raise here
        assert set(facts.without_gpu) <= set(node), f"decoder={name}: without_gpu names keys it does not have"
        assert (facts.extra is None) == (facts.module is None)
        if decoder_class is not None:  # a batch decoder wants a GPU, a CPU decoder does not
            assert issubclass(decoder_class, BatchDecoder if facts.gpu else CpuDecoder), name


@pytest.mark.parametrize("name", options.gpu_options("decoder"))
def test_gpu_decoders_refuse_a_run_without_a_gpu(name):
    missing = options.facts("decoder", name).missing()
    if missing:
        pytest.skip(f"decoder={name}: {missing}")
    decoder = build(compose_decoder(name))
    with pytest.raises(ConfigError, match=f"decoder={name} decodes on the GPU and this run has none: pass "
                                          "decoder.on_cpu=true"):
        decoder.check_device(CPU)


def test_the_extras_markers_say_where_each_backend_installs():
    """turbojpeg comes as wheels only, for some machines; pyproject.toml's markers say which, and the project reads
    them from its metadata to tell a user whether `pip install` can help."""
    try:
        metadata.requires(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pytest.skip("the project is not installed (pip install -e .): its extras' markers live in its metadata")
    linux = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.12"}
    assert installs_here("turbojpeg", linux)
    assert not installs_here("turbojpeg", {**linux, "platform_machine": "aarch64"})
    assert not installs_here("turbojpeg", {**linux, "python_version": "3.14"})
    assert installs_here("turbojpeg", {"sys_platform": "darwin", "platform_machine": "arm64", "python_version": "3.12"})
    assert installs_here("lmdb", {**linux, "platform_machine": "aarch64"}), "no marker: it installs everywhere"
    for name in DECODERS:  # a package that is here was installed where its extra says it installs
        facts = options.facts("decoder", name)
        assert not facts.module or not options.importable(facts.module) or installs_here(facts.extra), name


def version_range(name: str):
    """The requirement of decoder `name`'s extra that names a version range, or None (none does, or the project's
    metadata, which holds the ranges, is not installed)."""
    extra = options.facts("decoder", name).extra
    return next((requirement for requirement in packages.extra_requirements(extra) if requirement.specifier), None) \
        if extra else None


@pytest.mark.parametrize("name", [name for name in DECODERS if version_range(name)])
def test_a_backend_older_than_its_extra_asks_is_refused_before_it_is_imported(name, monkeypatch):
    """torchcodec before 0.16 has no decode_jpeg, and may not even load beside the torch it was found with (a GPU
    machine's torch 2.11 with torchcodec 0.11): the option is refused, and its tests skip, naming the version found
    and the range asked for."""
    facts, requirement = options.facts("decoder", name), version_range(name)
    if not options.importable(facts.module):
        pytest.skip(f"decoder={name}: {facts.missing()}")
    node = compose_decoder(name, *on_this_machine(f"decoder={name}"))
    version, import_module = metadata.version, importlib.import_module
    monkeypatch.setattr(packages.metadata, "version", lambda dist: "0.0.1" if dist == requirement.name else version(dist))
    monkeypatch.setattr(importlib, "import_module", lambda module, *package: pytest.fail(f"{module} was imported")
                        if module == facts.module else import_module(module, *package))
    line = (f"{requirement.name} 0.0.1 is installed, and [{facts.extra}] asks for {requirement.specifier}: "
            f"pip install -e '.[{facts.extra}]'")
    assert facts.missing() == line
    with pytest.raises(ConfigError) as refused:
        build(node)
    assert str(refused.value) == line


@pytest.mark.parametrize("name", [name for name in DECODERS if options.facts("decoder", name).module])
def test_a_backend_whose_libraries_do_not_load_is_refused_in_one_line(name, monkeypatch):
    """An installed package built for another torch fails inside its import with an OSError or RuntimeError and a
    long story (torchcodec ends its with "[end of libtorchcodec loading traceback]."): its first line is kept."""
    facts = options.facts("decoder", name)
    error = RuntimeError("Could not load libtorchcodec. Likely causes: ...\n[end of libtorchcodec loading traceback].")
    node, import_module = compose_decoder(name, *on_this_machine(f"decoder={name}")), importlib.import_module

    def failing_import(module: str, *package: str):
        if module == facts.module:
            raise error
        return import_module(module, *package)

    monkeypatch.setattr(packages, "wrong_version", lambda distribution, extra: None)
    monkeypatch.setattr(importlib, "import_module", failing_import)
    with pytest.raises(ConfigError) as refused:
        build(node)
    assert str(refused.value) == (
        f"{facts.module} is installed but does not load here (Could not load libtorchcodec. Likely causes: ...): "
        f"reinstall the build made for this torch, pip install --force-reinstall -e '.[{facts.extra}]'")


def cpu_decoders() -> list[str]:
    """The decoders that decode in the loader's workers: neither on a device nor of stored pixels."""
    return [name for name in options.options("decoder")
            if not options.facts("decoder", name).gpu and not options.facts("decoder", name).takes_pixels]


def installed_here(decoders: list[str]) -> list[str]:
    return [name for name in decoders if not options.facts("decoder", name).missing()]


def test_every_cpu_decoder_declares_its_measured_cost_and_the_fastest_installed_costs_least():
    """The cost is measured (scripts/decode_cost.py) and declared once, in each decoder's facts: a new decoder takes its
    place by its own figure, and no other decoder's changes."""
    cpu = cpu_decoders()
    assert cpu and all((options.facts("decoder", name).decode_us or 0) > 0 for name in cpu), "decode_us is missing"
    installed = installed_here(cpu)
    assert options.fastest_cpu_decoder() == min(installed, key=lambda name: options.facts("decoder", name).decode_us)


@pytest.mark.full  # a script through its command line, 3 s
def test_the_cost_script_measures_every_installed_cpu_decoder_on_a_tree_of_lower_case_jpg_files(tiny_root, tmp_path):
    tree = tmp_path / "photos"  # as many trees name their files: .jpg, where the synthetic set writes .JPEG
    for path in tiny_root.rglob("*.JPEG"):
        (tree / path.relative_to(tiny_root)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, (tree / path.relative_to(tiny_root)).with_suffix(".jpg"))
    result = subprocess.run([sys.executable, "scripts/decode_cost.py", "--root", str(tree), "--images", "6",
                             "--passes", "1", "--crop-size", "32"], cwd=PROJECT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, **QUIET})
    assert result.returncode == 0, result.stderr[-2000:]
    assert ", 6 files, 32-pixel crops" in result.stdout
    costs = dict(re.findall(r"decoder=(\w+): decode_us: (\d+)", result.stdout))
    assert sorted(costs) == sorted(installed_here(cpu_decoders())) and all(int(cost) > 0 for cost in costs.values())


def test_a_cpu_decoder_this_machine_cannot_install_is_refused_naming_the_fastest_installed_one(monkeypatch):
    """The default decoder=turbojpeg where it has no wheel (Linux on Arm): its line says pip cannot help and names
    the fastest CPU decoder that is installed, which every piece of advice names instead of it."""
    installed = sorted((options.facts("decoder", name).decode_us, name)
                       for name in options.having("decoder", "decode_us")
                       if not options.facts("decoder", name).missing())
    packaged = [name for _, name in installed if options.facts("decoder", name).module]
    if not packaged:
        pytest.skip("no CPU decoder with a package of its own is installed here to take away")
    gone, facts = packaged[0], options.facts("decoder", packaged[0])
    left = next(name for _, name in installed if name != gone)
    importable = options.importable
    monkeypatch.setattr(options, "importable", lambda module: module != facts.module and importable(module))
    monkeypatch.setattr(packages, "installs_here", lambda extra, environment=None: False)
    assert options.fastest_cpu_decoder() == left
    cfg = composed_as_run(monkeypatch, f"decoder={gone}")
    with pytest.raises(ConfigError) as refused:
        check_fit(cfg.format, cfg.staging, cfg.decoder, cfg.order)
    assert str(refused.value) == (
        f"decoder={gone}: {facts.module} is not installed, and pip cannot install it on this machine "
        f"({this_machine()}): pyproject.toml installs the extra [{facts.extra}] only where it has wheels; "
        f"or pick decoder={left}, the fastest CPU decoder installed here")


def composed_as_run(monkeypatch, *overrides: str) -> DictConfig:
    """The training config as `python -m ... train *overrides` has it, with Hydra's record of the run (what the
    command line named), which is put back as it was after the test."""
    with initialize_config_dir(config_dir=str(options.CONF), version_base="1.3", job_name="train"):
        cfg = compose("train", list(overrides), return_hydra_config=True)
    monkeypatch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def test_the_default_decoder_where_it_cannot_run_gives_way_to_the_fastest_installed_one(monkeypatch, caplog):
    """Where the default decoder cannot be installed (decoder=turbojpeg on Linux on Arm), a run that named no decoder
    decodes with the fastest CPU decoder installed, and says so in one line; a run that named it is refused."""
    default = options.default("decoder")
    facts = options.facts("decoder", default)
    if not facts.module:
        pytest.skip(f"decoder={default}, the default, needs no package of its own")
    importable = options.importable
    monkeypatch.setattr(options, "importable", lambda module: module != facts.module and importable(module))
    monkeypatch.setattr(packages, "installs_here", lambda extra, environment=None: False)
    missing, fastest = facts.missing(), options.fastest_cpu_decoder()
    assert missing and fastest != default
    cfg = composed_as_run(monkeypatch, "train.epochs=2")
    check_fit(cfg.format, cfg.staging, cfg.decoder, cfg.order)
    assert options.name_of("decoder", cfg.decoder) == fastest
    assert type(build(cfg.decoder)).__module__.endswith(f".decoder.{fastest}")
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == [
        f"decoder={default}, the default, cannot run here ({missing}): decoding with decoder={fastest}, the fastest "
        "CPU decoder installed here"]
    cfg = composed_as_run(monkeypatch, f"decoder={default}")
    with pytest.raises(ConfigError, match=re.escape(f"decoder={default}: {missing}; or pick decoder={fastest}, ")):
        check_fit(cfg.format, cfg.staging, cfg.decoder, cfg.order)


@pytest.mark.full
def test_a_run_naming_no_decoder_trains_where_the_default_cannot_and_one_naming_it_stops_in_one_line(train_cli,
                                                                                                   tmp_path):
    """Another package's module of the default decoder's name first on the path, as PyTurboJPEG's `turbojpeg` is where
    it is installed: the run decodes with the fastest CPU decoder installed, saying so once; named, the default is
    refused in one line."""
    default = options.default("decoder")
    facts = options.facts("decoder", default)
    if not facts.distribution:
        pytest.skip(f"decoder={default}, the default, names no distribution that another package could shadow")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / f"{facts.module}.py").write_text("")
    env = {"PYTHONPATH": str(tmp_path / "other")}
    ran = train_cli(tmp_path / "run", env=env)
    said = [line for line in (ran.stdout + ran.stderr).splitlines() if "the default, cannot run here" in line]
    fastest = min((options.facts("decoder", name).decode_us, name)
                  for name in options.having("decoder", "decode_us")
                  if name != default and not options.facts("decoder", name).missing())[1]
    assert len(said) == 1 and said[0].endswith(f"decoding with decoder={fastest}, the fastest CPU decoder installed "
                                               "here"), said
    assert summary(tmp_path / "run").steps > 0
    refused = train_cli(tmp_path / "named", f"decoder={default}", check=False, env=env)
    assert refused.returncode != 0
    assert error_line(refused.stderr).startswith(f"error: decoder={default}: {facts.distribution} is not installed (")


@pytest.mark.parametrize("name", [name for name in DECODERS if "." in (options.facts("decoder", name).module or "")])
def test_a_package_missing_inside_an_installed_namespace_is_missing(name, tmp_path, monkeypatch):
    """CUDA torch installs an `nvidia` namespace (cu13, cudnn, nccl) whether or not DALI is there."""
    facts = options.facts("decoder", name)
    parent = facts.module.split(".")[0]
    (tmp_path / parent).mkdir()
    (tmp_path / parent / "__init__.py").write_text("")  # found first on the path: the only `nvidia` there is
    monkeypatch.syspath_prepend(str(tmp_path))
    real = [module for module in sys.modules if module == parent or module.startswith(parent + ".")]
    for module in real:
        monkeypatch.delitem(sys.modules, module)  # put back after the test
    try:
        assert facts.missing() == f"{facts.module} is not installed: pip install -e '.[{facts.extra}]'"
        with pytest.raises(ConfigError, match=rf"{facts.module} is not installed"):
            build(compose_decoder(name))
    finally:
        sys.modules.pop(parent, None)  # the fake, imported by the lookup


@pytest.mark.parametrize("name", [name for name in DECODERS if options.facts("decoder", name).distribution])
def test_a_module_of_the_same_name_from_another_package_is_missing(name, tmp_path, monkeypatch):
    """PyTurboJPEG installs a top-level `turbojpeg` module too: decoder=turbojpeg counted as installed, and its first
    decode raised PackageNotFoundError in a worker. Such a module is missing, in one line, and so is a distribution
    whose files lack the library it should bundle."""
    facts = options.facts("decoder", name)
    if facts.missing():
        pytest.skip(f"decoder={name}: {facts.missing()}")
    install = f": pip install -e '.[{facts.extra}]'" if installs_here(facts.extra) else ""
    files = metadata.files
    monkeypatch.setattr(metadata, "files", lambda distribution: [file for file in files(distribution)
                                                                  if facts.bundles not in file.name])
    assert facts.missing().startswith(f"{facts.distribution} is not installed ({facts.distribution} here holds no "
                                      f"{facts.bundles}){install}")
    monkeypatch.setattr(metadata, "files", files)
    other = tmp_path / f"{facts.module}.py"
    other.write_text("")  # found first on the path, as another package's module of that name would be
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, facts.module, raising=False)  # put back after the test
    try:
        refusal = (f"{facts.distribution} is not installed (the module {facts.module} here comes from {other}, not "
                   f"from {facts.distribution}){install}")
        assert facts.missing().startswith(refusal)
        with pytest.raises(ConfigError) as refused:
            build(compose_decoder(name))
        assert str(refused.value) == facts.missing()
    finally:
        sys.modules.pop(facts.module, None)  # the stand-in, imported by build


@pytest.mark.parametrize("name", ["rgb", "progressive", "exif_rotated", "grayscale"])
def test_the_end_of_a_jpeg_is_found_past_a_trailer_and_not_in_a_truncated_file(name):
    from {{ cookiecutter.package }}.data.decoder.jpeg import jpeg_end

    image = ODD_FILES[name]
    assert jpeg_end(image) == len(image)
    assert jpeg_end(image + b"\xff\xd8\xff\xe1 a vendor block \xff\xd9") == len(image)
    assert jpeg_end(image + bytes(64)) == len(image)  # zero padding
    assert jpeg_end(image[:-2]) is None and jpeg_end(image[: len(image) // 2]) is None


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("kind", ["baseline_cut_short", "end_marker_missing", "progressive_last_scan_cut"])
def test_a_jpeg_cut_short_gets_pillows_verdict_whatever_the_crop(name, kind):
    """Pillow reads some JPEGs that lack only their end marker and refuses the rest. Every decoder gives its verdict,
    for the top-left quarter, which a region decode reads before the cut, as for the whole image."""
    decoder, data, expected = make_decoder(name), ZOO[kind], pillow_reads(ZOO[kind])
    height, width = 120, 160  # the zoo's size, which Pillow cannot tell of the files it refuses
    for box in ((0, 0, width // 2, height // 2), (0, 0, width, height)):
        if expected is None:
            with pytest.raises(Unreadable):
                decoder.transform(FixedCrop(box, 32))(data)
        else:
            reference = torch.from_numpy(Decoded(expected, box, True, 32).resized()).permute(2, 0, 1)[None]
            assert mean_difference(crops(decoder, [data], FixedCrop(box, 32)), reference).item() < 6.0, box


@pytest.mark.parametrize("name", DECODERS)
def test_an_image_larger_than_pillow_opens_is_refused_from_its_header_before_any_decode(name, monkeypatch):
    """60000 x 60000 pixels claimed by 700 bytes: Pillow refuses to open it (a decompression bomb, over twice
    Image.MAX_IMAGE_PIXELS), and so does every decoder's worker, from the size alone, where OpenCV decoded it at 1/8
    scale and TorchCodec allocated 10.8 GB. A limit set for Pillow holds for every decoder."""
    decoder = make_decoder(name)

    def never(*args):
        raise AssertionError("decoded")

    for method in ("decode", "decode_box"):  # a CPU decoder's; a batch decoder's worker hands the device nothing
        if hasattr(decoder, method):
            monkeypatch.setattr(decoder, method, never)
    transform = decoder.transform(CenterCrop(64, 73))
    assert pillow_reads(ZOO["huge_header"]) is None
    with pytest.raises(Unreadable, match="DecompressionBombError"):
        transform(ZOO["huge_header"])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5000)  # the zoo's 160 x 120 baseline is over twice that
    assert pillow_reads(ZOO["baseline"]) is None
    with pytest.raises(Unreadable, match="DecompressionBombError"):
        transform(ZOO["baseline"])


def test_opencv_keeps_to_one_thread_in_every_decoder_process():
    assert cv2.getNumThreads() == 1  # set when the decoder package is imported, by any process


def test_images_keep_the_store_label_whatever_the_decoder(tiny_root):
    source = sources.folder(str(tiny_root), 32, 36, "raise")
    stores = folder.Folder().stores(source, no_staging)
    dataset = Images(stores.val, PilDecoder().transform(CenterCrop(32, 36)), "raise")
    assert [dataset[i][1] for i in range(len(dataset))] == stores.val.labels.tolist()
    assert sorted(set(stores.val.labels.tolist())) == [0, 1, 2]


def test_decoder_none_is_for_stored_pixels_only():
    from omegaconf import OmegaConf

    from {{ cookiecutter.package }}.data.fit import check_fit

    def option(group: str, name: str):
        return OmegaConf.load(CONF / group / f"{name}.yaml")

    with pytest.raises(ConfigError, match="decoder=none is for formats that store decoded pixels"):
        check_fit(option("format", "folder"), option("staging", "none"), option("decoder", "none"),
                  option("order", "random"))
    with pytest.raises(ConfigError, match="format=tensor stores decoded pixels, so there is nothing to decode: pass decoder=none"):
        check_fit(option("format", "tensor"), option("staging", "none"), option("decoder", "pil"),
                  option("order", "random"))


def test_reduced_scale_decode_stays_close_to_a_full_decode():
    """The DCT-domain shortcut (decode at 1/4 scale) stays close to decoding everything and resizing."""
    data = encoded(photo(2000, 1500), quality=95)
    fast = crops(PilDecoder(), [data], CenterCrop(64, 73))
    pytest.importorskip("torchcodec", reason="pip install -e '.[torchcodec]'")
    full = crops(make_decoder("torchcodec"), [data], CenterCrop(64, 73))
    assert mean_difference(fast, full).item() < 4


def test_batch_crops_never_sample_a_neighbouring_image():
    """nvjpeg lays the batch's images out on one canvas: a crop at an image's edge must repeat that edge,
    not blend in the next image or the gap."""
    black, white = torch.zeros((3, 30, 50), dtype=torch.uint8), torch.full((3, 70, 20), 255, dtype=torch.uint8)
    crops = nvjpeg.crop_resize_flip([black, white, black], [(0, 0, 50, 30), (0, 0, 20, 70), (40, 20, 50, 30)],
                             [False, True, False], 16)
    assert crops.shape == (3, 3, 16, 16)
    assert crops[0].max() == 0 and crops[1].min() == 255 and crops[2].max() == 0


def test_batch_crops_resize_and_flip_like_the_cpu_path():
    pixels = np.asarray(photo(300, 200))
    box = (40, 30, 240, 180)
    expected = torch.from_numpy(Decoded(pixels, box, True, 64).resized()).permute(2, 0, 1)
    (result,) = nvjpeg.crop_resize_flip([torch.from_numpy(pixels).permute(2, 0, 1)], [box], [True], 64)
    assert mean_difference(result[None], expected[None]).item() < 3.0


def test_an_image_nvjpeg_refuses_is_decoded_by_pillow_and_its_batch_goes_on(monkeypatch, caplog):
    """nvJPEG refusing one image of a batch (its own limits, past the header checks the workers make) costs
    that image a CPU decode, with one warning for the run, never the run."""
    decoder = make_decoder("nvjpeg")
    refused, real = ODD_FILES["progressive"], decoder.decode_jpeg

    def refusing(data, device):
        if any(item.numpy().tobytes() == refused for item in (data if isinstance(data, list) else [data])):
            raise RuntimeError("nvjpegDecodeBatched failed: NVJPEG_STATUS_JPEG_NOT_SUPPORTED")
        return real(data, device)

    monkeypatch.setattr(decoder, "decode_jpeg", refusing)
    files = [ODD_FILES["rgb"], refused, ODD_FILES["exif_rotated"]]
    reference = crops(PilDecoder(), files, CenterCrop(64, 73), CPU)
    for _ in range(2):
        assert mean_difference(crops(decoder, files, CenterCrop(64, 73)), reference).max() < 4.0
    assert sum("nvJPEG refused" in record.getMessage() for record in caplog.records) == 1


@pytest.mark.parametrize("backend", ["torchcodec", "torchvision"])
def test_both_nvjpeg_backends_give_pillows_pixels(backend):
    if backend == "torchcodec" and (why := nvjpeg.torchcodec_refusal()):
        pytest.skip(why)
    decoder = make_decoder("nvjpeg", f"decoder.backend={backend}")
    files = [ODD_FILES[kind] for kind in ("rgb", "grayscale", "progressive", "exif_rotated", "trailer")]
    assert decoder.backend == backend
    assert mean_difference(crops(decoder, files, CenterCrop(64, 73)),
                           crops(PilDecoder(), files, CenterCrop(64, 73), CPU)).max() < 4.0


def test_nvjpeg_auto_takes_torchcodec_where_it_loads_and_torchvision_elsewhere(monkeypatch, caplog):
    if why := nvjpeg.torchcodec_refusal():
        pytest.skip(why)
    assert make_decoder("nvjpeg").backend == "torchcodec"
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # as a TorchCodec without decode_jpeg imports
    with caplog.at_level(logging.INFO):
        assert make_decoder("nvjpeg").backend == "torchvision"
    assert any(record.getMessage().startswith("decoder=nvjpeg decodes through torchvision, since torchcodec: torchcodec "
                                              "does not load") for record in caplog.records)
    with pytest.raises(ConfigError, match=r"^decoder.backend=torchcodec: no backend decodes here \(torchcodec: "
                                          r"torchcodec does not load \(.*\): pip install -e '.\[torchcodec\]'\); or "
                                          r"pass decoder.backend=auto$"):
        make_decoder("nvjpeg", "decoder.backend=torchcodec")


def test_only_huffman_coded_8bit_jpegs_go_to_the_device():
    """What a batch decoder's worker hands the device: the bytes (`Encoded`) of these, Pillow's pixels of the rest."""
    worker = EncodedOrPixels(CenterCrop(16, 16))
    assert all(isinstance(worker(ODD_FILES[kind]), Encoded)
               for kind in ("rgb", "grayscale", "progressive", "exif_rotated", "trailer"))
    assert not any(isinstance(worker(ODD_FILES[kind]), Encoded) for kind in ("arithmetic", "png_named_jpeg"))
    assert jpeg_frame(b"") is None and jpeg_frame(ODD_FILES["rgb"][:2]) is None
    # A header the walk cannot follow to its first scan is Pillow's to judge, in the worker: the device would fail the
    # whole batch on it (DALI's pipeline for good).
    assert jpeg_frame(ZOO["junk_between_header_segments"]) is None and jpeg_frame(ZOO["bogus_marker_length"]) is None
    assert torch.equal(worker(ZOO["junk_between_header_segments"]),
                       torch.from_numpy(DecodeCrop(PilDecoder(), CenterCrop(16, 16))(
                           ZOO["junk_between_header_segments"]).resized()))
    with pytest.raises(Unreadable):
        worker(ZOO["bogus_marker_length"])


HEADERS = {**ODD_FILES, **{f"zoo_{kind}": data for kind, data in ZOO.items() if pillow_reads(data) is not None}}


@pytest.mark.parametrize("kind", HEADERS)
def test_the_header_walk_reads_the_size_and_colours_pillow_reads(kind):
    """The workers read a file's size and whether it is CMYK from the JPEG's header segments instead of Pillow's
    Image.open; both must say what Pillow says, whatever segments come first."""
    data, image = HEADERS[kind], Image.open(io.BytesIO(HEADERS[kind]))
    frame = jpeg_frame(data)
    assert header_size(data) == image.size
    if image.format != "JPEG" or kind == "zoo_junk_between_header_segments":  # not a walk to follow: Pillow's to read
        assert frame is None
    else:
        assert frame is not None and frame.cmyk == (image.mode == "CMYK")


class OneJpeg(torch.utils.data.Dataset):
    """`length` copies of one JPEG through a decoder's worker transform."""

    def __init__(self, transform, data: bytes, length: int):
        self.transform, self.data, self.length = transform, data, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return self.transform(self.data), index


@pytest.mark.parametrize("name", options.gpu_options("decoder"))
def test_a_batch_decoders_worker_holds_a_descriptor_per_batch_not_per_image(name):
    """Under a soft limit of 128 open files, a worker eight batches of 32 images ahead (the batch size the decoders
    are composed with here): one shared-memory descriptor per image would need 256 of them."""
    decoder, data = make_decoder(name), ODD_FILES["tiny"]
    dataset = OneJpeg(decoder.transform(CenterCrop(16, 16)), data, 10 * 32)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        batches = iter(torch.utils.data.DataLoader(dataset, batch_size=32, num_workers=1, prefetch_factor=8,
                                                   collate_fn=decoder.collate, timeout=60))
        # The worker fills its eight batches and holds their descriptors until they are taken: wait until they are
        # all in the loader's queue of finished batches (a private attribute, only read).
        deadline = time.monotonic() + 60
        while batches._data_queue.qsize() < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert batches._data_queue.qsize() == 8
        received = list(decoder.uploads(batches, DEVICE, False))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert torch.equal(torch.cat([labels for _, labels in received]), torch.arange(10 * 32))
    reference = crops(PilDecoder(), [data], CenterCrop(16, 16), CPU)
    assert all(mean_difference(images.cpu(), reference).max() < 6.0 for images, _ in received)


def two_batches() -> list[list[bytes]]:
    return [[encoded(photo(320, 240, seed=seed)) for seed in seeds] for seeds in ((1, 2), (3, 4))]


@pytest.mark.parametrize("name", DECODERS)
def test_uploads_stream_each_batch_as_it_uploads_alone_with_its_own_labels(name):
    """A decoder may start `queued_batches` before it hands one over (DALI, whose executor decodes beside the host):
    the stream still yields each batch as it uploads alone, with its labels, though all are kept at once and a pass
    left after its first batch (max_steps, limit_val_batches) still holds one started."""
    decoder, crop = make_decoder(name), CenterCrop(48, 56)
    transform = decoder.transform(crop)
    batches = [decoder.collate([(transform(encoded(photo(160, 120, seed=4 * batch + item))), 4 * batch + item)
                                for item in range(4)]) for batch in range(3)]
    alone = [uploaded(decoder, images, DEVICE).cpu().clone() for images, _ in batches]
    assert not torch.equal(alone[0], alone[1])
    pulled = []

    def loader():
        for batch in batches:
            pulled.append(batch)
            yield batch

    left_early = decoder.uploads(loader(), DEVICE, False)
    next(left_early)
    assert len(pulled) == 1 + decoder.queued_batches, "batches started before the first was handed over"
    streamed = list(decoder.uploads(iter(batches), DEVICE, False))
    assert [labels.tolist() for _, labels in streamed] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    for (images, _), reference in zip(streamed, alone):
        assert torch.equal(images.cpu(), reference)


@pytest.mark.gpu
def test_dali_batches_queued_one_after_another_on_the_gpu_keep_their_own_pixels():
    """Two batches decoded with no sync between them, as the training loop asks for them: each holds its own images."""
    decoder = make_decoder("dali")
    batches = two_batches()
    queued = [upload(decoder, batch, CenterCrop(64, 73)) for batch in batches]
    for batch, result in zip(batches, queued):
        reference = crops(PilDecoder(), batch, CenterCrop(64, 73), CPU)
        assert mean_difference(result.cpu(), reference).max() < 6.0


@pytest.mark.gpu
@pytest.mark.parametrize("name", options.gpu_options("decoder"))
def test_gpu_decoders_decode_whole_batches_on_the_gpu_like_pillow(name):
    """The real device path: nvJPEG (through TorchCodec, or DALI's mixed backend), crops and flips on the GPU."""
    decoder = make_decoder(name)
    assert not decoder.on_cpu
    # cmyk and png_named_jpeg are the workers' alone; arithmetic, also decoded in the workers, mixes the batch
    files = [data for kind, data in ODD_FILES.items() if kind not in ("cmyk", "png_named_jpeg")]
    result = crops(decoder, files, CenterCrop(224, 256))
    reference = crops(PilDecoder(), files, CenterCrop(224, 256), CPU)
    assert mean_difference(result, reference).max() < 4.0
    assert not getattr(decoder, "warned", False), "nvJPEG decoded them all: none was left to Pillow"


@pytest.mark.gpu
def test_nvjpeg_decodes_on_a_side_stream_without_waiting_for_the_step_on_another(gpu_busy):
    """Under a prefetcher the decode runs on a side stream while the step computes: the barrier before nvJPEG
    drains the decode's own stream, so the decode returns with the step still queued. The step has a stream of its
    own here, not the default one, so that what is tested is the barrier, not how a library orders itself after the
    legacy default stream."""
    decoder = make_decoder("nvjpeg")
    assert not decoder.on_cpu
    files, crop = [ODD_FILES["rgb"]] * 8, CenterCrop(64, 73)
    decode_stream, step_stream = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(decode_stream):
        upload(decoder, files, crop)  # nvJPEG makes its handles and buffers once
        decode_stream.synchronize()
        began = time.perf_counter()
        upload(decoder, files, crop)
        decode_stream.synchronize()
        decode_s = time.perf_counter() - began
        with torch.cuda.stream(step_stream):
            gpu_busy(max(0.5, 20 * decode_s))  # a step far longer than a decode
            step_done = step_stream.record_event()
        decoded = upload(decoder, files, crop)
        assert not step_done.query(), "the decode waited for the step on another stream"
        reference = crops(PilDecoder(), files, crop, CPU)
        assert mean_difference(decoded.cpu(), reference).max() < 6.0


@pytest.mark.gpu
def test_nvjpeg_writes_no_block_that_work_queued_on_its_stream_still_reads(gpu_busy):
    """Why the barrier is there: nvJPEG's hardware path does not order itself after the work queued on the caller's
    stream, and the caching allocator may hand it blocks that work has freed but not yet read (the harness of
    pytorch/vision#9606, which corrupts on an H100). On a GPU whose nvJPEG orders itself, this passes either way."""
    decoder = make_decoder("nvjpeg")
    files, crop = [ODD_FILES["rgb"]] * 8, CenterCrop(64, 73)
    image_bytes = 3 * 500 * 375  # one decoded image, the size of block the decode asks for
    decode_stream = torch.cuda.Stream()
    with torch.cuda.stream(decode_stream):
        upload(decoder, files, crop)  # nvJPEG makes its handles and buffers once
        for _ in range(10):
            blocks = [torch.ones(image_bytes, dtype=torch.uint8, device=DEVICE) for _ in files]
            gpu_busy(0.05)  # the reads below wait behind this ...
            sums = torch.stack([block.sum() for block in blocks])
            del blocks  # ... while their blocks go back to this stream's pool, for the decode to be handed
            upload(decoder, files, crop)
            assert sums.tolist() == [image_bytes] * len(files)


REGION_DECODERS = [name for name in DECODERS  # the CPU decoders whose library decodes a region
                   if options.facts("decoder", name).region_decode and not options.facts("decoder", name).gpu]
# Pillow's subsampling: 0 is 4:4:4, 1 is 4:2:2, 2 is 4:2:0; sizes off the MCU grid, so that the last MCUs are partial.
REGION_FILES = {
    "420": encoded(photo(501, 377), subsampling=2), "422": encoded(photo(501, 377), subsampling=1),
    "444": encoded(photo(501, 377), subsampling=0), "grayscale": ODD_FILES["grayscale"],
    "progressive": ODD_FILES["progressive"], "exif_rotated": ODD_FILES["exif_rotated"],
    "arithmetic": ODD_FILES["arithmetic"], "cmyk": ODD_FILES["cmyk"], "png_named_jpeg": ODD_FILES["png_named_jpeg"],
    # Luma sampled 3x1 against chroma, which TurboJPEG decodes but cannot crop; written by libjpeg-turbo's
    # `cjpeg -sample 3x1,1x1,1x1` from photo(96, 72).
    "unusual_sampling": (Path(__file__).parent / "data/unusual_sampling.jpg").read_bytes()}
WHOLE_DECODES = {"cmyk", "png_named_jpeg", "unusual_sampling"}  # Pillow's, or a sampling TurboJPEG cannot crop


def region_boxes(width: int, height: int) -> dict[str, tuple[int, int, int, int]]:
    """Boxes at each corner and edge, in the middle, the whole image, and smaller than one MCU off the MCU grid."""
    w, h = width // 3, height // 3
    return {"top_left": (0, 0, w, h), "top_right": (width - w, 0, width, h), "bottom_left": (0, height - h, w, height),
            "bottom_right": (width - w, height - h, width, height), "left": (0, h, w, 2 * h),
            "right": (width - w, h, width, 2 * h), "top": (w, 0, 2 * w, h), "bottom": (w, height - h, 2 * w, height),
            "middle": (w + 3, h + 5, 2 * w + 1, 2 * h + 7), "whole": (0, 0, width, height),
            "under_one_mcu": (width // 2 + 5, height // 2 + 3, width // 2 + 11, height // 2 + 7)}


@pytest.mark.parametrize("name", REGION_DECODERS)
@pytest.mark.parametrize("kind", REGION_FILES)
@pytest.mark.parametrize("shrink", [1, 2.5, 9], ids=["full-scale", "half-scale", "eighth-scale"])
def test_a_region_decode_matches_the_crop_of_a_full_decode(name, kind, shrink):
    """The region's crop is the full decode's crop, within what libjpeg's upsampling does at the region's edge, and
    only the region was decoded, but from the files decoded whole."""
    decoder, data = make_decoder(name), REGION_FILES[kind]
    size = decoder.image_size(data)
    full = decoder.decode(data, shrink) if decoder.reads(data) else pillow_decode(data, shrink)
    for where, box in region_boxes(*size).items():
        region, region_box = decoder.decode_any(data, size, box, shrink)
        expected_box = scaled(full, size, box)[1]
        left, top, right, bottom = pixel_box(region_box, region.shape[1], region.shape[0])
        full_left, full_top, full_right, full_bottom = pixel_box(expected_box, full.shape[1], full.shape[0])
        cut, expected = region[top:bottom, left:right], full[full_top:full_bottom, full_left:full_right]
        assert cut.shape == expected.shape, (where, cut.shape, expected.shape)
        difference = np.abs(cut.astype(int) - expected.astype(int))
        assert difference.mean() < 1.0 and difference.max() <= 16, (where, difference.mean(), difference.max())
        if kind in WHOLE_DECODES:
            assert region.shape == full.shape
        elif where != "whole":
            assert region.shape[0] * region.shape[1] < full.shape[0] * full.shape[1] / 2, (where, region.shape)


@pytest.mark.parametrize("name", REGION_DECODERS)
def test_random_crops_through_a_region_decode_match_the_full_decode(name):
    """The worker's whole path (size, crop, region decode, resize, flip) against the same crops cut from full decodes."""
    decoder = make_decoder(name)

    class FullDecode(type(decoder)):
        def decode_box(self, data, size, box, shrink):
            return scaled(self.decode(data, shrink), size, box)

    files = [REGION_FILES[kind] for kind in ("420", "422", "444", "grayscale", "progressive")] * 8
    crop = TrainCrop(64)
    random.seed(0)
    region = crops(decoder, files, crop, CPU)
    random.seed(0)
    full = crops(FullDecode(), files, crop, CPU)
    assert mean_difference(region, full).max() < 1.0


class Listed(torch.utils.data.Dataset):
    """`items`, each labelled with its position."""

    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index], index


def test_a_cpu_decoders_collate_resizes_each_crop_into_its_place_in_the_batch():
    """In a loader worker, each slot of the batch is its crop as OpenCV resizes it alone, mirrored where it is
    flipped: from pixels of any size, an upscale, and a view into a larger array."""
    sizes = ((300, 200), (40, 30), (500, 90), (700, 500))
    pixels = [np.asarray(photo(width, height, seed=width)) for width, height in sizes]
    pixels[2] = pixels[2][5:-5, 7:]
    boxes = [(40.5, 30.2, 240.0, 180.7), (0, 0, 40, 30), (300, 10, 420, 80), (10, 20, 690, 480)]
    items = [Decoded(image, box, flip, 128) for image, box in zip(pixels, boxes) for flip in (False, True)]
    images, labels = next(iter(loader(Listed(items), len(items), False, num_workers=1, collate=PilDecoder().collate)))
    assert images.shape == (len(items), 128, 128, 3) and labels.tolist() == list(range(len(items)))
    for index, (item, image) in enumerate(zip(items, images)):
        left, top, right, bottom = pixel_box(item.box, item.pixels.shape[1], item.pixels.shape[0])
        region = item.pixels[top:bottom, left:right]
        # Area averaging from twice the output's side on (the last photo), bilinear below.
        smooth = cv2.INTER_AREA if min(region.shape[:2]) >= 256 else cv2.INTER_LINEAR
        alone = cv2.resize(region, (128, 128), interpolation=smooth)
        assert np.array_equal(image.numpy(), alone[:, ::-1] if item.flip else alone), index


@pytest.mark.parametrize("pixels", [np.zeros((40, 30), np.uint8), np.zeros((40, 30, 4), np.uint8),
                                    np.zeros((40, 30, 3), np.float32)], ids=["grey", "rgba", "float"])
def test_pixels_that_are_not_rgb_bytes_fail_the_resize_loudly_instead_of_leaving_the_slot_unwritten(pixels):
    with pytest.raises(ValueError, match="HWC RGB uint8 expected"):
        Decoded(pixels, (0, 0, 30, 40), False, 16).resize_into(np.zeros((16, 16, 3), np.uint8))


class FixedCrop(Crop):
    def __init__(self, box: tuple[int, int, int, int], size: int):
        self.box, self.size = box, size

    def __call__(self, width: int, height: int) -> tuple[tuple[int, int, int, int], bool]:
        return self.box, True


def test_a_whole_photo_decoded_for_a_small_crop_waits_for_its_batch_already_resized():
    """A decoder without region decode decodes the whole 1600x1200 photo for a crop of a twentieth of it: the
    worker resizes it at once rather than keep the photo until the batch's collate."""
    data, crop = encoded(photo(1600, 1200)), FixedCrop((100, 100, 400, 400), 224)
    decoded = DecodeCrop(PilDecoder(), crop)(data)
    assert decoded.pixels.shape == (224, 224, 3) and not decoded.flip
    assert np.array_equal(decoded.resized(), Decoded(pillow_decode(data, 1), crop.box, True, 224).resized())


@pytest.mark.parametrize("name", REGION_DECODERS)
def test_a_decoded_region_waits_for_its_batch_as_decoded(name):
    """The crop's region, decoded, is under KEPT_OUTPUTS outputs' worth of pixels: the collate resizes it."""
    data, crop = encoded(photo(1600, 1200)), FixedCrop((100, 100, 400, 400), 224)
    decoded = DecodeCrop(make_decoder(name), crop)(data)
    assert decoded.flip and 300 <= min(decoded.pixels.shape[:2]) < 400
    assert decoded.pixels.size <= KEPT_OUTPUTS * 224 * 224 * 3
    whole = Decoded(pillow_decode(data, 1), crop.box, True, 224).resized()
    assert mean_difference(torch.from_numpy(decoded.resized())[None], torch.from_numpy(whole)[None]).item() < 1.0


@pytest.mark.parametrize("name", installed("decoder", ["turbojpeg"]))
def test_turbojpeg_reads_each_files_header_once(name, monkeypatch):
    """A worker asks for a file's size, whether TurboJPEG reads it and its region, one after the other: one header
    read serves the three, and files in turn, each decoded twice, each get their own."""
    decoder, calls = make_decoder(name), []
    call = decoder.call
    monkeypatch.setattr(decoder, "call", lambda function, *args: calls.append(function) or call(function, *args))
    files = [REGION_FILES[kind] for kind in ("420", "444", "grayscale", "420")]
    random.seed(0)
    twice = crops(decoder, [data for data in files for _ in range(2)], TrainCrop(64), CPU)
    assert calls.count("tj3DecompressHeader") == len(files) and calls.count("tj3Decompress8") == 2 * len(files)
    assert twice.shape == (2 * len(files), 3, 64, 64)


@pytest.mark.parametrize("name", installed("decoder", ["turbojpeg"]))
def test_turbojpeg_decodes_the_files_it_warns_about_and_gets_over_a_bad_header(name):
    """libjpeg warns of bytes it skipped once it decoded every pixel, as it does under Pillow, which reads such files;
    a header read that fails leaves the thread's handle unable to read any file after it, unless it is made anew."""
    decoder = make_decoder(name)
    for kind in ("extraneous_bytes_before_end", "junk_between_header_segments", "after_a_bad_header"):
        if kind == "after_a_bad_header":
            with pytest.raises(ValueError, match="Bogus marker length"):
                decoder.header(ZOO["bogus_marker_length"])
        assert decoder.reads(ZOO[kind]), kind
        assert np.abs(decoder.decode(ZOO[kind], 1).astype(int) - pillow_reads(ZOO[kind])).mean() < 1.0, kind


def test_only_decoders_that_decode_a_region_say_so():
    """`region_decode` in a CPU decoder's facts if and only if it decodes less than the whole image."""
    for name in DECODERS:
        facts = options.facts("decoder", name)
        if facts.missing():
            continue
        decoder = make_decoder(name)
        if isinstance(decoder, CpuDecoder):
            assert facts.region_decode == (type(decoder).decode_box is not CpuDecoder.decode_box), name
