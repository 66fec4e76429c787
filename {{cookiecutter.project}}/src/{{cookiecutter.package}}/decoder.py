"""JPEG decoders: `decoder=pil|opencv|turbojpeg|torchvision|nvjpeg` (and `dali`, in dali.py).

Every decoder turns encoded bytes into the same thing, an RGB uint8 crop, and they agree within JPEG
tolerance: the crop geometry and the final resize are shared, only the decode differs. None of them
applies EXIF orientation, like the PIL path ImageNet models have always been trained with.

The CPU decoders decode in the loader's workers, at 1/2, 1/4 or 1/8 scale when the crop is at least
that much larger than its output (libjpeg's DCT scaling skips most of the work). `nvjpeg` leaves the
workers only reading bytes and picking crops; the GPU decodes, crops and flips whole batches.
"""
import io
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import cv2
import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from .config import ConfigError, optional_import

Box = tuple[float, float, float, float]  # left, top, right, bottom, in pixels of the full-size image
Crop = Callable[[int, int], tuple[Box, bool]]  # (width, height) -> (box, flip)
# What the decoding libraries raise for a file they cannot read: Pillow (OSError, SyntaxError, its
# DecompressionBombError), OpenCV (cv2.error), simplejpeg (ValueError), torchvision (RuntimeError).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, cv2.error, Image.DecompressionBombError)


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


class DecodeCrop:
    """What a CPU decoder's worker does to one image: read its size, pick the crop, decode just enough."""

    def __init__(self, decoder: "Decoder", crop: Crop, size: int):
        self.decoder, self.crop, self.size = decoder, crop, size

    def __call__(self, data) -> torch.Tensor:
        with decoding():
            width, height = self.decoder.size(data)
        box, flip = self.crop(width, height)
        shrink = min(box[2] - box[0], box[3] - box[1]) / self.size
        with decoding():
            image = self.decoder.decode(data, shrink)
        sx, sy = image.shape[1] / width, image.shape[0] / height  # a reduced decode scales the box too
        return resize_box(image, (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy), self.size, flip)


class Decoder:
    """The contract every decoder keeps: a worker transform, a collate and an upload to the device.

    CPU decoders only define `size` and `decode`; GPU decoders replace the transform and the upload.
    """

    def size(self, data: bytes) -> tuple[int, int]:
        return pil_size(data)

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        """An HWC uint8 RGB image, at most `shrink` times smaller than full size."""
        raise NotImplementedError

    def transform(self, crop: Crop, size: int) -> Callable:
        """What the loader's workers apply to a file's bytes."""
        return DecodeCrop(self, crop, size)

    def collate(self, samples: list) -> list:
        return default_collate(samples)

    def upload(self, images, device: torch.device, non_blocking: bool) -> torch.Tensor:
        """A collated batch -> uint8 NCHW images on `device`."""
        return images.to(device, non_blocking=non_blocking).permute(0, 3, 1, 2)

    def check_device(self, device: torch.device) -> None:
        """Refuse at start-up a device this decoder cannot feed."""


def _scale(shrink: float) -> int:
    """The largest libjpeg DCT scale denominator (1, 2, 4, 8) that does not shrink below `shrink`."""
    return max((d for d in (1, 2, 4, 8) if d <= shrink), default=1)


class PilDecoder(Decoder):
    """Pillow, with `draft` for DCT-domain downscaling."""

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        image = Image.open(io.BytesIO(data))
        if shrink >= 2:
            image.draft("RGB", (math.ceil(image.width / shrink), math.ceil(image.height / shrink)))
        return np.asarray(image.convert("RGB"))


class OpenCvDecoder(Decoder):
    """cv2.imdecode with IMREAD_REDUCED_* flags; one OpenCV thread per worker so workers do not oversubscribe."""

    REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
               8: cv2.IMREAD_REDUCED_COLOR_8}

    def __init__(self):
        cv2.setNumThreads(0)  # inherited by forked workers; spawned ones set it again in seed_worker

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        if _is_cmyk_jpeg(data):  # OpenCV reads Adobe's inverted CMYK the other way round from Pillow
            return PilDecoder().decode(data, shrink)
        flags = self.REDUCED[_scale(shrink)] | cv2.IMREAD_IGNORE_ORIENTATION
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
        if image is None:
            raise ValueError("OpenCV cannot decode it")
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def _is_cmyk_jpeg(data: bytes) -> bool:
    return data[:2] == b"\xff\xd8" and Image.open(io.BytesIO(data)).mode == "CMYK"


class TurboJpegDecoder(Decoder):
    """libjpeg-turbo through simplejpeg, with DCT scaling (min_width/min_height). Needs `.[turbojpeg]`.

    simplejpeg reads baseline and progressive YCbCr or grayscale JPEGs; anything else (PNG under a
    .JPEG name, CMYK) falls back to Pillow, so every file of ImageNet still decodes.
    """

    def __init__(self):
        self.simplejpeg = optional_import("simplejpeg", "turbojpeg")

    def size(self, data: bytes) -> tuple[int, int]:
        try:
            height, width, *_ = self.simplejpeg.decode_jpeg_header(data)
            return width, height
        except ValueError:
            return pil_size(data)

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        try:
            height, width, colorspace, _ = self.simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return PilDecoder().decode(data, shrink)
        if colorspace not in ("YCbCr", "Gray"):
            return PilDecoder().decode(data, shrink)
        scale = _scale(shrink)
        return self.simplejpeg.decode_jpeg(data, "RGB", min_width=math.ceil(width / scale),
                                           min_height=math.ceil(height / scale))


class TorchvisionDecoder(Decoder):
    """torchvision.io.decode_image on the CPU (full-size decode: it has no DCT scaling)."""

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        from torchvision.io import ImageReadMode, decode_image

        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return decode_image(tensor, ImageReadMode.RGB).permute(1, 2, 0).numpy()


class EncodedCrop:
    """The worker side of GPU decoders: keep the bytes, pick the crop in whole pixels; nothing is decoded."""

    def __init__(self, crop: Crop):
        self.crop = crop

    def __call__(self, data: bytes) -> tuple[torch.Tensor, torch.Tensor, bool]:
        with decoding():
            width, height = pil_size(data)
        box, flip = self.crop(width, height)
        if not data.rstrip(b"\0").endswith(b"\xff\xd9"):  # one truncated file would fail its whole GPU batch
            raise Unreadable("truncated JPEG: no end-of-image marker")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), torch.tensor(pixel_box(box, width, height)), flip


class NvjpegDecoder(Decoder):
    """Batches of JPEG bytes decoded on the GPU by torchvision.io.decode_jpeg(device="cuda"), cropped there too.

    The files nvJPEG cannot take (PNG under a .JPEG name, CMYK) are decoded by Pillow in the worker
    and travel as pixels, so a batch may mix the two.
    """

    def __init__(self, size: int, decode_device: str = "cuda"):
        self.size, self.decode_device = size, decode_device

    def check_device(self, device: torch.device) -> None:
        if self.decode_device == "cuda" and device.type != "cuda":
            raise ConfigError("decoder=nvjpeg decodes on the GPU and this run has none: pick decoder=turbojpeg")

    def transform(self, crop: Crop, size: int) -> Callable:
        return NvjpegItem(EncodedCrop(crop), DecodeCrop(PilDecoder(), crop, size))

    def collate(self, samples: list) -> tuple[list, torch.Tensor]:
        return [item for item, _ in samples], torch.tensor([label for _, label in samples])

    def upload(self, items: list, device: torch.device, non_blocking: bool) -> torch.Tensor:
        encoded = [item for item in items if isinstance(item, tuple)]
        crops = iter(self.decode_crops(encoded, device, non_blocking) if encoded else [])
        return torch.stack([next(crops) if isinstance(item, tuple)
                            else item.to(device, non_blocking=non_blocking).permute(2, 0, 1) for item in items])

    def decode_crops(self, encoded: list, device: torch.device, non_blocking: bool) -> list[torch.Tensor]:
        """(bytes, box, flip) items -> CHW uint8 crops on `device`, in order."""
        from torchvision.io import ImageReadMode, decode_jpeg

        decoded = decode_jpeg([data for data, _, _ in encoded], ImageReadMode.RGB, device=self.decode_device)
        return [self._crop(image.to(device, non_blocking=non_blocking), box.tolist(), flip)
                for image, (_, box, flip) in zip(decoded, encoded)]

    def _crop(self, image: torch.Tensor, box: list[int], flip: bool) -> torch.Tensor:
        left, top, right, bottom = box
        region = image[None, :, top:bottom, left:right].float()
        resized = torch.nn.functional.interpolate(region, (self.size, self.size), mode="bilinear",
                                                  antialias=True, align_corners=False)
        resized = resized.round_().clamp_(0, 255).to(torch.uint8)[0]
        return resized.flip(-1) if flip else resized


class NvjpegItem:
    """Encoded bytes for JPEGs nvJPEG reads; a CPU-decoded crop for the rest."""

    def __init__(self, encoded: EncodedCrop, fallback: DecodeCrop):
        self.encoded, self.fallback = encoded, fallback

    def __call__(self, data: bytes):
        with decoding():
            cpu_only = data[:2] != b"\xff\xd8" or _is_cmyk_jpeg(data)
        if cpu_only:
            return self.fallback(data)
        return self.encoded(data)


class Decoded(Decoder):
    """For formats that store pixels (format=tensor): nothing to decode, only the crop."""

    def size(self, data: np.ndarray) -> tuple[int, int]:
        return data.shape[1], data.shape[0]

    def decode(self, data: np.ndarray, shrink: float) -> np.ndarray:
        return data


def pil() -> Decoder:
    return PilDecoder()


def opencv() -> Decoder:
    return OpenCvDecoder()


def turbojpeg() -> Decoder:
    return TurboJpegDecoder()


def torchvision() -> Decoder:
    return TorchvisionDecoder()


def nvjpeg(size: int, decode_device: str = "cuda") -> Decoder:
    return NvjpegDecoder(size, decode_device)
