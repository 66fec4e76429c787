"""The staging options as bench times them: each copy made from scratch into a folder of bench's own, its
seconds beside the loader's rate, and the folder removed at the end."""
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

from ... import options
from ...contracts import Staging, Stores
from ...core.config import build
from ...core.distributed import ALONE


@contextmanager
def stagings(names: list[str]) -> Iterator[dict[str, tuple[Staging, bool]]]:
    """Each staging option by name, and whether it copies into RAM."""
    built, scratch = {}, []
    for name in names:
        node = OmegaConf.load(options.CONF / "staging" / f"{name}.yaml")
        copies = options.facts("staging", name).copies_to_ram
        if copies:  # a folder of its own: the copy is timed from scratch, and nothing of it stays in RAM
            node["dir"] = f"{node.dir}-bench-{os.getpid()}"
            scratch.append(Path(node.dir).expanduser())
        built[name] = build(node, world=ALONE), copies
    try:
        yield built
    finally:
        for folder in scratch:
            shutil.rmtree(folder, ignore_errors=True)


def timed_staging(read: Callable[..., Stores], stage: Staging, copies: bool) -> tuple[Stores, float | str]:
    """`read(stage=stage)`, and the seconds its copy took ("" where it copies nothing); any pack is written already."""
    start = time.perf_counter()
    stores = read(stage=stage)
    return stores, (time.perf_counter() - start if copies else "")


def counted(staging_s: float | str, images: int, rate: float, epochs: int) -> str:
    """A staged row's rate with its copy counted, over the timed epochs."""
    if staging_s == "" or not rate:
        return ""
    return (f"copied in {staging_s:.1f} s; with the copy, over {epochs} epochs: "
            f"{images * epochs / (staging_s + images * epochs / rate):.0f} images/s")
