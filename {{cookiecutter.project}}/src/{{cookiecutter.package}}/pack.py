"""Convert an ImageNet-style tree into a packed format, once, offline.

    python -m {{ cookiecutter.package }}.pack data.root=/data/imagenet format=lmdb pack.out=/data/imagenet-lmdb
    python -m {{ cookiecutter.package }}.pack data.root=/data/imagenet format=tensor pack.short_side=256 pack.out=/data/in-256

The pack is written to a temporary folder beside pack.out and renamed when every file and pack.json are
complete, so an interrupted or failed pack leaves nothing that looks valid.
"""
import importlib
import io
import json
import logging
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import cv2
import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from PIL import Image
from tqdm import tqdm

from .config import ClearError, ConfigError, build
from .decoder import UNREADABLE, PilDecoder, pil_size
from .format import META, SPLITS
from .format.folder import open_tree

log = logging.getLogger(__name__)

FORMATS = ("hdf5", "lmdb", "tensor")


def shorter_side_to(image: np.ndarray, short_side: int) -> np.ndarray:
    height, width = image.shape[:2]
    scale = short_side / min(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)


def decode_resized(data: bytes, short_side: int) -> np.ndarray:
    """RGB pixels with the shorter side at short_side, decoding at reduced scale where that is enough."""
    return shorter_side_to(PilDecoder().decode(data, min(pil_size(data)) / short_side), short_side)


def check_decodes(data: bytes) -> None:
    """Decode at 1/8 scale, which still reads every byte: cheap, and a truncated file fails."""
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
    image.load()


class Convert:
    """One file's bytes -> what the format stores: the bytes, re-encoded resized bytes, or resized pixels."""

    def __init__(self, decoded: bool, short_side: int | None, quality: int):
        self.decoded, self.short_side, self.quality = decoded, short_side, quality

    def __call__(self, path: Path):
        try:
            data = path.read_bytes()
            if self.short_side is None:
                check_decodes(data)  # leave garbage out now rather than skip it at every epoch
                return data
            pixels = decode_resized(data, self.short_side)
            if self.decoded:
                return pixels
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, "JPEG", quality=self.quality)
            return buffer.getvalue()
        except UNREADABLE as err:
            return err


def pack(root: Path, format: str, out: Path, short_side: int | None, quality: int, workers: int,
         overwrite: bool, on_error: str) -> dict:
    """Write the packed folder `out`; the counts, bytes and rate as a dict."""
    if format not in FORMATS:
        raise ConfigError(f"format={format} cannot be packed: pick one of {', '.join(FORMATS)}")
    module = importlib.import_module(f".format.{format}", __package__)
    decoded = format == "tensor"
    if decoded and not short_side:
        raise ConfigError("format=tensor stores pixels at one size: pass pack.short_side=256 (or another size)")
    if out.exists() and not overwrite:
        raise ConfigError(f"pack.out={out} exists: pick another folder or pass pack.overwrite=true")
    train, val, classes = open_tree(root)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    partial.mkdir(parents=True)
    start, meta, skipped = time.perf_counter(), {"format": format, "classes": classes, "short_side": short_side,
                                                  "quality": quality if short_side else None, "splits": {}}, []
    convert = Convert(decoded, short_side, quality)
    try:
        with multiprocessing.Pool(workers) as pool:
            for split, store in zip(SPLITS, (train, val)):
                kept = 0
                payloads = pool.imap(convert, store.paths, chunksize=8)
                bar = tqdm(payloads, total=len(store), desc=f"pack {split}", unit="img", mininterval=2)

                def records():
                    nonlocal kept
                    for index, payload in enumerate(bar):
                        if isinstance(payload, Exception):
                            if on_error == "raise":
                                raise ConfigError(f"unreadable image {store.paths[index]}: {payload}")
                            log.warning("leaving out unreadable image %s: %s", store.paths[index], payload)
                            skipped.append(str(store.paths[index]))
                            continue
                        kept += 1
                        yield payload, int(store.labels[index])

                file = partial / f"{split}{module.SUFFIX}"
                module.write(file, records())
                meta["splits"][split] = {"file": file.name, "images": kept, "bytes": file.stat().st_size}
        (partial / META).write_text(json.dumps(meta, indent=1))
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException as err:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(err, OSError):
            raise ClearError(f"pack failed, nothing written at {out}: {err}") from err
        raise
    seconds = time.perf_counter() - start
    images = sum(split["images"] for split in meta["splits"].values())
    source_bytes = sum(path.stat().st_size for store in (train, val) for path in store.paths)
    packed_bytes = sum(path.stat().st_size for path in out.iterdir())
    return {"out": str(out), "format": format, "images": images, "skipped": len(skipped),
            "source_mb": source_bytes / 1e6, "packed_mb": packed_bytes / 1e6, "seconds": seconds,
            "images_per_s": images / seconds}


@hydra.main(version_base="1.3", config_path="../../conf", config_name="pack")
def main(cfg: DictConfig) -> None:
    try:
        source = build(cfg.data)
        if source.root is None:
            raise ConfigError("pass data.root=SRC, the tree with train/ and val/ to pack")
        report = pack(source.root, HydraConfig.get().runtime.choices["format"], Path(cfg.pack.out).expanduser(),
                      cfg.pack.short_side, cfg.pack.quality, cfg.pack.workers, cfg.pack.overwrite,
                      source.on_error)
    except ClearError as err:
        sys.exit(f"error: {err}")
    log.info("packed %d images (%d left out as unreadable) into %s: %.1f MB from %.1f MB, %.1f s, %.0f images/s",
             report["images"], report["skipped"], report["out"], report["packed_mb"], report["source_mb"],
             report["seconds"], report["images_per_s"])


if __name__ == "__main__":
    main()
