"""`format=tensor`: images decoded once at pack time, resized to a fixed shorter side, stored as raw uint8.

Training only crops and resizes memory-mapped pixels: no decode is left. The cost is disk: about
3 bytes per pixel (a 256-pixel shorter side is ~200 KB per image, 2-3 times the JPEG).
The file is every image's pixels end to end (raw, memory-mapped); its index, a .npy beside it,
holds each image's offset, height, width and label.
"""
from pathlib import Path

import numpy as np

from ...core.errors import ConfigError
from . import Packed, PackedFile



def index_path(path: Path) -> Path:
    return path.with_suffix(".index.npy")


class TensorImages(Packed):
    def __init__(self, path: Path, split: dict):
        try:
            index = np.load(index_path(path))
            pixels = np.memmap(path, np.uint8, "r")
        except (OSError, ValueError) as err:
            raise ConfigError(f"{path} is not a readable tensor pack (written by pack): {err}") from None
        if index.ndim != 2 or index.shape[1] != 4 or (
                len(index) and index[-1, 0] + index[-1, 1] * index[-1, 2] * 3 != len(pixels)):
            raise ConfigError(f"{path} does not match its index {index_path(path)}: pack it again")
        super().__init__(path, index[:, 3].copy())
        self.index = index[:, :3]

    def open(self) -> None:
        self._pixels = np.memmap(self.path, np.uint8, "r")

    def payload(self, index: int) -> np.ndarray:
        offset, height, width = self.index[index]
        return self._pixels[offset:offset + height * width * 3].reshape(height, width, 3)

    def payloads(self, start: int, stop: int) -> list[np.ndarray]:
        offsets, heights, widths = self.index[start:stop].T
        first, last = offsets[0], offsets[-1] + heights[-1] * widths[-1] * 3
        run = np.array(self._pixels[first:last])  # the whole run, one read
        return [run[offset - first:offset - first + height * width * 3].reshape(height, width, 3)
                for offset, height, width in zip(offsets, heights, widths)]


class Tensor(PackedFile):
    kind = "tensor"
    reader = TensorImages
    suffix = ".u8"

    def write(self, path: Path, records, chunk_mb: float) -> None:
        """Stream (HWC uint8 array, label) records into `path`, then write the index beside it."""
        index, offset = [], 0
        with path.open("wb") as stream:
            for pixels, label in records:
                stream.write(np.ascontiguousarray(pixels, np.uint8).tobytes())
                index.append((offset, pixels.shape[0], pixels.shape[1], label))
                offset += pixels.size
        np.save(index_path(path), np.array(index, dtype=np.int64).reshape(-1, 4))
