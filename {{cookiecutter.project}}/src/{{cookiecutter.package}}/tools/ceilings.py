"""The two references bench puts beside every row: what the cores could decode, files already in memory, one process.

- the full-decode ceiling decodes every pixel of every file at full size: what a loader that decodes whole
  images, then crops, cannot pass;
- the region-decode ceiling decodes only what the training crop keeps (a decoder whose facts say `region_decode`),
  at the DCT scale the crop allows: what a loader that decodes regions cannot pass.
"""
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import options
from ..data.crops import TrainCrop
from ..data.decoder import CpuDecoder, Unreadable, decoding
from ..data.format.folder import open_tree

log = logging.getLogger(__name__)

CEILING_FILES = 300  # files decoded for each ceiling, at most
PASSES = 3  # over the files, for each decoder: a ceiling is the best pass, the one others disturbed least


@dataclass
class Ceiling:
    decoder: str  # the fastest decoder, whose rate this is
    rate: float  # decodes per second in one process
    unreadable: int  # of the files it was timed on, skipped as training skips them


def fastest(files: list[bytes], decoders: dict[str, CpuDecoder], decode: Callable) -> Ceiling | None:
    """The fastest of `decoders` at `decode(decoder, data)` over `files`, in the best of `PASSES` passes, after one
    warm-up decode each."""
    rates, unreadable = {}, {}

    def decodes(decoder: CpuDecoder, data: bytes) -> bool:
        try:
            with decoding():
                decode(decoder, data)
        except Unreadable:
            return False
        return True

    for name, decoder in decoders.items():
        next((data for data in files if decodes(decoder, data)), None)  # warm-up
        for _ in range(PASSES):
            start = time.perf_counter()
            decoded = sum(decodes(decoder, data) for data in files)
            rates[name] = max(rates.get(name, 0.0), decoded / (time.perf_counter() - start))
            unreadable[name] = len(files) - decoded
    if not rates:
        return None
    best = max(rates, key=rates.get)
    log.info("one process, files in memory: %s", ", ".join(f"{name} {rate:.0f}/s" for name, rate in rates.items()))
    return Ceiling(best, rates[best], unreadable[best])


def full_decode(decoder: CpuDecoder, data: bytes) -> None:
    decoder.decode(data, 1)


def region_decode(crop: TrainCrop) -> Callable:
    """Decode what one random crop of the file keeps, as a worker would, without the resize."""
    def decode(decoder: CpuDecoder, data: bytes) -> None:
        size = decoder.image_size(data)
        box, _ = crop(*size)
        decoder.decode_any(data, size, box, min(box[2] - box[0], box[3] - box[1]) / crop.size)
    return decode


def ceilings(root: Path, decoders: dict[str, CpuDecoder], crop_size: int) -> tuple[Ceiling, Ceiling | None]:
    """The full-decode ceiling, and the region-decode ceiling (None where no decoder here decodes a region)."""
    train, _, _ = open_tree(root)
    files = [train.payload(index) for index in range(min(len(train), CEILING_FILES))]
    random.seed(0)  # the same crops in every run
    regional = {name: decoder for name, decoder in decoders.items() if options.facts("decoder", name).region_decode}
    return fastest(files, decoders, full_decode), fastest(files, regional, region_decode(TrainCrop(crop_size)))
