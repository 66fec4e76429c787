"""The crops cut from each image: a random-resized crop and flip for training, the centre for validation."""
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..contracts import Box, Crop
from ..core.errors import ConfigError

SIZE_STEP = 8  # the sizes between a progressive schedule's ends are multiples of this
DEFAULT_SCALE = (0.08, 1.0)  # the share of an image's area a training crop covers: torchvision's and timm's default


@dataclass(frozen=True)
class CropSchedule:
    """Progressive resizing (`data.start_crop_size`, `data.crop_ramp_epochs`): the training crop's side in each
    epoch, `start` until the ramp's first epoch, growing linearly to `final` (data.crop_size) at its last, in steps of
    SIZE_STEP pixels, and `final` after; FFCV's ResNet recipes train this way, low resolution first. Validation stays
    at data.crop_size. Without a start size, every epoch trains at `final`."""
    final: int
    start: int | None = None
    ramp: tuple[int, int] = (0, 0)
    final_key: str = "data.crop_size"  # the key that set `final`, as the refusals name it

    def __post_init__(self):
        if self.start is not None and not 8 <= self.start <= self.final:
            raise ConfigError(f"data.start_crop_size={self.start} must be from 8 to {self.final_key}={self.final}: "
                              f"progressive resizing grows the crop to {self.final_key}; null trains at it throughout")
        ramp = self.ramp
        if not (isinstance(ramp, Sequence) and len(ramp) == 2 and all(isinstance(epoch, int) for epoch in ramp)
                and 0 <= ramp[0] <= ramp[1]):
            shown = list(ramp) if isinstance(ramp, Sequence) and not isinstance(ramp, str) else ramp
            raise ConfigError(f"data.crop_ramp_epochs={shown} is not [first, last] epochs (from 0, first <= last) "
                              f"over which the crop grows from data.start_crop_size to {self.final_key}, such as [0,6]")
        if self.start is not None and self.start < self.final and ramp[1] == 0:  # the ramp ends before epoch 0
            raise ConfigError(f"data.start_crop_size={self.start} with data.crop_ramp_epochs={list(ramp)} trains every "
                              f"epoch at {self.final_key}={self.final}: pass the epochs over which the crop grows, such "
                              "as data.crop_ramp_epochs=[0,6]")
        object.__setattr__(self, "ramp", tuple(ramp))  # a command line's list, kept as the pair it is

    def sizes(self, epochs: int) -> set[int]:
        """The crop sides a run of `epochs` epochs trains at."""
        return {self.size(epoch) for epoch in range(epochs)}

    def size(self, epoch: int) -> int:
        if self.start is None or epoch >= self.ramp[1]:
            return self.final
        if epoch <= self.ramp[0]:
            return self.start
        grown = self.start + (self.final - self.start) * (epoch - self.ramp[0]) / (self.ramp[1] - self.ramp[0])
        return min(self.final, max(self.start, round(grown / SIZE_STEP) * SIZE_STEP))


class TrainCrop(Crop):
    """Random-resized-crop box (torchvision's sampling rule) and a coin flip for the horizontal mirror, at the side
    the schedule gives the epoch (`set_epoch`, which each worker calls at its first image of an epoch).

    Drawn with Python's `random`, which start_worker seeds per worker and epoch: a tenth of the cost of
    torchvision's get_params, which matters once nothing is left to decode (format=tensor).
    """

    def __init__(self, size: int, scale: tuple[float, float] = DEFAULT_SCALE, ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 schedule: CropSchedule | None = None):
        self.size, self.scale = size, scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.ratio = ratio
        self.schedule = schedule or CropSchedule(size)

    def set_epoch(self, epoch: int) -> None:
        self.size = self.schedule.size(epoch)

    def full_detail_side(self) -> int:
        """The shorter side from which even the smallest crop spans `size` pixels each way: images resized to
        it first lose nothing the crops keep (a pack at that size trains on the same pixels, within resampling)."""
        return math.ceil(self.size / math.sqrt(self.scale[0] * min(self.ratio[0], 1 / self.ratio[1])))

    def __call__(self, width: int, height: int) -> tuple[Box, bool]:
        area = width * height
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(*self.log_ratio))
            box_width, box_height = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < box_width <= width and 0 < box_height <= height:
                left, top = random.randint(0, width - box_width), random.randint(0, height - box_height)
                return (left, top, left + box_width, top + box_height), random.random() < 0.5
        # Fallback: the central crop at the nearest allowed aspect ratio.
        aspect = width / height
        if aspect < self.ratio[0]:
            box_width, box_height = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            box_width, box_height = round(height * self.ratio[1]), height
        else:
            box_width, box_height = width, height
        left, top = (width - box_width) // 2, (height - box_height) // 2
        return (left, top, left + box_width, top + box_height), random.random() < 0.5


class CenterCrop(Crop):
    """The central square that resizing the shorter side to `resize` and cropping `size` would keep."""

    def __init__(self, size: int, resize: int):
        self.size, self.resize = size, resize

    def __call__(self, width: int, height: int) -> tuple[Box, bool]:
        side = self.size * min(width, height) / self.resize  # the crop's side in original pixels
        left, top = (width - side) / 2, (height - side) / 2
        return (left, top, left + side, top + side), False
