"""`decoder=torchcodec`: TorchCodec's JPEG decoder on the CPU (libjpeg-turbo, no FFmpeg), full size.

It has no reduced-size decode. It turns an image by the EXIF orientation it reads from the first APP1 segment, its own
way, so it never sees one (`without_app1`). Pillow takes what it does not read as JPEG (PNG under a .JPEG name), the
Adobe CMYK files it reads the other way round from Pillow, and a JPEG cut short.
"""
import numpy as np
import torch
from torchcodec.decoders import decode_jpeg

from . import CpuDecoder
from .jpeg import reads_as_jpeg, without_app1


class TorchCodecDecoder(CpuDecoder):
    def reads(self, data: bytes) -> bool:
        return reads_as_jpeg(data)

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        # A copy (bytearray) either way: torch.frombuffer wants a writable buffer.
        image = decode_jpeg(torch.frombuffer(without_app1(data), dtype=torch.uint8), mode="RGB")
        return image.permute(1, 2, 0).numpy()
