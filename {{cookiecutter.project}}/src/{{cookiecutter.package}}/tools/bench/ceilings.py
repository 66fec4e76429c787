"""The two references bench puts beside every row, what the cores could decode with files already in memory in one
process, and each row's share of them:

- the full-decode ceiling decodes every pixel of every file at full size: what a loader that decodes whole
  images, then crops, cannot pass;
- the region-decode ceiling decodes only what the training crop keeps (a decoder whose facts say `region_decode`),
  at the DCT scale the crop allows: what a loader that decodes regions cannot pass.

Each is measured in passes spread over the whole bench, one of each before every row and one after the last, and is
the rate over all its passes. A row is timed for seconds or minutes on a machine whose speed drifts: on an idle
2-core VM, half-second passes over the same 300 photos ran anywhere from 426 to 667 a second within one minute. A
reference measured once, at the start, or its best pass, would describe another machine than the one the rows ran on.
"""
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ... import options
from ...core.hardware import cores_per_process
from ...data.crops import TrainCrop
from ...data.decoder import CpuDecoder, Unreadable, decoding, pillow_decode
from ...data.format.folder import open_tree

log = logging.getLogger(__name__)

CEILING_FILES = 300  # files decoded in each pass, at most


@dataclass
class Ceiling:
    decoder: str  # the fastest decoder, whose rate this is
    unreadable: int  # of the files it was timed on, skipped as training skips them
    passes: list[tuple[int, float]] = field(default_factory=list)  # (files decoded, seconds) of each pass

    @property
    def rate(self) -> float:
        """Decodes per second in one process, over all passes."""
        return sum(decoded for decoded, _ in self.passes) / sum(seconds for _, seconds in self.passes)

    def spread(self) -> str:
        rates = [decoded / seconds for decoded, seconds in self.passes]
        return f"{len(rates)} passes beside the rows, {min(rates):.0f}-{max(rates):.0f}/s"


def decode_pass(files: list[bytes], decoder: CpuDecoder, decode: Callable) -> tuple[int, float]:
    """(files decoded, seconds) of `decode(decoder, data)` over `files`; an unreadable file is skipped, as training
    skips it."""
    decoded, start = 0, time.perf_counter()
    for data in files:
        try:
            with decoding():
                decode(decoder, data)
            decoded += 1
        except Unreadable:
            pass
    return decoded, time.perf_counter() - start


def fastest(files: list[bytes], decoders: dict[str, CpuDecoder], decode: Callable) -> Ceiling | None:
    """The fastest of `decoders` at `decode(decoder, data)` over `files`, each timed in turn over two passes after a
    warm-up decode; the passes that chose it are not the ceiling's."""
    timed = {}
    for name, decoder in decoders.items():
        decode_pass(files[:1], decoder, decode)
        passes = [decode_pass(files, decoder, decode) for _ in range(2)]
        timed[name] = Ceiling(name, len(files) - passes[0][0], passes)
    if not timed:
        return None
    best = max(timed.values(), key=lambda ceiling: ceiling.rate)
    log.info("one process, files in memory: %s",
             ", ".join(f"{name} {ceiling.rate:.0f}/s" for name, ceiling in timed.items()))
    return Ceiling(best.decoder, best.unreadable)


def full_decode(decoder: CpuDecoder, data: bytes) -> None:
    """The whole image at full size, as training decodes the file: by Pillow where the decoder does not read it (a
    JPEG cut short, which libjpeg-turbo would fill with grey rows and a warning)."""
    decoder.decode(data, 1) if decoder.reads(data) else pillow_decode(data, 1)


def region_decode(crop: TrainCrop) -> Callable:
    """Decode what one random crop of the file keeps, as a worker would, without the resize."""
    def decode(decoder: CpuDecoder, data: bytes) -> None:
        size = decoder.image_size(data)
        box, _ = crop(*size)
        decoder.decode_any(data, size, box, min(box[2] - box[0], box[3] - box[1]) / crop.size)
    return decode


class Ceilings:
    """The full-decode ceiling and the region-decode ceiling (None where no decoder here decodes a region) of the
    training files under `root`, for `decoders`; `measure` times one more pass of each."""

    def __init__(self, root: Path, decoders: dict[str, CpuDecoder], crop_size: int):
        train, _, _ = open_tree(root)
        self.files = [train.payload(index) for index in range(min(len(train), CEILING_FILES))]
        random.seed(0)  # the same crops in every run
        self.decoders = decoders
        self.decodes = {"full": full_decode, "region": region_decode(TrainCrop(crop_size))}
        regional = {name: decoder for name, decoder in decoders.items() if options.facts("decoder", name).region_decode}
        self.full = fastest(self.files, decoders, full_decode)
        self.region = fastest(self.files, regional, self.decodes["region"])

    def measure(self) -> None:
        for kind, ceiling in (("full", self.full), ("region", self.region)):
            if ceiling is not None:
                ceiling.passes.append(decode_pass(self.files, self.decoders[ceiling.decoder], self.decodes[kind]))


def cores_for(workers: int | str) -> int:
    """The cores a loader of `workers` processes keeps busy: all this process may use for `auto`, which may pick any
    count up to them (or none, for a decoder whose own threads use them)."""
    cores = cores_per_process()
    return cores if workers == "auto" else max(1, min(workers, cores))


def shares(rows: list[dict], cache: str) -> list[dict]:
    """The rows as bench gives them: the references' rates over every pass of the ceilings timed so far, and each
    row as a share of those of its bench.num_workers entry (`workers`: a count, or auto). `rows` are left as they
    are, their references holding their `Ceiling`, so that passes timed later count when they are given again."""
    given = []
    for row in map(dict, rows):
        if "ceiling" in row:
            ceiling: Ceiling | None = row.pop("ceiling")
            row.update(reference=True, images_per_s=ceiling.rate * cores_for(row["workers"]) if ceiling else None,
                       unreadable=ceiling.unreadable if ceiling else "",
                       note="; ".join(filter(None, [row["note"], ceiling.spread() if ceiling else ""])))
        given.append(row)
    for row in given:
        row["page_cache"] = cache
        if row["images_per_s"] is None:  # not run: no rate, so no shares (its note says why)
            continue
        full, baseline_row, region = (next(reference for reference in given if reference["decoder"] == name and
                                           reference["workers"] == row["workers"])
                                      for name in ("ceiling", "baseline", "region ceiling"))
        row["vs_baseline"] = row["images_per_s"] / baseline_row["images_per_s"]
        row["vs_ceiling"] = row["images_per_s"] / full["images_per_s"]
        row["vs_region_ceiling"] = row["images_per_s"] / region["images_per_s"] if region["images_per_s"] else ""
    return given
