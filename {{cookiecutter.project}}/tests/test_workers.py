"""loader.num_workers=auto: a measured sweep picks the fastest count, caches it per machine and data set."""
import json
import logging

import pytest
import torch

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import ALONE
from {{ cookiecutter.package }}.data import workers
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.format import folder
from {{ cookiecutter.package }}.data.images import make_splits
from {{ cookiecutter.package }}.data.loaders import make_loader, make_loaders
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.staging import no_staging

from helpers.machines import on_this_machine

SETTINGS = {"prefetch_factor": 2, "pin_memory": False, "persistent_workers": False}


def loader_with(train_set):
    return lambda count: make_loader(train_set, 2, True, 0, ALONE, num_workers=count, collate=PilDecoder().collate,
                                     **SETTINGS)


@pytest.fixture
def train_set(tiny_root):
    source = sources.folder(str(tiny_root), 32, 36, "raise")
    return make_splits(source, folder.Folder().stores(source, no_staging), PilDecoder()).train


def test_candidates_go_up_to_the_cores_and_from_none_for_a_decoder_beside_the_training_process():
    assert workers.candidates(1, decodes_beside=False) == [1]
    assert workers.candidates(6, decodes_beside=False) == [1, 2, 4, 6]
    assert workers.candidates(2, decodes_beside=True) == [0, 1, 2]


def test_auto_measures_picks_the_fastest_and_caches_it(train_set, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(workers, "CACHE", tmp_path / "num_workers.json")
    monkeypatch.setattr(workers, "cores_per_process", lambda: 4)
    timed, warmups = [], []

    def fake_rate(loader, batch_size, device, warmup):
        timed.append(loader.num_workers)
        warmups.append(warmup)
        return {1: 100.0, 2: 300.0, 4: 290.0}[loader.num_workers]

    monkeypatch.setattr(workers, "images_per_s", fake_rate)
    caplog.set_level("INFO")
    assert workers.pick_num_workers("auto", train_set, 2, "pil|crop 32", loader_with(train_set)) == 2  # 4 within 5%: fewer wins
    assert timed == [1, 2, 4] and "1: 100, 2: 300, 4: 290" in caplog.text
    # Each worker's first three batches, which allocate its batch buffers, are not timed, as far as the set allows
    spare = len(train_set) // 2 - workers.TIMED_BATCHES
    assert 3 < spare < 6 and warmups == [3, spare, spare]
    assert list(json.loads((tmp_path / "num_workers.json").read_text()).values()) == [2]
    assert workers.pick_num_workers("auto", train_set, 2, "pil|crop 32", loader_with(train_set)) == 2
    assert timed == [1, 2, 4]  # the second run read the cache


def test_auto_lets_a_decoder_beside_the_training_process_read_the_files_itself(train_set, tmp_path, monkeypatch):
    """DALI's executor decodes beside the training process: there the sweep also times no workers at all."""
    monkeypatch.setattr(workers, "CACHE", tmp_path / "num_workers.json")
    monkeypatch.setattr(workers, "cores_per_process", lambda: 2)
    monkeypatch.setattr(workers, "images_per_s", lambda loader, batch_size, device, warmup:
                        {0: 310.0, 1: 200.0, 2: 300.0}[loader.num_workers])
    assert workers.pick_num_workers("auto", train_set, 2, "dali|crop 32", loader_with(train_set),
                                    decodes_beside=True) == 0
    assert workers.pick_num_workers("auto", train_set, 2, "pil|crop 32", loader_with(train_set)) == 2


@pytest.mark.parametrize("name", [name for name in options.options("decoder") if name != "none"])
def test_auto_times_batches_as_the_training_step_receives_them(name, compose_tiny, tmp_path, monkeypatch):
    """What the training step waits for: a batch decoder's batches decoded, not its workers' bytes; and no workers
    at all is tried only for a decoder that decodes beside the training process."""
    if missing := options.facts("decoder", name).missing():
        pytest.skip(f"decoder={name}: {missing}")
    monkeypatch.setattr(workers, "CACHE", tmp_path / "num_workers.json")
    monkeypatch.setattr(workers, "cores_per_process", lambda: 2)
    swept = []

    def first_batch(batches, batch_size, device, warmup):
        images, _ = next(iter(batches))
        swept.append((images.dtype, images.dim(), images.shape[1]))
        return 100.0

    monkeypatch.setattr(workers, "images_per_s", first_batch)
    cfg = compose_tiny(f"decoder={name}", *on_this_machine(f"decoder={name}"), "loader.num_workers=auto",
                       "train.batch_size=2")  # the sweep times 10 batches
    built = make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                         batch_size=cfg.train.batch_size, seed=cfg.seed, world=ALONE,
                         memory_format=torch.contiguous_format)
    beside = build(cfg.decoder).queued_batches > 0
    assert swept == [(torch.uint8, 4, 3)] * len(workers.candidates(2, beside))
    assert built.num_workers == (0 if beside else 1)  # all equally fast: the fewest processes


def test_auto_really_times_a_loader(train_set):
    assert workers.images_per_s(loader_with(train_set)(0), 2, ALONE.device) > 0


def test_bad_counts_are_refused(train_set):
    with pytest.raises(ConfigError, match="loader.num_workers=-1"):
        workers.pick_num_workers(-1, train_set, 2, "pil|crop 32", loader_with(train_set))


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_a_set_too_small_to_time_gets_a_worker_per_core_up_to_its_batches_untimed(train_set, tmp_path, monkeypatch,
                                                                                   caplog, cores):
    """A training set of fewer batches than the sweep times (a first run on a few hundred photos) trains; nothing
    is timed, so nothing is cached as measured."""
    monkeypatch.setattr(workers, "CACHE", tmp_path / "none.json")
    monkeypatch.setattr(workers, "cores_per_process", lambda: cores)
    monkeypatch.setattr(workers, "images_per_s", lambda *args: pytest.fail("a set this small is not timed"))
    batches = len(train_set) // 8
    assert batches < workers.WARMUP_BATCHES + workers.TIMED_BATCHES
    with caplog.at_level(logging.INFO, logger=workers.__name__):
        chosen = workers.pick_num_workers("auto", train_set, 8, "pil|crop 32", loader_with(train_set))
    assert chosen == min(cores, batches) and not (tmp_path / "none.json").exists()
    assert f"the training set has {batches} batches, fewer than the 10 a sweep times; using {chosen}" in caplog.text
