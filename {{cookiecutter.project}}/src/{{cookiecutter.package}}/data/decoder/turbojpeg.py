"""`decoder=turbojpeg`: libjpeg-turbo through simplejpeg, with DCT scaling (min_width/min_height).

simplejpeg reads baseline and progressive YCbCr or grayscale JPEGs; Pillow takes anything else (PNG under a
.JPEG name, CMYK), so every file of ImageNet still decodes.
"""
import math

import numpy as np
import simplejpeg

from . import CpuDecoder, dct_scale, pil_size


class TurboJpegDecoder(CpuDecoder):
    def image_size(self, data: bytes) -> tuple[int, int]:
        try:
            height, width, *_ = simplejpeg.decode_jpeg_header(data)
            return width, height
        except ValueError:
            return pil_size(data)

    def reads(self, data: bytes) -> bool:
        try:
            return simplejpeg.decode_jpeg_header(data)[2] in ("YCbCr", "Gray")
        except ValueError:
            return False

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        height, width, *_ = simplejpeg.decode_jpeg_header(data)
        scale = dct_scale(shrink)
        return simplejpeg.decode_jpeg(data, "RGB", min_width=math.ceil(width / scale),
                                      min_height=math.ceil(height / scale))
