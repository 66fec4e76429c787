"""`decoder=pil`: Pillow, decoding at 1/2, 1/4 or 1/8 scale (`draft`) when the crop allows it."""
import numpy as np

from . import CpuDecoder, pillow_decode


class PilDecoder(CpuDecoder):
    def decode(self, data: bytes, shrink: float) -> np.ndarray:
        return pillow_decode(data, shrink)
