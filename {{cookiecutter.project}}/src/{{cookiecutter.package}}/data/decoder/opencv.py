"""`decoder=opencv`: cv2.imdecode with its reduced-size flags (1/2, 1/4, 1/8 scale in the DCT domain)."""
import cv2
import numpy as np

from . import CpuDecoder, dct_scale
from .jpeg import reads_as_jpeg

REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
           8: cv2.IMREAD_REDUCED_COLOR_8}


class OpenCvDecoder(CpuDecoder):
    def reads(self, data: bytes) -> bool:
        # Pillow decodes the rest: other formats (whose readers differ from OpenCV's), Adobe's inverted CMYK (which
        # reads the other way round here), a JPEG cut short (for which Pillow has a verdict of its own).
        return reads_as_jpeg(data)

    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), REDUCED[dct_scale(shrink)] | cv2.IMREAD_IGNORE_ORIENTATION)
        if image is None:
            raise ValueError("OpenCV cannot decode it")
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
