"""`decoder=torchcodec`: TorchCodec's JPEG decoder on the CPU (libjpeg-turbo, no FFmpeg), full size.

It has no reduced-size decode, and it turns images by their EXIF orientation, which is undone. Pillow takes what it does not read as JPEG (PNG under a .JPEG name) and
the Adobe CMYK files it reads the other way round from Pillow.
"""
import numpy as np
import torch
from torchcodec.decoders import decode_jpeg

from . import CpuDecoder, as_stored, exif_orientation, is_cmyk_jpeg
from .pil import PilDecoder


class TorchCodecDecoder(CpuDecoder):
    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        if data[:2] != b"\xff\xd8" or is_cmyk_jpeg(data):
            return PilDecoder().decode(data, shrink)
        image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode="RGB")
        return as_stored(image, exif_orientation(data)).permute(1, 2, 0).numpy()
