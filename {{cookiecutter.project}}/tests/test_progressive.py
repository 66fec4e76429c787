"""Progressive resizing (data.start_crop_size, data.crop_ramp_epochs): the training crop grows epoch by epoch to
data.crop_size (or data.train_crop_size), the workers cut each epoch's size, and validation stays at
data.crop_size. And data.crop_scale: the share of an image's area the training crops cover."""
import random
import re

import pytest

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.data import sources
from {{ cookiecutter.package }}.data.crops import CropSchedule, TrainCrop


def test_the_schedule_holds_the_start_ramps_in_steps_of_8_and_ends_at_the_crop_size():
    schedule = CropSchedule(224, start=160, ramp=(2, 6))
    assert [schedule.size(epoch) for epoch in range(9)] == [160, 160, 160, 176, 192, 208, 224, 224, 224]
    assert [CropSchedule(224).size(epoch) for epoch in range(3)] == [224] * 3  # off: the crop size throughout
    assert [CropSchedule(28, start=16, ramp=(0, 2)).size(epoch) for epoch in range(3)] == [16, 24, 28]


def test_a_crop_takes_its_epochs_size():
    crop = TrainCrop(64, schedule=CropSchedule(64, start=32, ramp=(0, 1)))
    crop.set_epoch(0)
    assert crop.size == 32
    crop.set_epoch(1)
    assert crop.size == 64


@pytest.mark.parametrize("start, ramp, key", [(300, (0, 1), "data.start_crop_size=300"),
                                              (4, (0, 1), "data.start_crop_size=4"),
                                              (64, (3, 1), r"data.crop_ramp_epochs=\[3, 1\]"),
                                              (64, (0, 0), r"data.start_crop_size=64 with data.crop_ramp_epochs=\[0, 0\] "
                                                           r"trains every epoch at data.crop_size=224: pass the epochs")])
def test_a_start_beyond_the_crop_or_a_ramp_backwards_is_refused_in_one_line(start, ramp, key):
    with pytest.raises(ConfigError, match=rf"^{key} "):
        CropSchedule(224, start=start, ramp=ramp)


def test_a_start_beyond_the_training_side_names_the_key_that_set_it():
    with pytest.raises(ConfigError, match=r"^data.start_crop_size=24 must be from 8 to data.train_crop_size=16: "):
        sources.crops(32, 16, 24, (0, 2))
    assert sources.crops(32, None, None, (0, 0))["train_crop_size"] == 32


@pytest.mark.parametrize("value", ["abc", 1.5, True])
def test_a_training_side_that_is_not_a_whole_number_is_refused_in_one_line(value):
    with pytest.raises(ConfigError, match=rf"^data.train_crop_size={value!r} is not a whole number of pixels, nor null$"):
        sources.crops(32, value, None, (0, 0))


def area_shares(crop: TrainCrop, draws: int) -> list[float]:
    random.seed(0)
    boxes = [crop(100, 100)[0] for _ in range(draws)]
    return [(right - left) * (bottom - top) / 100 ** 2 for left, top, right, bottom in boxes]


def test_the_crop_scale_bounds_the_share_of_the_image_each_crop_covers():
    raised = area_shares(TrainCrop(28, sources.crops(28, None, None, (0, 0), [0.5, 1.0])["crop_scale"]), 2000)
    default = area_shares(TrainCrop(28), 2000)
    assert 0.49 <= min(raised) < 0.55 and max(raised) <= 1  # a box's sides are whole pixels: within rounding
    assert min(default) < 0.1 and sum(share < 0.5 for share in default) > 500


@pytest.mark.parametrize("value", [[0.5], [0, 1], [0.6, 0.5], [0.5, 1.5], "abc", True])
def test_a_crop_scale_that_is_not_an_ordered_pair_of_shares_is_refused_in_one_line(value):
    shown = re.escape(str(value))
    with pytest.raises(ConfigError, match=rf"^data.crop_scale={shown} is not \[least, most\] shares of an image's "
                                          r"area \(0 < least <= most <= 1\) that a training crop covers, such as "
                                          r"\[0.08,1.0\]$"):
        sources.crops(28, None, None, (0, 0), value)
