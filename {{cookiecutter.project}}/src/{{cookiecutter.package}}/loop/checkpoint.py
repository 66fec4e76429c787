"""Checkpoints, written atomically (files.write_atomic): a crash or a full disk never leaves half a file.

Each one holds, beside the weights and the training state, what using the model needs (`Inference`): the class
names, the preprocessing and the model option's settings, so evaluate, predict and export read nothing else.
"""
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..contracts import Preprocessing, Stateful
from ..core.errors import ConfigError
from ..core.distributed import World
from ..core.files import write_atomic

log = logging.getLogger(__name__)


LAST = "last.pt"  # the checkpoint every epoch overwrites, and the one resume=auto looks for
BEST = "best.pt"  # the checkpoint of the epoch with the best validation top-1 so far


@dataclass(frozen=True, kw_only=True)
class Inference:
    """What using a checkpoint's model needs beside its weights: the data's class names (in the order of the
    outputs), how its inputs were prepared, and the model option's node, to build the architecture again."""
    classes: list[str]
    preprocessing: Preprocessing
    model: dict

    def state_dict(self) -> dict:
        return {"classes": list(self.classes), "preprocessing": asdict(self.preprocessing), "model": self.model}

    @classmethod
    def from_state(cls, state: dict) -> "Inference":
        held = state["preprocessing"]
        return cls(classes=list(state["classes"]), model=dict(state["model"]),
                   preprocessing=Preprocessing(mean=tuple(held["mean"]), std=tuple(held["std"]),
                                               crop_size=held["crop_size"], resize=held["resize"]))


def write(state: dict, path: Path) -> None:
    # Through a Python file, so that a failed write keeps its OSError (ENOSPC, EIO): from a path, torch's C++ writer
    # reports only "unexpected pos".
    with path.open("wb") as file:
        torch.save(state, file)


def save(state: dict, path: Path) -> None:
    write_atomic(path, lambda temporary: write(state, temporary))


def save_as(state: dict, path: Path, written: Path) -> None:
    """`state`, which `written` already holds, at `path` too: as a hard link to `written` where its file system has
    them, so the bytes are neither written nor stored twice. The next save of `written` renames a new file over it,
    which leaves the linked one as it was."""
    def link(temporary: Path) -> None:
        try:
            os.link(written, temporary)
        except OSError:  # a file system without hard links (some network and FUSE mounts): a second copy
            write(state, temporary)

    write_atomic(path, link)


class Checkpoints:
    """last.pt in the run folder, and best.pt beside it, written by the main process only; the other ranks hold the
    same weights. Each holds the state of every part of the run (`Run.parts`), by the part's key, and beside them what
    the checkpoint is of: `identity` (the model's name and classes, which a resume checks first) and `inference`."""

    def __init__(self, run_dir: Path, writes: bool, identity: dict, inference: Inference):
        self.path, self.best_path, self.writes = run_dir / LAST, run_dir / BEST, writes
        self.identity, self.inference = identity, inference
        self.saved_step = -1  # the step of the last checkpoint written or resumed from; -1: none yet
        self.best_top1 = -1.0  # the best validation top-1 saved so far, which a resumed run carries on from

    def save(self, parts: dict[str, Stateful], top1: float | None = None) -> None:
        """last.pt; best.pt too where `top1`, the parts' validation top-1, beats every one before it."""
        better = top1 is not None and top1 > self.best_top1
        self.best_top1 = top1 if better else self.best_top1
        state = {**{key: part.state_dict() for key, part in parts.items()}, "identity": self.identity,
                 "inference": self.inference.state_dict(), "best_top1": self.best_top1}
        if self.writes:
            save(state, self.path)
            if better:
                save_as(state, self.best_path, written=self.path)
        self.saved_step = step_of(state)

    def restore(self, parts: dict[str, Stateful], state: dict) -> None:
        """Each part from its key in `state`; a part the checkpoint lacks (one written before the part existed, such
        as an average turned on at the resume) keeps its fresh start."""
        for key, part in parts.items():
            if key in state:
                part.load_state_dict(state[key])
        self.best_top1 = state.get("best_top1", self.best_top1)
        self.saved_step = step_of(state)


def step_of(state: dict) -> int:
    """The optimizer steps a checkpoint's run had taken."""
    return state["progress"]["step"]


def find(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: None, 'auto' (last.pt in the run folder, if any) or a path. A torchrun job,
    and a Slurm job that Slurm requeued, resume by themselves."""
    if resume is None and (int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0
                           or int(os.environ.get("SLURM_RESTART_COUNT", 0)) > 0
                           or run_dir.name == f"torchrun-{os.environ.get('TORCHELASTIC_RUN_ID')}"):
        # torchrun restarted the workers, Slurm requeued the job (hydra/launcher=slurm runs it again in the same
        # folder), or this node joined its job again (a node that replaces a failed one counts restarts from 0):
        # carry on from the checkpoint in the run's folder.
        resume = "auto"
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


def load(path: Path, device: torch.device, key: str = "resume") -> dict:
    """The checkpoint at `path`; `key`: the setting that named it, for the line that refuses a damaged file."""
    try:
        return torch.load(path, map_location=device)
    except Exception as err:  # torch raises RuntimeError, EOFError or UnpicklingError for a damaged file
        raise ConfigError(f"{key}: {path} is not a readable checkpoint ({err.__class__.__name__}: {err})") from err


def load_trained(checkpoint: str, device: torch.device) -> tuple[dict, Inference]:
    """A checkpoint to use the model of (`checkpoint=` of evaluate, predict and export), and what it says about it."""
    path = Path(checkpoint).expanduser()
    if not path.is_file():
        raise ConfigError(f"checkpoint={checkpoint}: no such file; pass the last.pt or best.pt of a run folder")
    state = load(path, device, "checkpoint")
    if not isinstance(state, dict) or "inference" not in state:
        raise ConfigError(f"checkpoint={checkpoint} holds no class names or preprocessing: it was written before "
                          "checkpoints kept them, or by another program; train again, or fine-tune from its weights "
                          f"with model.weights={checkpoint}")
    return state, Inference.from_state(state["inference"])


def validated_weights(state: dict) -> dict:
    """The weights a run's validation scored, and so the ones to use: the moving average where the run kept one
    (train.ema_decay), else the model's."""
    return state.get("ema", {}).get("weights") or state["model"]


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
    if state is not None and not (isinstance(state, dict) and "progress" in state):  # not a run's parts by key
        raise ConfigError(f"resume={path} holds no run progress: an older version of the project or another program "
                          f"wrote it; start a fresh run, or fine-tune from its weights with model.weights={path}")
    step = step_of(state) if state else -1  # -1: starting from scratch
    if world.max(step) != -world.max(-step):
        raise ConfigError(f"the processes of this job found different checkpoints to resume from (this one: "
                          f"{path or 'none'}); on several nodes the run folder ({run_dir}) must be on storage "
                          "that all of them share")
    return path, state
