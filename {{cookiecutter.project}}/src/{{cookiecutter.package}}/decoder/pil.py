"""`decoder=pil`: Pillow, decoding at 1/2, 1/4 or 1/8 scale (`draft`) when the crop allows it."""
import io
import math

import numpy as np
from PIL import Image

from . import CpuDecoder


class PilDecoder(CpuDecoder):
    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        image = Image.open(io.BytesIO(data))
        if shrink >= 2:
            image.draft("RGB", (math.ceil(image.width / shrink), math.ceil(image.height / shrink)))
        return np.asarray(image.convert("RGB"))
