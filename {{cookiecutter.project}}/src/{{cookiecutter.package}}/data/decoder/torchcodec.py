"""`decoder=torchcodec`: TorchCodec's JPEG decoder on the CPU (libjpeg-turbo, no FFmpeg), full size.

It has no reduced-size decode, and it turns images by their EXIF orientation, which is undone. Pillow takes what it does not read as JPEG (PNG under a .JPEG name) and
the Adobe CMYK files it reads the other way round from Pillow.
"""
import numpy as np
import torch
from torchcodec.decoders import decode_jpeg

from . import CpuDecoder
from .jpeg import as_stored, exif_orientation, reads_as_jpeg


class TorchCodecDecoder(CpuDecoder):
    def reads(self, data: bytes) -> bool:
        return reads_as_jpeg(data)

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode="RGB")
        return as_stored(image, exif_orientation(data)).permute(1, 2, 0).numpy()
