"""How bench times a loader: whole epochs after an untimed one, as a training run meets them."""
import time
from dataclasses import dataclass

import torch

from ...core.distributed import ALONE
from ...core.hardware import synchronize


@dataclass
class Timed:
    rate: float  # images per second over the timed epochs
    epoch_start_s: float  # from an epoch's start to its first batch, the mean over the timed epochs


def time_epochs(loader, epochs: int, uploads=lambda batches: batches, device: torch.device = ALONE.device,
                set_epoch=lambda epoch: None) -> Timed:
    """`epochs` whole passes, the batches through `uploads` (as a prefetcher takes them to the device), after one
    untimed pass; `set_epoch` starts each, as training starts its epochs."""
    set_epoch(0)
    for _ in uploads(loader):
        pass
    synchronize(device)
    start, images, epoch_starts = time.perf_counter(), 0, []
    for epoch in range(1, epochs + 1):
        set_epoch(epoch)
        epoch_start = time.perf_counter()
        for index, (_, labels) in enumerate(uploads(loader)):
            if index == 0:
                epoch_starts.append(time.perf_counter() - epoch_start)
            images += len(labels)
    synchronize(device)
    return Timed(images / (time.perf_counter() - start), sum(epoch_starts) / max(1, len(epoch_starts)))
