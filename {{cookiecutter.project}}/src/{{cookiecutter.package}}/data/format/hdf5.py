"""`format=hdf5`: every split's encoded JPEG bytes end to end in one HDF5 dataset, with offsets and labels.

One big file instead of many small ones: a network file system or a cold disk serves it in long reads.
"""
from pathlib import Path

import h5py
import numpy as np

from ...core.errors import ConfigError
from . import Packed, PackedFile

CHUNK = 1 << 20  # bytes per HDF5 chunk of the byte stream


class Hdf5Images(Packed):
    def __init__(self, path: Path, split: dict):
        try:
            with h5py.File(path, "r") as file:  # read the index and close: workers open their own handle
                offsets, labels = file["offsets"][:], file["labels"][:]
        except (OSError, KeyError) as err:
            raise ConfigError(f"{path} is not a readable HDF5 pack (written by pack): {err}") from None
        super().__init__(path, labels)
        self.offsets = offsets

    def open(self) -> None:
        self._file = h5py.File(self.path, "r")
        self._bytes = self._file["bytes"]

    def close(self) -> None:
        self._file.close()

    def payload(self, index: int) -> bytes:
        return self._bytes[self.offsets[index]:self.offsets[index + 1]].tobytes()

    def payloads(self, start: int, stop: int) -> list[bytes]:
        first = self.offsets[start]
        run = self._bytes[first:self.offsets[stop]]  # the whole run, one read
        return [run[begin - first:end - first].tobytes()
                for begin, end in zip(self.offsets[start:stop], self.offsets[start + 1:stop + 1])]


class Hdf5(PackedFile):
    kind = "hdf5"
    reader = Hdf5Images
    suffix = ".h5"

    def write(self, path: Path, records, chunk_mb: float) -> None:
        """Append (bytes, label) records to a new file."""
        offsets, labels = [0], []
        with h5py.File(path, "w") as file:
            stream = file.create_dataset("bytes", (0,), dtype=np.uint8, maxshape=(None,), chunks=(CHUNK,))
            for data, label in records:
                start = offsets[-1]
                stream.resize((start + len(data),))
                stream[start:] = np.frombuffer(data, np.uint8)
                offsets.append(start + len(data))
                labels.append(label)
            file["offsets"] = np.array(offsets, dtype=np.int64)
            file["labels"] = np.array(labels, dtype=np.int64)
