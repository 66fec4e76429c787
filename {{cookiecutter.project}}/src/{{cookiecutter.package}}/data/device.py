"""The device's side of every batch: upload (where a batch decoder decodes), normalise, lay out."""
from collections.abc import Iterable, Iterator

import torch

from ..contracts import Decoder

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class ToDevice:
    """A collated batch -> (normalised float images, labels) on the device; prefetchers choose when and where."""

    def __init__(self, decoder: Decoder, device: torch.device, non_blocking: bool,
                 memory_format: torch.memory_format = torch.contiguous_format):
        self.decoder, self.device, self.non_blocking, self.memory_format = decoder, device, non_blocking, memory_format
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    def __call__(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self.stream([batch]))

    def stream(self, batches: Iterable) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each batch of `batches` on the device, in order; the decoder may work on the next meanwhile."""
        for images, labels in self.decoder.uploads(batches, self.device, self.non_blocking):
            images = images.float().sub_(self.mean).div_(self.std).contiguous(memory_format=self.memory_format)
            yield images, labels.to(self.device, non_blocking=self.non_blocking)
