"""The device's side of every batch: upload (where a batch decoder decodes), normalise, lay out; and how long the
training process took over it, beside how long it waited for the loader's batch."""
import threading
import time
from collections.abc import Iterable, Iterator

import torch

from ..contracts import Decoder

# ImageNet's per-channel statistics, in 0..1 of the pixel range: what torchvision's weights and most of timm's were
# trained with, and the normalisation of a run whose weights say nothing else (data.mean, data.std).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MEAN = tuple(255 * value for value in IMAGENET_MEAN)  # on 0..255 pixels, as the device normalises them
STD = tuple(255 * value for value in IMAGENET_STD)


class UploadTimes:
    """Where the training process (or a prefetcher's thread) spends the time it takes to get each batch to the
    device: waiting for the loader's next batch, or uploading it, which for a batch decoder is decoding it (on the
    device, or on the CPU in its on_cpu mode). `sample()` gives per-batch figures since its previous call."""
    FIGURES = {"loader/upload_ms": "uploading {:.1f} ms/batch",
               "loader/upload_share": "{:.0f}% of each batch's wait uploading"}  # tag: the report's words and unit

    def __init__(self):
        self.lock = threading.Lock()  # a prefetcher's thread adds while the training thread samples
        self.totals = (0.0, 0.0, 0)  # seconds waiting, seconds uploading, batches
        self.last = self.totals

    def add(self, waiting_s: float, uploading_s: float) -> None:
        with self.lock:
            waiting, uploading, batches = self.totals
            self.totals = (waiting + waiting_s, uploading + uploading_s, batches + 1)

    def sample(self) -> dict[str, float]:
        """`loader/upload_ms` a batch, and `loader/upload_share`, the percentage of the time to get a batch spent
        uploading it rather than waiting for it; zeros when no batch was uploaded since the last call."""
        with self.lock:
            now = self.totals
        waiting, uploading, batches = (new - old for new, old in zip(now, self.last))
        self.last = now
        return {"loader/upload_ms": 1000 * uploading / max(batches, 1),
                "loader/upload_share": 100 * uploading / (waiting + uploading) if batches else 0.0}


class Waited:
    """An iterable's items, counting the seconds spent waiting for them; the iterator is made at the first item, so
    that a loader starting its workers there counts as waiting too."""

    def __init__(self, items: Iterable):
        self.items, self.iterator, self.seconds = items, None, 0.0

    def __iter__(self) -> "Waited":
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            if self.iterator is None:
                self.iterator = iter(self.items)
            return next(self.iterator)
        finally:
            self.seconds += time.perf_counter() - start


class ToDevice:
    """Collated batches -> (normalised float images, labels) on the device: the decoder's uploads, then the
    normalisation and the model's memory format. Every batch reaches the step through `stream`; prefetchers choose
    when and on which stream it runs."""

    def __init__(self, decoder: Decoder, device: torch.device, non_blocking: bool,
                 memory_format: torch.memory_format = torch.contiguous_format,
                 mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD):
        """`mean`, `std`: per channel, in 0..1 of the pixel range."""
        self.decoder, self.device, self.non_blocking, self.memory_format = decoder, device, non_blocking, memory_format
        # (x - mean) / std as x * scale + shift: one multiply-add, which a GPU runs as one kernel from the uint8
        # pixels straight into the memory format's layout (a CPU casts the pixels to float first: two).
        mean, std = (torch.tensor([255 * value for value in each], device=device).view(1, 3, 1, 1)
                     for each in (mean, std))
        self.scale, self.shift = 1 / std, -mean / std
        self.times = UploadTimes()

    def __call__(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch, through `stream`."""
        return next(self.stream([batch]))

    def stream(self, batches: Iterable) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each batch of `batches` on the device, in order; the decoder may work on the next meanwhile."""
        waited = Waited(batches)
        uploads = self.decoder.uploads(waited, self.device, self.non_blocking)
        while True:
            start, waited_before = time.perf_counter(), waited.seconds
            try:
                images, labels = next(uploads)
            except StopIteration:
                return
            normalised = torch.empty(images.shape, dtype=torch.float32, device=self.device,
                                     memory_format=self.memory_format)
            images = torch.addcmul(self.shift, images, self.scale, out=normalised)
            labels = labels.to(self.device, non_blocking=self.non_blocking)
            waiting = waited.seconds - waited_before
            self.times.add(waiting, time.perf_counter() - start - waiting)
            yield images, labels
