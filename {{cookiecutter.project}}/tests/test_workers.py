"""loader.num_workers=auto: a measured sweep picks the fastest count, caches it per machine and data set."""
import json

import pytest

from {{ cookiecutter.package }}.core.config import ConfigError
from {{ cookiecutter.package }}.core.distributed import ALONE
from {{ cookiecutter.package }}.data import workers
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.format import folder
from {{ cookiecutter.package }}.data.images import make_splits
from {{ cookiecutter.package }}.data.loaders import make_loader
from {{ cookiecutter.package }}.data.sources import imagenet
from {{ cookiecutter.package }}.data.staging import no_staging

SETTINGS = {"prefetch_factor": 2, "pin_memory": False, "persistent_workers": False}


def loader_with(train_set):
    return lambda count: make_loader(train_set, 2, True, 0, ALONE, num_workers=count, **SETTINGS)


@pytest.fixture
def train_set(tiny_root):
    source = imagenet(str(tiny_root), 32, 36, "raise")
    return make_splits(source, folder.build(source, no_staging), PilDecoder()).train


def test_candidates_go_up_to_the_cores_and_from_none_for_a_decoder_beside_the_training_process():
    assert workers.candidates(1, decodes_beside=False) == [1]
    assert workers.candidates(6, decodes_beside=False) == [1, 2, 4, 6]
    assert workers.candidates(2, decodes_beside=True) == [0, 1, 2]


def test_auto_measures_picks_the_fastest_and_caches_it(train_set, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(workers, "CACHE", tmp_path / "num_workers.json")
    monkeypatch.setattr(workers, "cores_per_process", lambda: 4)
    timed = []

    def fake_rate(loader, batch_size):
        timed.append(loader.num_workers)
        return {1: 100.0, 2: 300.0, 4: 290.0}[loader.num_workers]

    monkeypatch.setattr(workers, "images_per_s", fake_rate)
    caplog.set_level("INFO")
    assert workers.pick_num_workers("auto", train_set, 2, "pil|crop 32", loader_with(train_set)) == 2  # 4 within 5%: fewer wins
    assert timed == [1, 2, 4] and "1: 100, 2: 300, 4: 290" in caplog.text
    assert list(json.loads((tmp_path / "num_workers.json").read_text()).values()) == [2]
    assert workers.pick_num_workers("auto", train_set, 2, "pil|crop 32", loader_with(train_set)) == 2
    assert timed == [1, 2, 4]  # the second run read the cache


def test_auto_lets_a_decoder_beside_the_training_process_read_the_files_itself(train_set, tmp_path, monkeypatch):
    """DALI's executor decodes beside the training process: there the sweep also times no workers at all."""
    monkeypatch.setattr(workers, "CACHE", tmp_path / "num_workers.json")
    monkeypatch.setattr(workers, "cores_per_process", lambda: 2)
    monkeypatch.setattr(workers, "images_per_s", lambda loader, batch_size: {0: 310.0, 1: 200.0, 2: 300.0}[
        loader.num_workers])
    assert workers.pick_num_workers("auto", train_set, 2, "dali|crop 32", loader_with(train_set),
                                    decodes_beside=True) == 0
    assert workers.pick_num_workers("auto", train_set, 2, "pil|crop 32", loader_with(train_set)) == 2


def test_auto_really_times_a_loader(train_set):
    assert workers.images_per_s(loader_with(train_set)(0), 2) > 0


def test_bad_counts_and_too_small_sets_are_refused(train_set, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="loader.num_workers=-1"):
        workers.pick_num_workers(-1, train_set, 2, "pil|crop 32", loader_with(train_set))
    monkeypatch.setattr(workers, "CACHE", tmp_path / "none.json")
    with pytest.raises(ConfigError, match="pass a count"):
        workers.pick_num_workers("auto", train_set, 8, "pil|crop 32", loader_with(train_set))
