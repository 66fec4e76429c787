"""Copy the data set into RAM before training, or a pixel pack into the device's memory: `staging=none|tmpfs|device`.

Pick `tmpfs` when the data sits on a network or spinning disk and fits in memory: after one copy, every
epoch reads from RAM. The first local process of each node copies while the others wait; a copy whose
manifest (every file's size, mtime, ctime and inode) still matches the source is reused, not copied again: a file
rewritten since, even at its old size with its old mtime put back, has a new ctime.

Pick `device` for a pack of decoded pixels (format=tensor) that fits in the device's memory beside the model: the
batches are made there, with no loader worker (data/resident.py).
"""
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import psutil
import torch

from ..contracts import Layout, Order, Staging, Stores
from ..core.errors import ConfigError
from ..core.distributed import World
from ..core.files import bytes_in

log = logging.getLogger(__name__)

MANIFEST = ".staged.json"
GIB = 1 << 30


def manifest(root: Path) -> dict[str, list[int]]:
    """[size, mtime, ctime (ns) and inode] of every file under root, by relative path."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            stat = path.stat()
            found[path.relative_to(root).as_posix()] = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
    return found


def no_staging(path: Path) -> Path:
    return path


class TmpfsStaging:
    """Stage a folder (a JPEG tree or a packed data set) under `dir`, refusing when it would not fit."""

    def __init__(self, dir: str, reserve_gb: float, world: World):
        self.dir, self.reserve, self.world = Path(dir).expanduser(), int(reserve_gb * GIB), world

    def __call__(self, source: Path) -> Path:
        source = source.resolve()
        digest = hashlib.sha1(str(source).encode()).hexdigest()[:8]
        target = self.dir / f"{source.name}-{digest}"
        error = ""
        if self.world.local_rank == 0:
            try:
                self.copy(source, target)
            except (ConfigError, OSError) as err:
                error = str(err)
        # Every rank learns whether its node's copy worked, so none waits forever on a failed one.
        failed = self.world.sum(torch.tensor([int(bool(error))], device=self.world.device))
        if error:
            raise ConfigError(f"staging=tmpfs: {error}")
        if int(failed.item()):
            raise ConfigError("staging=tmpfs: the copy failed on another process; its log says why")
        return target

    def copy(self, source: Path, target: Path) -> None:
        wanted = manifest(source)
        staged = target / MANIFEST
        if staged.exists() and json.loads(staged.read_text()) == wanted:
            log.info("staging=tmpfs: reusing %s (manifest matches %s)", target, source)
            return
        needed = sum(size for size, *_ in wanted.values())
        self.dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.dir).free + (bytes_in(target) if target.exists() else 0)
        available = psutil.virtual_memory().available
        if needed > free:
            raise ConfigError(f"{source} needs {needed / GIB:.2f} GiB and {self.dir} has {free / GIB:.2f} GiB "
                              "free; pick a larger staging.dir or mount a bigger tmpfs (scripts/stage_tmpfs.sh)")
        if needed + self.reserve > available:
            raise ConfigError(f"{source} needs {needed / GIB:.2f} GiB of RAM plus staging.reserve_gb="
                              f"{self.reserve / GIB:g} and {available / GIB:.2f} GiB is available")
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
        log.info("staging=tmpfs: copying %.2f GiB from %s to %s", needed / GIB, source, target)
        try:
            shutil.copytree(source, partial, dirs_exist_ok=False)
            (partial / MANIFEST).write_text(json.dumps(wanted))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)  # a full tmpfs is RAM taken from everything else
            raise
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)  # a copy cut short never carries the name training reads


class DeviceStaging:
    """staging=device: the pack is read where it is, and held in the device's memory by the batches it makes
    (data/resident.py), with `reserve_gb` left free beside it."""

    def __init__(self, reserve_gb: float):
        self.reserve_gb = reserve_gb

    def __call__(self, source: Path) -> Path:
        return source

    def loaders(self, stores: Stores, train_crop, val_crop, world: World, batch_size: int, seed: int, order: Order,
                layout: Layout):
        """The training and validation batches of the pixel pack `stores`, made on `world.device`."""
        from .resident import device_loaders
        return device_loaders(stores, train_crop, val_crop, world, batch_size, seed, order, layout, self.reserve_gb)


def none(world: World) -> Staging:
    return no_staging


def tmpfs(dir: str, reserve_gb: float, world: World) -> Staging:
    return TmpfsStaging(dir, reserve_gb, world)


def device(reserve_gb: float, world: World) -> Staging:
    return DeviceStaging(reserve_gb)
