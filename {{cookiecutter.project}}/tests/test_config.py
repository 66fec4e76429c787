"""Every option of every config group composes and builds; the list comes from globbing conf/."""
import json
import re
import sys
from dataclasses import astuple
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.contracts import Decoder, Layout, Network, Order, Store
from {{ cookiecutter.package }}.core.config import FACTS, RANGES, _bounds, build, check_ranges, describe_range, in_range, ranged_keys
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.packages import installs_here
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.sources import Source
from {{ cookiecutter.package }}.data.staging import no_staging
from {{ cookiecutter.package }}.options import check

from helpers.machines import DEVICE, on_this_machine
from helpers.paths import CONF
from helpers.runs import hydra_run, tiny

# conf/export/ is the export command's own config folder (its target= names the file formats export writes): test_export.py's.
OPTIONS = sorted((path.parent.name, path.stem) for path in CONF.glob("*/*.yaml") if path.parent.name != "export")


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                               torch.nn.LazyLinear(3))


# What the training script passes each group at build time, and what the built object must do.
def check_data(source, cfg, tmp_path, option):
    assert isinstance(source, Source) and source.crop_size == cfg.data.crop_size
    assert (source.root / "train").is_dir() and len(list((source.root / "train").iterdir())) == 3


def check_model(network, cfg, tmp_path, option):
    assert isinstance(network, Network) and network.weights is None  # random: nothing to download
    assert network.architecture(3).eval()(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def check_optim(optimizer, cfg, tmp_path, option):
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == cfg.optim.weight_decay and plain["weight_decay"] == 0.0
    assert all(p.ndim <= 1 for p in plain["params"]) and all(p.ndim > 1 for p in decayed["params"])


def check_schedule(schedule, cfg, tmp_path, option):
    """Built for a run of 4 epochs: its factor at every twentieth of an epoch starts at the warm-up's start, peaks at
    1 within the first epochs, then only falls, to min_lr_ratio at the run's end."""
    factors = [schedule.factor(position / 20) for position in range(4 * 20 + 1)]
    peak = factors.index(max(factors))
    assert factors[0] == pytest.approx(cfg.schedule.warmup_start)
    assert max(factors) == pytest.approx(1.0, rel=0.05) and peak <= 20
    assert all(later <= earlier for earlier, later in zip(factors[peak:], factors[peak + 1:]))
    assert factors[-1] == pytest.approx(cfg.schedule.min_lr_ratio)


def check_logger(logger, cfg, tmp_path, option):
    logger.scalars({"train/loss": 1.5}, 1)
    logger.close("finished")
    assert any((tmp_path / "tb").glob("events.*")) == (option == "tensorboard")


def check_profiler(profiler, cfg, tmp_path, option):
    with profiler:
        for _ in range(4):
            torch.ones(64, 64) @ torch.ones(64, 64)
            profiler.step()
    written = {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file()}
    expected = {"none": set(), "torch": {"profile/trace.json"}, "cprofile": {"profile.prof"}}
    assert written == expected[option]
    if "profile/trace.json" in written:
        assert json.loads((tmp_path / "profile/trace.json").read_text())["traceEvents"]


def check_format(stores, cfg, tmp_path, option):
    assert stores.classes == ["c00", "c01", "c02"] or len(stores.classes) == 3
    assert len(stores.train) == 24 and len(stores.val) == 12
    payload, label = stores.train.read(0)
    assert label in range(3)
    assert payload.ndim == 3 if option == "tensor" else payload[:2] == b"\xff\xd8"  # pixels, or a JPEG


def check_decoder(decoder, cfg, tmp_path, option):
    assert isinstance(decoder, Decoder)
    decoder.check_device(DEVICE)  # built as this machine runs it


def check_staging(stage, cfg, tmp_path, option):
    source = tmp_path / "data"
    (source / "sub").mkdir(parents=True)
    (source / "sub/file").write_bytes(b"x" * 10)
    staged = stage(source)
    assert (staged / "sub/file").read_bytes() == b"x" * 10
    assert (staged == source) == (not options.facts("staging", option).copies_to_ram)  # a copy, or read in place


def check_prefetcher(prefetcher, cfg, tmp_path, option):
    assert len(prefetcher) == 2
    (images, labels), _ = list(prefetcher)
    assert images.dtype == torch.float32 and images.shape == (3, 3, 4, 4) and labels.tolist() == [0, 1, 2]
    assert images.device.type == labels.device.type == DEVICE.type


def check_reduction(accumulation, cfg, tmp_path, option):
    """Two batches summed into a step: the mean of their gradients, and the step's images, the next step empty."""
    model, optimizer = torch.nn.Linear(4, 2), None
    inputs, labels = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([[0, 1], [1, 1]])
    for batch in range(2):
        with accumulation.syncing(model):
            loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
            accumulation.add(loss, len(labels[batch])).backward()
    assert accumulation.due and accumulation.finish(optimizer) == 4
    mean = sum(torch.autograd.grad(torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch]),
                                   model.weight)[0] for batch in range(2)) / 2
    torch.testing.assert_close(model.weight.grad, mean)
    assert accumulation.pending == 0


def check_order(order, cfg, tmp_path, option):
    """Every image once per epoch whoever reads it, the same order for the same seed, another for another."""
    reads = order.reads(NoStore(np.arange(50) % 7))
    assert isinstance(order, Order) and [reads.read(index) for index in (7, 3, 49)] == [(7, 0), (3, 3), (49, 0)]
    for layout in (Layout(1, 1, 4), Layout(2, 3, 5)):
        drawn = [order.draw(50, torch.Generator().manual_seed(seed), layout) for seed in (0, 0, 1)]
        assert sorted(drawn[0].indices.tolist()) == list(range(50))
        assert (drawn[0].indices == drawn[1].indices).all() and not (drawn[0].indices == drawn[2].indices).all()
        if drawn[0].run_starts is not None:  # each image read with a run of records that holds it
            assert (drawn[0].run_starts <= drawn[0].indices).all() and (drawn[0].indices < drawn[0].run_stops).all()
            assert [reads.read(index, (start, stop))[1] for index, start, stop in
                    zip(*(part.tolist() for part in astuple(drawn[0])))] == [index % 7 for index in drawn[0].indices]


class NoStore(Store):
    def payload(self, index: int):
        return index

    def name(self, index: int) -> str:
        return str(index)


def augment_args(tmp_path):
    from {{ cookiecutter.package }}.data.crops import TrainCrop
    from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder

    decoder = PilDecoder()
    return {"transform": decoder.transform(TrainCrop(32)), "decoder": decoder}


def check_augment(transform, cfg, tmp_path, option):
    """The training transform as it was, or wrapped: the same crop for the same draw, an augmented one beside it."""
    import io
    import random

    from PIL import Image

    from {{ cookiecutter.package }}.data.decoder import Decoded

    photo = io.BytesIO()
    Image.effect_mandelbrot((96, 64), (-2, -1, 1, 1), 60).convert("RGB").save(photo, "JPEG")
    crops = []
    for _ in range(2):
        random.seed(7)
        crops.append(transform(photo.getvalue()))
    assert all(isinstance(crop, Decoded) and crop.resized().shape == (32, 32, 3) for crop in crops)
    assert (crops[0].resized() == crops[1].resized()).all()


def prefetcher_args(tmp_path):
    from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
    from {{ cookiecutter.package }}.data.device import ToDevice

    images = torch.zeros((6, 4, 4, 3), dtype=torch.uint8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, torch.arange(6)), batch_size=3)
    return {"loader": loader, "to_device": ToDevice(PilDecoder(), DEVICE, False)}


RUNTIME = {
    "data": (lambda tmp_path: {}, check_data),
    "model": (lambda tmp_path: {}, check_model),
    "optim": (lambda tmp_path: {"model": tiny_model()}, check_optim),
    "schedule": (lambda tmp_path: {"epochs": 4}, check_schedule),
    "logger": (lambda tmp_path: {"run_dir": tmp_path}, check_logger),
    "profiler": (lambda tmp_path: {"run_dir": tmp_path}, check_profiler),
    "format": (lambda tmp_path: {}, check_format),
    "decoder": (lambda tmp_path: {}, check_decoder),
    "staging": (lambda tmp_path: {"world": World(0, 0, 1, torch.device("cpu"))}, check_staging),
    "prefetcher": (prefetcher_args, check_prefetcher),
    "order": (lambda tmp_path: {}, check_order),
    "reduction": (lambda tmp_path: {"batches": 2, "world": World(0, 0, 1, torch.device("cpu"))}, check_reduction),
    "augment": (augment_args, check_augment),
}


OVERLAYS = {"experiment", "debug"}  # groups of values laid over the whole config, not objects to build


def test_every_group_has_a_check():
    groups = {group for group, _ in OPTIONS}
    assert groups == set(RUNTIME) | set(OVERLAYS), "a new config group needs its entry in RUNTIME"


def settings_of(node, prefix: str = ""):
    """(dotted key, value) of every plain value an overlay sets: not its defaults list, nor interpolations."""
    for key, value in node.items():
        if key == "defaults":
            continue
        if isinstance(value, dict):
            yield from settings_of(value, f"{prefix}{key}.")
        elif not (isinstance(value, str) and value.startswith("${")):
            yield f"{prefix}{key}", value


@pytest.mark.parametrize(("group", "option"), [(g, o) for g, o in OPTIONS if g in OVERLAYS])
def test_recipe_and_debug_overlays_compose_with_what_they_set(group, option):
    from hydra import compose, initialize_config_dir

    import {{ cookiecutter.package }}.core.resolvers  # noqa: F401 - registers the resolvers the recipes use

    overlay = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
    paths = paths_left_to_the_user(group, option, CONF)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", [f"{group}={option}", *paths])
    for key, value in settings_of(overlay):
        assert OmegaConf.select(cfg, key) == value, key
    check_ranges(cfg)  # every number a recipe sets is in its key's range
    assert cfg.optim.lr > 0


def test_imagenet_recipe_scales_the_learning_rate_with_the_global_batch(monkeypatch):
    from hydra import compose, initialize_config_dir

    import {{ cookiecutter.package }}.core.resolvers  # noqa: F401 - registers linear_lr

    def lr(processes: int) -> float:
        monkeypatch.setenv("WORLD_SIZE", str(processes))
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("train", ["experiment=imagenet_resnet50"]).optim.lr

    assert lr(1) == pytest.approx(0.1 * 128 / 256) and lr(8) == pytest.approx(0.1 * 1024 / 256)


BUILT = [(g, o) for g, o in OPTIONS if g not in OVERLAYS]
# Options whose build alone takes seconds, built in the full tier, where test_logger.py also reads their runs back.
SLOW_TO_BUILD = {("logger", "mlflow"): "an MLflow run in a SQLite store, 5 s", ("logger", "wandb"): "a W&B run, 3 s"}


@pytest.mark.parametrize(("group", "option"), [
    pytest.param(group, option, id=f"{group}={option}",
                 marks=[pytest.mark.full] if (group, option) in SLOW_TO_BUILD else []) for group, option in BUILT])
def test_option_composes_and_builds(group, option, compose_tiny, tmp_path, tiny_root):
    choice, facts = f"{group}={option}", options.facts(group, option)
    if facts.gpu and not facts.without_gpu and DEVICE.type != "cuda":
        pytest.skip(f"{choice} {facts.gpu} and this machine has no GPU")
    if facts.missing():
        pytest.skip(f"{choice}: {facts.missing()}")
    cfg = compose_tiny(choice, *on_this_machine(choice))
    runtime, check = RUNTIME[group]
    built = build(cfg[group], **runtime(tmp_path))
    if group == "format":  # a Format opens both splits: of the tiny tree, or of the pack its path names
        built = built.stores(sources.folder(str(tiny_root), 32, 36, "skip"), no_staging)
    check(built, cfg, tmp_path, option)


EXTRAS = [(group, option) for group, option in OPTIONS if options.facts(group, option).module]


@pytest.mark.parametrize(("group", "option"), EXTRAS, ids=[f"{g}={o}" for g, o in EXTRAS])
def test_an_option_whose_package_is_missing_is_refused_with_its_install_command(group, option, compose_tiny,
                                                                               monkeypatch):
    facts = options.facts(group, option)
    monkeypatch.setitem(sys.modules, facts.module, None)  # what an absent package looks like to import
    next_step = rf": pip install -e '\.\[{facts.extra}\]'" if installs_here(facts.extra) else \
        rf", and pip cannot install it on this machine \(.*\): pyproject.toml installs the extra \[{facts.extra}\] only"
    with pytest.raises(ConfigError, match=rf"{facts.module} is not installed \(.*\){next_step}"):
        build(compose_tiny(f"{group}={option}")[group])


def test_every_option_declares_only_known_facts():
    for group, option in OPTIONS:
        options.facts(group, option)  # a misspelt key raises TypeError


def numeric_leaves(node, prefix: str = ""):
    """(dotted key, value) of every number in a config, Hydra's own, the ranges themselves and the options' facts
    (what they are, not settings) left out."""
    for key, value in node.items():
        if key in ("hydra", RANGES, FACTS):
            continue
        if isinstance(value, dict):
            yield from numeric_leaves(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def outside(value, spec: str):
    """A value of the same type as `value` that `spec` refuses."""
    candidates = [bound + step for low, high in _bounds(spec) for bound, step in ((low, -1), (high, 1))
                  if bound is not None]
    wrong = next(candidate for candidate in sorted(candidates, key=abs) if not in_range(candidate, spec))
    return int(wrong) if isinstance(value, int) else float(wrong)


@pytest.mark.full  # some 70 Hydra compositions, 8-10 s; each option's own composes in the fast tier
def test_every_number_of_every_option_has_a_range_beside_it_and_out_of_it_is_refused_in_one_line(compose_tiny):
    """One test for both, since composing the config once per option of every group (a group's numbers are only
    there when picked) takes some 70 Hydra compositions, 6 s."""
    # Recipes set keys the other options already have (and may pick another data set): their own test checks them.
    tried = set()
    for cfg in [compose_tiny(f"{group}={option}") for group, option in OPTIONS if group != "experiment"]:
        ranged = {key for key, _, _ in ranged_keys(cfg)}
        numbers = dict(numeric_leaves(OmegaConf.to_container(cfg, resolve=False)))  # not interpolations of them
        assert set(numbers) <= ranged, f"numbers with no _ranges_ entry: {sorted(set(numbers) - ranged)}"
        check_ranges(cfg)  # the values as composed are valid
        for key, value, spec in ranged_keys(cfg):
            if key in tried or value is None:
                continue
            tried.add(key)
            bad = cfg.copy()
            wrong = outside(value, spec)
            OmegaConf.update(bad, key, wrong)
            with pytest.raises(ConfigError, match=rf"^{re.escape(key)}={re.escape(str(wrong))} is out of range: it "
                                                  r"must be "):
                check_ranges(bad)
    assert {"train.batch_size", "train.epochs", "data.crop_size", "loader.prefetch_factor", "optim.lr",
            "prefetcher.depth", "schedule.warmup_epochs"} <= tried


def test_ranges_read_as_words():
    assert describe_range("1..") == "at least 1"
    assert describe_range("-1 | 1..") == "-1, or at least 1"
    assert describe_range("0..1") == "from 0 to 1"
    assert in_range(-1, "-1 | 1..") and not in_range(0, "-1 | 1..") and in_range(7, "-1 | 1..")


def test_a_validation_resize_below_the_crop_is_refused(compose_tiny):
    cfg = compose_tiny("data.crop_size=64", "data.val_resize=48")
    with pytest.raises(ConfigError, match="data.val_resize=48 is smaller than data.crop_size=64"):
        check_ranges(cfg)


@pytest.mark.parametrize("option", options.options("data"))
def test_the_validation_resize_follows_the_crop_unless_set(option):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # not debug=tiny, which sets both
        assert compose("train", [f"data={option}"]).data.val_resize == 256
        assert compose("train", [f"data={option}", "data.crop_size=64"]).data.val_resize == 73  # 64 / 0.875
        assert compose("train", [f"data={option}", "data.crop_size=64", "data.val_resize=100"]).data.val_resize == 100


def test_a_validation_resize_that_is_not_a_number_is_refused(tmp_path):
    with hydra_run("train", ["data.val_resize=big"], tmp_path) as cfg, pytest.raises(ConfigError) as refused:
        check(cfg)
    assert str(refused.value) == "data.val_resize='big' is not a whole number, as its default 256 is"


def test_data_imagenet_is_data_folder_under_its_old_name(compose_tiny):
    assert compose_tiny("data=imagenet").data == compose_tiny("data=folder").data


def reading(group: str, key: str) -> list[str]:
    """The options of `group` whose file declares `key`."""
    return [option for option in options.options(group)
            if key in OmegaConf.load(CONF / group / f"{option}.yaml").keys()]  # `in` alone skips a ??? value


PACKS = reading("format", "path")


@pytest.mark.parametrize(("added", "line"), [
    ("+train.bach_size=32", "+train.bach_size: no such key; did you mean train.batch_size?"),
    ("+data.root=/photos", "+data.root: data=synthetic has no such key; data=folder reads it: pass data=folder "
                           "data.root=/photos"),
    ("+format.path=/packed", f"+format.path: format=folder has no such key; format={', '.join(PACKS[:-1])} or "
                             f"{PACKS[-1]} reads it: pass one, such as format={PACKS[0]} format.path=/packed"),
    ("+nothing.like.it=1", f"+nothing.like.it: no such key; python -m {options.PACKAGE}.train --cfg job lists the "
                           "keys"),
])
def test_a_key_no_option_reads_is_refused_in_one_line_naming_the_one_meant(added, line, cache_dir, tiny_root,
                                                                            tmp_path):
    with hydra_run("train", tiny((added,), cache_dir, tiny_root), tmp_path) as cfg, \
            pytest.raises(ConfigError) as refused:
        check(cfg)
    assert str(refused.value) == line


def paths_left_to_the_user(group: str, option: str, folder: Path) -> list[str]:
    """The overrides a user adds to `group=option`: a recipe that reads a pack leaves its folder to the user, as it
    leaves data.root."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", [f"{group}={option}"])
    return [f"format.path={folder}"] if OmegaConf.is_missing(cfg.format, "path") else []


@pytest.mark.parametrize("option", options.options("experiment"))
def test_every_recipe_passes_the_checks_given_the_paths_it_leaves_to_the_user(option, tmp_path):
    with hydra_run("train", [f"experiment={option}", *paths_left_to_the_user("experiment", option, tmp_path)],
                   tmp_path) as cfg:
        check(cfg)


def test_a_packed_format_without_its_path_is_refused_saying_what_to_give(cache_dir, tiny_root, tmp_path):
    with hydra_run("train", tiny(("format=lmdb", "format.path=???"), cache_dir, tiny_root), tmp_path) as cfg, \
            pytest.raises(ConfigError) as refused:
        check(cfg)
    assert str(refused.value) == "format.path has no value: pass format.path=..., the folder pack wrote (its pack.out)"


def test_every_missing_value_is_named_in_the_one_line(tmp_path):
    with hydra_run("predict", [], tmp_path) as cfg, pytest.raises(ConfigError) as refused:
        check(cfg)
    assert [part.split(" has no value")[0] for part in str(refused.value).split("; ")] == ["checkpoint", "images"]


ONE_OPTION_FACTS = [("format", "holds_pixels"), ("decoder", "takes_pixels"), ("order", "in_runs"), ("logger", "followed")]


def test_a_fact_that_one_option_holds_names_it_and_one_that_several_hold_is_refused():
    for group, fact in ONE_OPTION_FACTS:  # what the verdict, tune and the trials pick by a fact
        assert options.having(group, fact) == [options.only(group, fact)]
    with pytest.raises(ConfigError, match=r"^the decoder options .*, .* declare the fact decode_us, which exactly "
                                          r"one decoder option must"):
        options.only("decoder", "decode_us")
