"""`decoder=turbojpeg`: libjpeg-turbo through simplejpeg, with DCT scaling (min_width/min_height).

simplejpeg reads baseline and progressive YCbCr or grayscale JPEGs; anything else (PNG under a .JPEG
name, CMYK) falls back to Pillow, so every file of ImageNet still decodes.
"""
import math

import numpy as np
import simplejpeg

from . import CpuDecoder, dct_scale, pil_size
from .pil import PilDecoder


class TurboJpegDecoder(CpuDecoder):
    def image_size(self, data: bytes) -> tuple[int, int]:
        try:
            height, width, *_ = simplejpeg.decode_jpeg_header(data)
            return width, height
        except ValueError:
            return pil_size(data)

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return PilDecoder().decode(data, shrink)
        if colorspace not in ("YCbCr", "Gray"):
            return PilDecoder().decode(data, shrink)
        scale = dct_scale(shrink)
        return simplejpeg.decode_jpeg(data, "RGB", min_width=math.ceil(width / scale),
                                      min_height=math.ceil(height / scale))
