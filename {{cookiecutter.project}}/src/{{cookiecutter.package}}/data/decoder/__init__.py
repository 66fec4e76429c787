"""JPEG decoders: `decoder=<option>`, one module in this package and one file in conf/decoder/ each.

Every decoder turns encoded bytes into the same thing, an RGB uint8 crop, and they agree within JPEG
tolerance: the crop geometry and the final resize are shared, only the decode differs. None of them
applies EXIF orientation, like the PIL path ImageNet models have always been trained with.

Two kinds keep the `Decoder` contract (contracts/):
- a CPU decoder subclasses `CpuDecoder` and implements `decode(data, shrink)`; it may say which files it
  `reads` (Pillow decodes the others), read the size from the header faster than Pillow does, and decode only
  the crop's region (`decode_box`). The loader's workers decode, at 1/2, 1/4 or 1/8 scale where the decoder
  can and the crop allows, and each batch's collate crops and resizes every image into the batch's one buffer;
- a batch decoder subclasses `batch.BatchDecoder` and implements `start`: the workers only read
  bytes and pick crops; the device decodes, crops and flips whole batches when they are uploaded.
The crop, and with it the output size, comes from the data set's `TrainCrop` or `CenterCrop`; what a file's header
says, from jpeg.py.
"""
import io
import math
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import cv2
import numpy as np
import torch
from PIL import Image

from ...contracts import Box, Crop, Decoder
from ..batch_memory import batch_buffer
from .jpeg import header_size

# What the decoding libraries raise for a file they cannot read: Pillow (OSError, SyntaxError, its
# DecompressionBombError), OpenCV (cv2.error), TurboJPEG through decoder.turbojpeg (ValueError), TorchCodec
# (RuntimeError).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, cv2.error, Image.DecompressionBombError)

# One OpenCV thread per process: the loader's workers are the parallelism, and every CPU decoder ends
# with cv2.resize. Set on import, so that workers started by spawn or forkserver get it too.
cv2.setNumThreads(0)


class Unreadable(Exception):
    """A file that does not decode as an image: skipped and counted under data.on_error=skip."""


@contextmanager
def decoding() -> Iterator[None]:
    """Around a decoding library's call, and only there: its errors mean an unreadable file, where the same
    exception types from our own code (the crop, the resize) are bugs and must raise as they are."""
    try:
        yield
    except DECODE_ERRORS as err:
        raise Unreadable(f"{err.__class__.__name__}: {err}") from err


def check_size(width: int, height: int) -> None:
    """Refuse, before anything is allocated, an image larger than Pillow opens: twice Image.MAX_IMAGE_PIXELS, its
    DecompressionBombError (a few hundred bytes can claim 60000 x 60000 pixels, 10.8 GB as RGB). Read at each call, so
    that a limit set for Pillow holds for every decoder."""
    if Image.MAX_IMAGE_PIXELS and width * height > 2 * Image.MAX_IMAGE_PIXELS:
        raise Unreadable(f"DecompressionBombError: its header claims {width} x {height} pixels, more than twice "
                         f"PIL.Image.MAX_IMAGE_PIXELS ({Image.MAX_IMAGE_PIXELS}), which Pillow refuses")


def pixel_box(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """The box in whole pixels, inside the image and at least one pixel wide."""
    left, top = min(int(box[0]), width - 1), min(int(box[1]), height - 1)
    return left, top, max(left + 1, min(round(box[2]), width)), max(top + 1, min(round(box[3]), height))


# Pixels a worker keeps per image until its batch's collate resizes them, in outputs' worth. A region decoded at the
# DCT scale that covers the output is under twice the output's side on the crop's shorter side and at most 4/3 of
# that on its longer one (TrainCrop's ratios): under 5.3 outputs, and a little more aligned to the MCU grid.
KEPT_OUTPUTS = 6


@dataclass
class Decoded:
    """A CPU decoder's worker output: the decoded pixels (HWC, RGB; at a reduced scale or only a region where the
    decoder could), the crop's box on them, whether to mirror it and the output side. The collate resizes each
    straight into the batch's one buffer: no image-sized array per image, and no copy of the batch."""
    pixels: np.ndarray
    box: Box
    flip: bool
    size: int

    def resize_into(self, out: np.ndarray) -> None:
        """The box resized to size x size HWC in `out`, mirrored if it should be."""
        left, top, right, bottom = pixel_box(self.box, self.pixels.shape[1], self.pixels.shape[0])
        region = self.pixels[top:bottom, left:right]
        # Bilinear is 7x faster than area averaging and alias-free enough below 2x; the DCT-scaled decode
        # already took care of any larger factor for JPEGs, so area averaging is left for the rest.
        far = min(region.shape[:2]) >= 2 * self.size
        resized = cv2.resize(region, (self.size, self.size), dst=out,
                             interpolation=cv2.INTER_AREA if far else cv2.INTER_LINEAR)
        if resized.ctypes.data != out.ctypes.data:  # OpenCV writes elsewhere what does not fit `out`
            raise ValueError(f"a decoder gave {self.pixels.dtype} pixels of shape {self.pixels.shape}: HWC RGB uint8 "
                             "expected")
        if self.flip:
            cv2.flip(out, 1, dst=out)  # in place: it swaps each row's pixels pairwise

    def resized(self) -> np.ndarray:
        """The crop in an array of its own, HWC."""
        out = np.empty((self.size, self.size, 3), np.uint8)
        self.resize_into(out)
        return out

    def whole(self) -> "Decoded":
        """The crop resized into pixels of its own: a Decoded whose box is all of them, mirrored already."""
        return Decoded(self.resized(), (0, 0, self.size, self.size), False, self.size)


def dct_scale(shrink: float) -> int:
    """The largest libjpeg DCT scale denominator (1, 2, 4, 8) that does not shrink below `shrink`."""
    return max((d for d in (1, 2, 4, 8) if d <= shrink), default=1)


def scaled(image: np.ndarray, size: tuple[int, int], box: Box) -> tuple[np.ndarray, Box]:
    """A whole image decoded at a reduced scale, and `box`, given on the image of `size` (width, height), on it."""
    sx, sy = image.shape[1] / size[0], image.shape[0] / size[1]
    return image, (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


def pillow_decode(data: bytes, shrink: float) -> np.ndarray:
    """Pillow's decode, at 1/2, 1/4 or 1/8 scale (`draft`) when `shrink` allows: it reads every file ImageNet holds,
    so it takes whatever another decoder does not read."""
    image = Image.open(io.BytesIO(data))
    if shrink >= 2:
        image.draft("RGB", (math.ceil(image.width / shrink), math.ceil(image.height / shrink)))
    return np.asarray(image.convert("RGB"))


class CpuDecoder(Decoder):
    """A decoder of single files in the workers: subclasses implement `decode`, and may implement `reads` and
    `image_size`."""

    @abstractmethod
    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        """An HWC uint8 RGB image, at most `shrink` times smaller than full size."""

    def reads(self, data: bytes) -> bool:
        """Whether `decode` takes this file; Pillow decodes the others (PNG under a .JPEG name, CMYK, ...)."""
        return True

    def image_size(self, data: bytes) -> tuple[int, int]:
        """(width, height), from the header."""
        return header_size(data)

    def decode_box(self, data: bytes, size: tuple[int, int], box: Box, shrink: float) -> tuple[np.ndarray, Box]:
        """Pixels that hold `box` of the image of `size` (width, height), and `box` on them: here the whole image at
        a reduced scale. A decoder whose library decodes regions (its facts say `region_decode`) decodes only the
        MCUs the box covers."""
        return scaled(self.decode(data, shrink), size, box)

    def decode_any(self, data: bytes, size: tuple[int, int], box: Box, shrink: float) -> tuple[np.ndarray, Box]:
        """`decode_box`, or Pillow's whole decode for a file this decoder does not read."""
        return self.decode_box(data, size, box, shrink) if self.reads(data) else \
            scaled(pillow_decode(data, shrink), size, box)

    def transform(self, crop: Crop) -> Callable:
        return DecodeCrop(self, crop)

    def collate(self, samples: list[tuple[Decoded, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """NHWC uint8 crops, each resized into its place in one buffer, and their labels."""
        size = samples[0][0].size
        images = batch_buffer((len(samples), size, size, 3))
        for slot, (decoded, _) in zip(images.numpy(), samples):
            decoded.resize_into(slot)
        return images, torch.tensor([label for _, label in samples])


class DecodeCrop:
    """What a CPU decoder's worker does to one image: read its size, pick the crop, decode just enough; the collate
    resizes."""

    def __init__(self, decoder: CpuDecoder, crop: Crop):
        self.decoder, self.crop = decoder, crop

    def __call__(self, data) -> Decoded:
        with decoding():
            width, height = self.decoder.image_size(data)
        check_size(width, height)
        box, flip = self.crop(width, height)
        shrink = min(box[2] - box[0], box[3] - box[1]) / self.crop.size
        with decoding():
            image, box = self.decoder.decode_any(data, (width, height), box, shrink)
        decoded = Decoded(image, box, flip, self.crop.size)
        if image.size <= KEPT_OUTPUTS * decoded.size ** 2 * 3:
            return decoded
        # A whole image decoded for a crop of it (a decoder without region decode) is resized now: a batch of them
        # would hold every photo whole until the collate.
        return decoded.whole()
