"""The crops cut from each image: a random-resized crop and flip for training, the centre for validation."""
import math
import random

from ..contracts import Box, Crop


class TrainCrop(Crop):
    """Random-resized-crop box (torchvision's sampling rule) and a coin flip for the horizontal mirror.

    Drawn with Python's `random`, which start_worker seeds per worker and epoch: a tenth of the cost of
    torchvision's get_params, which matters once nothing is left to decode (format=tensor).
    """

    def __init__(self, size: int, scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3)):
        self.size, self.scale = size, scale
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.ratio = ratio

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
