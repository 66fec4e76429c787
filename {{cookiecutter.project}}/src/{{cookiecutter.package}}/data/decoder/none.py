"""`decoder=none`: for formats that store decoded pixels (`format=tensor decoder=none`): only the crop."""
import numpy as np

from . import CpuDecoder


class NoDecoder(CpuDecoder):
    def image_size(self, data: np.ndarray) -> tuple[int, int]:
        return data.shape[1], data.shape[0]

    def decode(self, data: np.ndarray, shrink: float) -> np.ndarray:
        return data
