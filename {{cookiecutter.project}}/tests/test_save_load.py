"""One save/load test for every training loader the options' facts allow (torchdata's run_test_save_load_state): stop
an epoch part-way, keep the run's checkpoint parts, build the run again from its config, restore them, and the rest of
the epoch's batches are those an uninterrupted run trains, pixel for pixel, with every data part's state kept.

The combinations are drawn from the facts: every format in every order it can be read in, under every prefetcher
that trains (not the compute ceiling), with and without loader workers, decoded by the fastest CPU decoder installed
(a format of pixels: by the decoder that takes them). Decoders and augmentation policies decode and draw per image
from the image's own seed, so each of them is crossed with one loader only; staging changes where the files are
read, not in which order, except a staging that makes the batches on the device, crossed with every format of
pixels in every order under every prefetcher.
"""
import gc

import pytest
import torch

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.core.failures import end_workers
from {{ cookiecutter.package }}.core.forensics import Forensics
from {{ cookiecutter.package }}.loop.checkpoint import load
from {{ cookiecutter.package }}.train import make_run

from helpers.machines import CUDA, on_this_machine
from helpers.runs import hydra_run, tiny

EPOCH = 1  # not the first: an epoch's order depends on its number
STOPPED_AFTER = 2  # batches, of the 6 of an epoch of the tiny set's 24 images in batches of 4
DATA_PARTS = ("loader", "unreadable", "coverage", "progress")
ONE_LOADER = ("format=folder", "order=random", "prefetcher=none", "loader.num_workers=0")  # crossed with each decoder


def runnable(group: str, option: str) -> bool:
    """Whether this machine can train with the option: a GPU option only on a GPU, unless its facts say how to run it
    without one."""
    facts = options.facts(group, option)
    return not facts.ceiling and (CUDA or not facts.gpu or bool(facts.without_gpu))


def loader_choices() -> list[tuple[str, ...]]:
    """Each combination of format, order, prefetcher and worker count the facts allow, then each decoder and each
    augmentation policy once."""
    fastest = options.fastest_cpu_decoder()
    pixels = options.only("decoder", "takes_pixels")
    combinations = []
    for format in options.options("format"):
        stored = options.facts("format", format)
        decoder = pixels if stored.holds_pixels else fastest
        for order in options.options("order"):
            if options.facts("order", order).in_runs and not stored.reads_runs:
                continue
            for prefetcher in options.options("prefetcher"):
                if not options.facts("prefetcher", prefetcher).ceiling:
                    combinations += [(f"format={format}", f"decoder={decoder}", f"order={order}",
                                      f"prefetcher={prefetcher}", f"loader.num_workers={workers}") for workers in (0, 2)]
    for staging in (name for name in options.options("staging") if options.facts("staging", name).on_device):
        for format in options.having("format", "holds_pixels"):
            combinations += [(f"format={format}", f"decoder={pixels}", f"order={order}", f"prefetcher={prefetcher}",
                              "loader.num_workers=0", f"staging={staging}", "staging.reserve_gb=0")
                             for order in options.options("order")
                             if options.facts("format", format).reads_runs or not options.facts("order", order).in_runs
                             for prefetcher in options.options("prefetcher")
                             if not options.facts("prefetcher", prefetcher).ceiling]
    combinations += [(*ONE_LOADER, f"decoder={decoder}") for decoder in options.options("decoder")
                     if decoder not in (fastest, pixels) and runnable("decoder", decoder)]
    combinations += [(*ONE_LOADER, f"decoder={fastest}", f"augment={augment}") for augment in options.options("augment")
                     if augment != options.default("augment")]
    return combinations


def cannot_run(choices: tuple[str, ...]) -> str | None:
    """Why this machine cannot build the combination (a missing extra, a GPU it lacks), or None."""
    for choice in choices:
        group, _, option = choice.partition("=")
        if group not in options.options_groups():
            continue
        if missing := options.facts(group, option).missing():
            return f"{choice}: {missing}"
        if not runnable(group, option):
            return f"{choice} needs a GPU, and torch.cuda.is_available() is False here"
    return None


CHOICES = loader_choices()


def built(cfg, run_dir):
    return make_run(cfg, run_dir, World(0, 0, 1, torch.device("cuda" if CUDA else "cpu")),
                    Forensics(run_dir, cfg.distributed.stall_min, cfg.distributed.stall_exit))


def batches(run, skip_images: int = 0, stop_after: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The epoch's batches from `skip_images` on, as the step receives them, copied off the loader's buffers."""
    run.loaders.train.set_epoch(EPOCH, skip_images=skip_images)
    taken = []
    for images, labels in run.loaders.train:
        taken.append((images.cpu().clone(), labels.cpu().clone()))
        if len(taken) == stop_after:
            break  # a prefetcher's thread, and the workers, have read ahead
    return taken


def tier(choices: tuple[str, ...]) -> list:
    """The fast tier reads every format in the default order, in the training process, without a prefetcher; the
    other orders, loader workers and prefetchers, which read ahead of the step, are the full tier's, and so are the
    decoders and policies crossed with one loader, whose draws per image test_decoder.py and test_augment.py check
    in the fast tier, and the stagings on the device, whose resumes test_resident.py checks there."""
    fast = {"loader.num_workers=0", f"prefetcher={options.default('prefetcher')}", f"order={options.default('order')}"}
    own_staging = any(choice.startswith("staging=") for choice in choices)
    return [] if fast <= set(choices) and choices[:len(ONE_LOADER)] != ONE_LOADER and not own_staging \
        else [pytest.mark.full]


@pytest.mark.parametrize("choices", [pytest.param(choices, id=" ".join(choices), marks=tier(choices))
                                     for choices in CHOICES])
def test_a_stopped_epoch_restored_from_its_checkpoint_parts_trains_the_batches_left(choices, cache_dir, tiny_root,
                                                                                   packs, tmp_path):
    if why := cannot_run(choices):
        pytest.skip(why)
    groups = options.options_groups()
    on_this = [change for choice in choices if choice.split("=")[0] in groups for change in on_this_machine(choice)]
    with hydra_run("train", tiny(("logger=none", *choices, *on_this), cache_dir, tiny_root), tmp_path) as cfg:
        whole = batches_of(cfg, tmp_path / "whole")
        assert len(whole) == 6
        state = {}
        before = batches_of(cfg, tmp_path / "stopped", stop_after=STOPPED_AFTER, saved=state)
        rest = batches_of(cfg, tmp_path / "resumed", restored=state)
    assert [labels.tolist() for _, labels in before + rest] == [labels.tolist() for _, labels in whole]
    for (images, _), (expected, _) in zip(before + rest, whole):
        torch.testing.assert_close(images, expected, rtol=0, atol=0)


def batches_of(cfg, run_dir, stop_after: int | None = None, saved: dict | None = None,
               restored: dict | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The epoch's batches of a run built from `cfg`: all of them; the first `stop_after`, its checkpoint then
    read back into `saved`; or, once the run is `restored` from such a checkpoint, those it has left. The run's
    files are closed before it returns: a store of this process may hold its file open (LMDB allows one handle)."""
    run_dir.mkdir()
    run = built(cfg, run_dir)
    try:
        if restored is not None:
            run.checkpoints.restore(run.parts(), restored)
            parts = run.parts()
            assert {key: parts[key].state_dict() for key in DATA_PARTS} == {key: restored[key] for key in DATA_PARTS}
        taken = batches(run, run.progress.images_in_epoch, stop_after)
        if saved is not None:
            run.progress.epoch, run.progress.step = EPOCH, len(taken)
            run.progress.images_in_epoch = sum(len(labels) for _, labels in taken)
            run.checkpoints.save(run.parts())
            saved.update(load(run.checkpoints.path, torch.device("cpu")))  # through the file, as a resume reads it
        return taken
    finally:
        run.clock.close()
        end_workers()
        del run
        gc.collect()
