"""Checkpoints and other run files, written atomically: a crash or a full disk never leaves half a file."""
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from .config import ClearError, ConfigError
from .distributed import World

log = logging.getLogger(__name__)


LAST = "last.pt"  # the checkpoint every epoch overwrites, and the one resume=auto looks for


class WriteError(ClearError):
    """A run file could not be written (a full disk, say); the previous version is intact."""


# How torch.save reports a failed write: a RuntimeError from its C++ stream writer, not an OSError.
WRITE_FAILED = re.compile(r"inline_container|PytorchStreamWriter|file write failed|basic_ios|iostream error")


def free_bytes(path: Path) -> int:
    """Free space on the disk that holds `path`, or would once it is made."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def bytes_in(path: Path) -> int:
    """A file's size, or the sum of a folder's files."""
    return path.stat().st_size if path.is_file() else sum(file.stat().st_size for file in path.rglob("*")
                                                          if file.is_file())


def disk_space(path: Path) -> str:
    """The free space beside `path`, as a failed write's message gives it."""
    free = free_bytes(path) / 2**20
    return f"{free:.1f} MiB free on its disk{': it is full' if free < 1 else ''}"


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """write(temporary path), then rename over `path`, which readers therefore see whole or not at all."""
    temporary = path.with_name(f".{path.name}.partial-{os.getpid()}")  # ranks may race
    try:
        write(temporary)
        os.replace(temporary, path)
    except (OSError, RuntimeError) as err:
        temporary.unlink(missing_ok=True)
        if isinstance(err, RuntimeError) and not WRITE_FAILED.search(str(err)):
            raise  # not a write that failed: a bug
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0]
        raise WriteError(f"could not write {path}: {reason} ({disk_space(path)}); any earlier {path.name} is "
                         "intact") from err


def save(state: dict, path: Path) -> None:
    write_atomic(path, lambda temporary: torch.save(state, temporary))


class Checkpoints:
    """last.pt in the run folder, written by the main process only; the other ranks hold the same weights."""

    def __init__(self, run_dir: Path, writes: bool):
        self.path, self.writes = run_dir / LAST, writes
        self.saved_step = -1  # the step of the last checkpoint written or resumed from; -1: none yet

    def save(self, state: dict) -> None:
        if self.writes:
            save(state, self.path)
        self.saved_step = state["step"]


def find(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: None, 'auto' (last.pt in the run folder, if any) or a path."""
    if resume is None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0:
        resume = "auto"  # torchrun restarted the workers: carry on from this run folder's checkpoint
    if resume is None:
        return None
    if resume == "auto":
        path = run_dir / LAST
        if not path.is_file():
            log.info("resume=auto: no %s yet, starting from scratch", path)
            return None
        return path
    path = Path(resume).expanduser()
    if not path.is_file():
        raise ConfigError(f"resume={resume}: no such checkpoint file")
    return path


def load(path: Path, device: torch.device) -> dict:
    try:
        return torch.load(path, map_location=device)
    except Exception as err:  # torch raises RuntimeError, EOFError or UnpicklingError for a damaged file
        raise ConfigError(f"resume: {path} is not a readable checkpoint ({err.__class__.__name__}: {err})") from err


def check_fits(state: dict, model: torch.nn.Module, path: Path, identity: dict) -> None:
    """Refuse, before anything loads, a checkpoint whose weights do not fit the model this run builds."""
    mine, theirs = model.state_dict(), state["model"]
    differ = sorted(name for name in mine.keys() | theirs.keys()
                    if name not in mine or name not in theirs or mine[name].shape != theirs[name].shape)
    if differ:
        saved = state.get("identity")
        held = f"{saved['model']} with {saved['classes']} classes" if saved else "another model"
        raise ConfigError(f"resume={path} holds {held}, and this run builds {identity['model']} with "
                          f"{identity['classes']} classes: {len(differ)} tensors differ ({', '.join(differ[:3])}"
                          f"{', ...' if len(differ) > 3 else ''}); resume from a checkpoint of this model, or set "
                          "model.name to the checkpoint's")


def resume_state(resume: str | None, run_dir: Path, world: World) -> tuple[Path | None, dict | None]:
    """find() and load() in every process of `world`, all of which must arrive at the same step.

    They would not where the nodes of a torchrun job each see a run folder of their own: one would resume,
    another start afresh, and their collectives would no longer match.
    """
    path = find(resume, run_dir)
    state = load(path, world.device) if path else None
    step = state["step"] if state else -1  # -1: starting from scratch
    if world.max(step) != -world.max(-step):
        raise ConfigError(f"the processes of this job found different checkpoints to resume from (this one: "
                          f"{path or 'none'}); on several nodes the run folder ({run_dir}) must be on storage "
                          "that all of them share")
    return path, state
