"""JPEG decoders: `decoder=<option>`, one module in this package and one file in conf/decoder/ each.

Every decoder turns encoded bytes into the same thing, an RGB uint8 crop, and they agree within JPEG
tolerance: the crop geometry and the final resize are shared, only the decode differs. None of them
applies EXIF orientation, like the PIL path ImageNet models have always been trained with.

Two kinds keep the `Decoder` contract (contracts.py):
- a CPU decoder subclasses `CpuDecoder` and implements `decode(data, shrink)`; it may say which files it
  `reads` (Pillow decodes the others), read the size from the header faster than Pillow does, and decode only
  the crop's region (`decode_box`). The loader's workers decode, at 1/2, 1/4 or 1/8 scale where the decoder
  can and the crop allows, then crop and resize;
- a batch decoder subclasses `batch.BatchDecoder` and implements `start`: the workers only read
  bytes and pick crops; the device decodes, crops and flips whole batches when they are uploaded.
The crop, and with it the output size, comes from the data set's `TrainCrop` or `CenterCrop`.
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


def pil_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header alone."""
    return Image.open(io.BytesIO(data)).size


# Start-of-frame markers: baseline, extended sequential and progressive Huffman coding. nvJPEG decodes these
# (and only in 8-bit precision); arithmetic coding (0xC9-0xCB), lossless (0xC3) and hierarchical frames it does not.
HUFFMAN_FRAMES = {0xC0, 0xC1, 0xC2}


@dataclass(frozen=True)
class Frame:
    """A JPEG's frame header: how its scans are coded (the start-of-frame marker), its sample precision in bits, its
    size and its colour components (1 grey, 3 YCbCr or RGB, 4 CMYK or YCCK); and whether its header holds EXIF."""
    marker: int
    precision: int
    width: int
    height: int
    components: int
    exif: bool

    @property
    def huffman_8bit(self) -> bool:
        """Huffman-coded with 8-bit samples: the kind GPU JPEG decoders take."""
        return self.marker in HUFFMAN_FRAMES and self.precision == 8

    @property
    def cmyk(self) -> bool:
        """Four components, which Pillow reads as Adobe's inverted CMYK and other libjpeg-based decoders the other
        way round."""
        return self.components == 4


def jpeg_frame(data: bytes) -> Frame | None:
    """The frame header of a JPEG, found by walking the header's segments up to the first scan; None for a file that
    is not a JPEG or whose header stops before it. Pillow's Image.open reads the same facts in 80 us a photo, this
    walk in 5."""
    if data[:2] != b"\xff\xd8":
        return None
    frame, exif, position = None, False, 2  # after SOI
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker == 0xFF:  # a fill byte
            position += 1
            continue
        if marker == 0xDA:  # the first scan: the header ends here
            break
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and frame is None:  # not DHT, JPG, DAC
            if position + 10 > len(data):
                return None
            frame = (marker, data[position + 4], int.from_bytes(data[position + 7:position + 9], "big"),
                     int.from_bytes(data[position + 5:position + 7], "big"), data[position + 9])
        exif = exif or marker == 0xE1 and data[position + 4:position + 10] == b"Exif\0\0"  # APP1, EXIF's segment
        position += 2 + int.from_bytes(data[position + 2:position + 4], "big")
    return Frame(*frame, exif) if frame else None


def header_size(data: bytes, frame: Frame | None = None) -> tuple[int, int]:
    """(width, height): a JPEG's from its frame header (`frame`, where it was read already), anything else's (or a
    JPEG whose height comes later, in a DNL segment) from Pillow's reading of its header."""
    frame = frame or jpeg_frame(data)
    return (frame.width, frame.height) if frame and frame.width and frame.height else pil_size(data)


def exif_orientation(data: bytes, frame: Frame | None = None) -> int:
    """The EXIF orientation tag of a JPEG (`frame`: its header, where it was read already): 1 (as stored) when it has
    none."""
    frame = frame or jpeg_frame(data)
    # A header the walk cannot follow (stray bytes between segments, which libjpeg skips): search it for EXIF's block.
    if not (frame.exif if frame else data.find(b"Exif\0\0", 0, 1 << 16) >= 0):
        return 1
    return Image.open(io.BytesIO(data)).getexif().get(0x0112, 1)


# For each EXIF orientation, what takes a CHW image turned as that tag says back to the pixels as stored.
AS_STORED = {2: lambda x: x.flip(2), 3: lambda x: x.rot90(2, (1, 2)), 4: lambda x: x.flip(1),
             5: lambda x: x.transpose(1, 2), 6: lambda x: x.rot90(1, (1, 2)),
             7: lambda x: x.transpose(1, 2).flip(1).flip(2), 8: lambda x: x.rot90(-1, (1, 2))}


def as_stored(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """A CHW image that a decoder turned by its EXIF orientation (TorchCodec always does), as stored: no
    decoder here applies EXIF orientation (see the module's docstring)."""
    return AS_STORED[orientation](image) if orientation in AS_STORED else image


def is_cmyk_jpeg(data: bytes) -> bool:
    """A four-component JPEG (see `Frame.cmyk`)."""
    frame = jpeg_frame(data)
    return frame is not None and frame.cmyk


def reads_as_jpeg(data: bytes) -> bool:
    """A JPEG that libjpeg-turbo's other users read as Pillow does: not PNG under a .JPEG name, not Adobe's CMYK."""
    return data[:2] == b"\xff\xd8" and not is_cmyk_jpeg(data)


STANDALONE_MARKERS = {0x01, *range(0xD0, 0xDA)}  # TEM, RST0-7, SOI, EOI: markers with no length after them


def jpeg_end(data: bytes) -> int | None:
    """Where a JPEG's end-of-image marker ends, found by walking its segments and scans; None for a file that
    stops before one (truncated). Bytes after it (a phone's motion-photo video, a vendor's block) are not the
    image's: Pillow and libjpeg ignore them."""
    position = 2  # after SOI
    while True:
        position = data.find(b"\xff", position)
        while 0 <= position < len(data) - 1 and data[position + 1] == 0xFF:  # fill bytes before a marker
            position += 1
        if position < 0 or position + 1 >= len(data):
            return None
        marker, position = data[position + 1], position + 2
        if marker == 0xD9:
            return position
        if marker in STANDALONE_MARKERS or marker == 0x00:  # 0x00: a stuffed byte in a scan's data
            continue
        if position + 2 > len(data):
            return None
        position += int.from_bytes(data[position:position + 2], "big")  # a segment: its length counts itself


def pixel_box(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """The box in whole pixels, inside the image and at least one pixel wide."""
    left, top = min(int(box[0]), width - 1), min(int(box[1]), height - 1)
    return left, top, max(left + 1, min(round(box[2]), width)), max(top + 1, min(round(box[3]), height))


def resize_box(image: np.ndarray, box: Box, size: int, flip: bool) -> torch.Tensor:
    """The box of an HWC image, resized to size x size, still HWC: the device transposes whole batches."""
    left, top, right, bottom = pixel_box(box, image.shape[1], image.shape[0])
    region = image[top:bottom, left:right]
    # Bilinear is 7x faster than area averaging and alias-free enough below 2x; the DCT-scaled decode
    # already took care of any larger factor for JPEGs, so area averaging is left for the rest.
    far = min(region.shape[:2]) >= 2 * size
    resized = cv2.resize(region, (size, size), interpolation=cv2.INTER_AREA if far else cv2.INTER_LINEAR)
    return torch.from_numpy(cv2.flip(resized, 1) if flip else resized)


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


class DecodeCrop:
    """What a CPU decoder's worker does to one image: read its size, pick the crop, decode just enough."""

    def __init__(self, decoder: CpuDecoder, crop: Crop):
        self.decoder, self.crop = decoder, crop

    def __call__(self, data) -> torch.Tensor:
        with decoding():
            width, height = self.decoder.image_size(data)
        box, flip = self.crop(width, height)
        shrink = min(box[2] - box[0], box[3] - box[1]) / self.crop.size
        with decoding():
            image, box = self.decoder.decode_any(data, (width, height), box, shrink)
        return resize_box(image, box, self.crop.size, flip)
