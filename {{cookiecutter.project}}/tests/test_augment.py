"""augment=trivial_augment|rand_augment: a policy on each training crop in the loader's workers, the same for the
same (seed, epoch, image) whoever reads it, timed as decoding, and never on validation."""
import time

import numpy as np
import pytest
import torch

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.data import augment
from {{ cookiecutter.package }}.data.loaders import make_loaders

ALONE = World(0, 0, 1, torch.device("cpu"))


def splits(compose_tiny, *overrides):
    cfg = compose_tiny(*overrides, "loader.num_workers=0")
    return make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                        batch_size=cfg.train.batch_size, seed=cfg.seed, world=ALONE,
                        memory_format=torch.contiguous_format, augment=cfg.augment).splits


def crop(split, key) -> np.ndarray:
    decoded, _ = split[key]
    return decoded.resized()


@pytest.mark.parametrize("policy", ["trivial_augment", "rand_augment"])
def test_a_policy_changes_training_crops_alike_for_the_same_epoch_and_image_and_leaves_validation(compose_tiny,
                                                                                                  policy):
    plain, augmented = splits(compose_tiny), splits(compose_tiny, f"augment={policy}")
    keys = [(index, 0) for index in range(len(plain.train))]
    changed = [not np.array_equal(crop(plain.train, key), crop(augmented.train, key)) for key in keys]
    assert sum(changed) >= len(keys) // 2, changed  # an operation may happen to leave a crop as it was
    assert all(np.array_equal(crop(augmented.train, key), crop(augmented.train, key)) for key in keys)
    assert any(not np.array_equal(crop(augmented.train, (index, 0)), crop(augmented.train, (index, 1)))
               for index in range(len(plain.train)))  # each epoch draws again
    assert all(np.array_equal(crop(plain.val, index), crop(augmented.val, index)) for index in range(len(plain.val)))


def test_the_policys_time_counts_as_decoding(compose_tiny, monkeypatch):
    monkeypatch.setattr(augment.Policy, "__call__", lambda self, pixels, seed: time.sleep(0.02))
    train = splits(compose_tiny, "augment=trivial_augment").train
    train.times.sample()
    for index in range(4):
        train[(index, 0)]
    assert train.times.sample()["loader/decode_ms"] >= 20


def test_a_decoder_that_decodes_after_the_workers_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^augment=trivial_augment changes each crop in the loader's workers, and "
                                          r"this decoder \(object\) decodes batches on the device"):
        augment.trivial_augment(lambda payload: payload, object(), num_magnitude_bins=31)


def test_a_run_augments_every_training_image_and_no_validation_one(train_in_process, monkeypatch):
    calls = []
    policy = augment.Policy.__call__
    monkeypatch.setattr(augment.Policy, "__call__", lambda self, pixels, seed: (calls.append(seed),
                                                                                policy(self, pixels, seed)))
    train_in_process("augment=rand_augment", "train.epochs=2")
    assert len(calls) == 2 * 24 and len(set(calls)) == 48  # 24 training images an epoch, each its own draw
