"""What the batch decoders (nvjpeg, dali) share: workers keep the bytes and pick the crop; the upload
decodes, crops and flips the whole batch on the device.

`on_cpu: true` runs the same batched path with the CPU as the device, for tests and machines without a GPU.
The files a GPU decoder cannot take (PNG under a .JPEG name, CMYK, arithmetic-coded or 12-bit JPEGs,
truncated) are decoded by Pillow in the worker and travel as pixels, so a batch may mix the two.
"""
import math
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from ... import options
from ...contracts import Crop, Decoder
from ...core.errors import ConfigError
from ..batch_memory import batch_buffer
from . import DecodeCrop, check_size, decoding, pixel_box
from .jpeg import header_size, jpeg_end, jpeg_frame, without_app1
from .pil import PilDecoder


class Encoded:
    """One image for the device to decode: its bytes, its crop box in whole pixels, whether to flip it."""

    def __init__(self, data: np.ndarray, box: tuple[int, int, int, int], flip: bool, size: int):
        self.data, self.box, self.flip, self.size = data, box, flip, size  # data: the file's bytes, as uint8


class OneBuffer:
    """A batch's bytes and pixels in one uint8 tensor, each item's share a view of it.

    A loader worker hands every tensor of a batch over through a shared-memory file descriptor that it holds
    until the training process takes the batch: one per image would be 1,024 for a batch of 256 with four
    batches prefetched, the usual soft limit. One buffer is one descriptor, however many images it holds (two
    where the worker lends it: its flags travel with it, batch_memory.py)."""

    def __init__(self, items: list[Encoded | torch.Tensor]):
        arrays = [item.data if isinstance(item, Encoded) else item.numpy() for item in items]
        self.shapes = [array.shape for array in arrays]
        self.buffer = batch_buffer((sum(array.size for array in arrays),))
        np.concatenate([array.reshape(-1) for array in arrays], out=self.buffer.numpy())
        self.encoded = [(item.box, item.flip, item.size) if isinstance(item, Encoded) else None for item in items]

    def items(self) -> list[Encoded | torch.Tensor]:
        views = self.buffer.split([math.prod(shape) for shape in self.shapes])
        return [Encoded(view.numpy(), *encoded) if encoded else view.view(shape)
                for view, shape, encoded in zip(views, self.shapes, self.encoded)]


class EncodedOrPixels:
    """The worker's side: the bytes and crop of a JPEG the device reads, or Pillow's crop of anything else."""

    def __init__(self, crop: Crop):
        self.crop, self.fallback = crop, DecodeCrop(PilDecoder(), crop)

    def __call__(self, data: bytes) -> Encoded | torch.Tensor:
        frame = jpeg_frame(data)  # one walk over the header: what the device takes, the size, APP1 segments
        end = None
        if frame and frame.huffman_8bit and not frame.cmyk:
            # A trailer after the image would fail the device's batch: it is cut off.
            end = len(data) if data.endswith(b"\xff\xd9") else jpeg_end(data)
        if end is None:  # and a JPEG cut short gets Pillow's verdict, as any file the device does not take
            return torch.from_numpy(self.fallback(data).resized())
        data = data[:end]
        with decoding():
            width, height = header_size(data, frame)
        check_size(width, height)
        box, flip = self.crop(width, height)
        # A view of the bytes, not a copy, since the collate copies them into the batch's buffer; but a copy with its
        # APP1 segments hidden where it has any, by which TorchCodec would turn the image (DALI, told not to, does not).
        encoded = without_app1(data) if frame.app1 else data
        return Encoded(np.frombuffer(encoded, np.uint8), pixel_box(box, width, height), flip, self.crop.size)


class BatchDecoder(Decoder):
    """Subclasses implement `start`: a list of `Encoded` -> (a call that gives) uint8 NCHW crops on the device."""

    def __init__(self, on_cpu: bool):
        self.on_cpu = on_cpu

    @property
    def name(self) -> str:
        return type(self).__module__.rsplit(".", 1)[-1]

    def check_device(self, device: torch.device) -> None:
        if not self.on_cpu and device.type != "cuda":
            raise ConfigError(f"decoder={self.name} decodes on the GPU and this run has none: pass "
                              f"decoder.on_cpu=true to run its batched path on the CPU, or pick "
                              f"decoder={options.fastest_cpu_decoder()}")

    def transform(self, crop: Crop) -> Callable:
        return EncodedOrPixels(crop)

    def collate(self, samples: list) -> tuple[OneBuffer, torch.Tensor]:
        return OneBuffer([item for item, _ in samples]), torch.tensor([label for _, label in samples])

    def uploads(self, batches: Iterable, device: torch.device, non_blocking: bool
                ) -> Iterator[tuple[torch.Tensor, Any]]:
        started = deque()
        for batch, labels in batches:
            started.append((self.begin(batch, device, non_blocking), labels))
            if len(started) > self.queued_batches:
                crops, labels = started.popleft()
                yield crops(), labels
        for crops, labels in started:
            yield crops(), labels

    def begin(self, batch: OneBuffer, device: torch.device, non_blocking: bool) -> Callable[[], torch.Tensor]:
        """Start on a batch; the call returned waits for its crops, uint8 NCHW on the device."""
        items = batch.items()
        encoded = [item for item in items if isinstance(item, Encoded)]
        decoded = self.start(encoded, device, non_blocking) if encoded else list  # none for the device: []

        def crops() -> torch.Tensor:
            if len(encoded) == len(items):  # the usual batch: the decoder's output is the batch, without a copy of it
                return decoded()
            device_crops = iter(decoded())
            return torch.stack([next(device_crops) if isinstance(item, Encoded)
                                else item.to(device, non_blocking=non_blocking).permute(2, 0, 1) for item in items])
        return crops

    @abstractmethod
    def start(self, encoded: list[Encoded], device: torch.device, non_blocking: bool) -> Callable[[], torch.Tensor]:
        """Start decoding `encoded`; the call returned gives its crops, uint8 NCHW on the device. A decoder whose
        library decodes in the background returns before the decode is done, and says how many batches it keeps
        queued (`queued_batches`)."""
