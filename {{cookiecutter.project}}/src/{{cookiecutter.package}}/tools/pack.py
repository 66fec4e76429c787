"""Packing a JPEG tree into a format, behind `python -m <package>.pack`: conversion in worker processes, the
writer in a child, and nothing half-written left looking valid."""
import errno
import functools
import hashlib
import io
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from omegaconf import OmegaConf
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from .. import options
from ..core import failures
from ..contracts import Format
from ..core.config import build
from ..core.errors import ClearError, ConfigError
from ..core.files import bytes_in, disk_space, free_bytes
from ..data.decoder import Unreadable, decoding, pillow_decode
from ..data.decoder.jpeg import pil_size
from ..data.format import META, SPLITS
from ..data.format.folder import open_tree

log = logging.getLogger(__name__)


def tree_key(root: Path) -> str:
    """What names the packs of the tree at `root` in bench.pack_dir and tune.pack_dir: its folder's name and a digest
    of its index, every image's path under `root` with its size. Another data set of the same folder name, or this
    one with images added, removed, renamed or rewritten at another size, gets packs of its own. The absolute path
    is left out on purpose: the same tree seen through another path (a mount of it, as scripts/slowdisk.py makes)
    finds the packs written from the original."""
    train, val, _ = open_tree(root)
    index = hashlib.sha1()
    for path in (*train.paths, *val.paths):
        index.update(f"{path.relative_to(root)}\0{path.stat().st_size}\n".encode())
    return f"{root.name}-{index.hexdigest()[:8]}"


def pack_path(pack_dir: Path, key: str, format: str, short_side: int | None) -> Path:
    """Where the pack of the tree whose `tree_key` is `key` goes in `pack_dir`; a pack of pixels (`short_side`) is
    one per side."""
    return pack_dir / "-".join([key, format, *([str(short_side)] if short_side else [])])


def shorter_side_to(image: np.ndarray, short_side: int) -> np.ndarray:
    """The image shrunk so that its shorter side is `short_side`; a smaller one as it is: enlarging adds no detail."""
    height, width = image.shape[:2]
    scale = short_side / min(height, width)
    if scale >= 1:
        return image
    return cv2.resize(image, (max(1, round(width * scale)), max(1, round(height * scale))), interpolation=cv2.INTER_AREA)


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
        data = path.read_bytes()
        try:
            with decoding():
                if self.short_side is None:
                    check_decodes(data)  # leave garbage out now rather than skip it at every epoch
                    return data
                image = pillow_decode(data, min(pil_size(data)) / self.short_side)
        except Unreadable as err:
            return err
        pixels = shorter_side_to(image, self.short_side)
        if self.decoded:
            return pixels
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=self.quality)
        return buffer.getvalue()


WRITE_SEED = 0  # one fixed order: packing the same tree twice writes the same file


def write_order(images: int, split: str) -> np.ndarray:
    """The order a split's images are written in: the training split's shuffled, so that any run of consecutive
    records is a random mix of the classes (order=blocks reads such runs); validation's as the tree lists it."""
    return np.random.default_rng(WRITE_SEED).permutation(images) if split == "train" else np.arange(images)


SAMPLE = 32  # images converted up front to estimate the pack's size
MARGIN = 1.25  # the estimate times this must fit in the free space: file-format overhead, and the sample's error
WRITE_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)  # a read-only file system, another user's folder


def estimated_bytes(stores, convert: Convert) -> int:
    """The pack's size, from converting a sample of the training images."""
    paths = stores[0].paths[:: max(1, len(stores[0]) // SAMPLE)][:SAMPLE]
    sizes = [payload.nbytes if isinstance(payload, np.ndarray) else len(payload)
             for payload in map(convert, paths) if not isinstance(payload, Exception)]
    return int(sum(len(store) for store in stores) * (sum(sizes) / max(1, len(sizes))))


def pack(root: Path, format: str, out: Path | str, short_side: int | None, quality: int, workers: int,
         overwrite: bool, on_error: str, chunk_mb: float = 64, endpoint_url: str | None = None) -> dict:
    """Write the packed folder `out` (or, for a format whose facts say remote, an s3:// prefix); the counts, bytes
    and rate as a dict."""
    packable, facts = options.having("format", "packed"), options.facts("format", format)
    if format not in packable:
        raise ConfigError(f"format={format} cannot be packed: pick one of {', '.join(packable)}")
    if facts.missing():
        raise ConfigError(f"format={format}: {facts.missing()}")
    decoded = facts.holds_pixels
    if decoded and not short_side:
        raise ConfigError(f"format={format} stores pixels at one size: pass pack.short_side=256 (or another size)")
    kind = writer(format, endpoint_url)
    remote = str(out).startswith("s3://")
    if remote and not facts.remote:
        writers = " or ".join(f"format={name}" for name in options.having("format", "remote"))
        raise ConfigError(f"pack.out={out}: only {writers} can be written to S3; pack locally for format={format}")
    if kind.exists(str(out)) and not overwrite:
        raise ConfigError(f"pack.out={out} exists: pick another folder or pass pack.overwrite=true")
    train, val, classes = open_tree(root)
    convert = Convert(decoded, short_side, quality)
    # An S3 pack is written in a local folder first, then uploaded.
    partial = (Path(tempfile.mkdtemp(prefix="pack-")) / "out" if remote
               else Path(out).with_name(f".{Path(out).name}.partial-{os.getpid()}"))
    needed, free = MARGIN * estimated_bytes((train, val), convert), free_bytes(partial.parent)
    if needed > free:
        disk = f"the disk of {partial.parent}, where it is written before the upload," if remote else "its disk"
        raise ConfigError(f"pack.out={out}: the pack needs about {needed / 2**20:.1f} MiB and {disk} has "
                          f"{free / 2**20:.1f} MiB free; free some space or pick a pack.out on another disk")
    start, meta, skipped = time.perf_counter(), {"format": format, "classes": classes, "short_side": short_side,
                                                  "quality": quality if short_side else None, "splits": {}}, []
    try:
        partial.mkdir(parents=True)
        for split, store in zip(SPLITS, (train, val)):
            file = partial / f"{split}{kind.suffix}"
            kept, left_out = write_split(partial_write(kind, chunk_mb), format, file, store, convert, workers,
                                         on_error, split)
            skipped += left_out
            meta["splits"][split] = {"file": file.name, "images": kept, "bytes": bytes_in(file)}
        (partial / META).write_text(json.dumps(meta, indent=1))
        packed_bytes = bytes_in(partial)
        kind.publish(partial, str(out))
    except BaseException as err:
        if isinstance(err, OSError):
            advice = "; pick a folder this user can write" if err.errno in WRITE_REFUSED else ""
            raise ClearError(f"pack failed, nothing written at {out}: {err}{advice}") from err
        raise
    finally:
        shutil.rmtree(partial.parent if remote else partial, ignore_errors=True)
    seconds = time.perf_counter() - start
    images = sum(split["images"] for split in meta["splits"].values())
    source_bytes = sum(path.stat().st_size for store in (train, val) for path in store.paths)
    return {"out": str(out), "format": format, "images": images, "skipped": len(skipped),
            "source_mb": source_bytes / 1e6, "packed_mb": packed_bytes / 1e6, "seconds": seconds,
            "images_per_s": images / seconds}


def writer(format: str, endpoint_url: str | None = None) -> Format:
    """The format option `format` as pack writes it: built from its file, with no path to read, and where it can
    write to S3, the store's `endpoint_url`."""
    node = OmegaConf.load(options.CONF / "format" / f"{format}.yaml")
    node.path = None
    if "endpoint_url" in node:
        node.endpoint_url = endpoint_url
    return build(node)


def partial_write(kind: Format, chunk_mb: float):
    """`kind.write(path, records)`, in pack's settings: what the child process that writes a split calls."""
    return functools.partial(kind.write, chunk_mb=chunk_mb)


def write_split(write, format: str, file: Path, store, convert: Convert, workers: int, on_error: str,
                split: str) -> tuple[int, list[str]]:
    """(images kept, files left out) of one split, written by a child process.

    On a full disk the native writers can take their process down with no message at all: LMDB with
    SIGBUS, HDF5 with a segfault while closing a file whose flush failed. In a child, only the child
    goes; the caller gets one line.
    """
    receiver, sender = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.Process(target=_write_split, name=f"pack-{split}",
                                    args=(write, file, store, convert, workers, on_error, split, sender))
    child.start()
    sender.close()  # the child holds the only sending end: its death reads as EOF here
    try:
        outcome = receiver.recv()
    except EOFError:
        outcome = None
    except BaseException:
        child.kill()
        raise
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join()
    if outcome is not None and outcome[0] == "ok":
        return outcome[1], outcome[2]
    if outcome == ("interrupted",):
        raise KeyboardInterrupt
    if outcome is not None:
        error = outcome[1]
        raise type(error)(f"pack failed, nothing written: {error}")
    died = f"signal {signal.Signals(-child.exitcode).name}" if child.exitcode < 0 else f"exit code {child.exitcode}"
    raise ClearError(f"pack failed, nothing written: the {format} writer of {file.name} died ({died}; "
                     f"{disk_space(file)})")


class Converted(Dataset):
    """The files at `paths` through `convert`, in order: an unreadable one as the exception it raised."""

    def __init__(self, paths: list[Path], convert: Convert):
        self.paths, self.convert = paths, convert

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        return self.convert(self.paths[index])


def as_is(item):
    """The DataLoader's collate for single items, which would otherwise turn arrays into tensors."""
    return item


def _write_split(write, file: Path, store, convert: Convert, workers: int, on_error: str, split: str,
                 sender) -> None:
    """The child's side of write_split: convert with `workers` processes, write, send the outcome, and leave
    without running any finalizer (a native library's, after a failed write, is what crashes)."""
    kept, skipped = 0, []
    order = write_order(len(store), split)

    def records(payloads):
        nonlocal kept
        for index, payload in zip(order, tqdm(payloads, total=len(store), desc=f"pack {split}", unit="img",
                                              mininterval=2)):
            if isinstance(payload, Exception):
                if on_error == "raise":
                    raise ConfigError(f"unreadable image {store.paths[index]}: {payload}")
                log.warning("leaving out unreadable image %s: %s", store.paths[index], payload)
                skipped.append(str(store.paths[index]))
                continue
            kept += 1
            yield payload, int(store.labels[index])

    # A DataLoader rather than a multiprocessing.Pool: when the write fails, its workers can be killed
    # outright, where Pool.terminate() can wait forever for a result a worker was half-way through sending.
    converted = DataLoader(Converted([store.paths[index] for index in order], convert), batch_size=None, num_workers=workers,
                           collate_fn=as_is, prefetch_factor=8 if workers else None)
    try:
        write(file, records(converted))
        outcome = ("ok", kept, skipped)
    except ClearError as err:
        outcome = ("error", err)
    except KeyboardInterrupt:
        outcome = ("interrupted",)
    except Exception as err:  # noqa: BLE001 - every library reports a failed write its own way
        failures.log_traceback(err)
        outcome = ("error", ClearError(f"writing {file} failed: {str(err).splitlines()[0][:300]} "
                                       f"({disk_space(file)})"))
    failures.end_workers()
    sender.send(outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
