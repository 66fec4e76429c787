"""The run's contracts: what a checkpoint holds, how a model's inputs are prepared, the model option, and where the
loop's figures and profiles go; and the export targets' contract."""
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch


class Stateful(Protocol):
    """A part of what a checkpoint holds, which saves and restores itself (loop/run.py: `Run.parts`). It is the protocol
    of torch.distributed.checkpoint, which modules, optimizers and schedulers already keep; a state is a dict of
    tensors, numbers, strings and lists, which torch.save writes and torch.load reads back without pickled classes."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Preprocessing:
    """An image as a model's input: its shorter side resized to `resize`, the centre `crop_size` square cut (training
    cuts random crops of that side), then each channel normalised as (x / 255 - mean) / std."""
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    crop_size: int
    resize: int


@dataclass(kw_only=True)
class Pretrained:
    """Weights as they were loaded: the model at the weights' own class count, and the preprocessing they were
    trained with, where the weights say."""
    model: torch.nn.Module
    classes: int
    preprocessing: Preprocessing | None


class Network(ABC):
    """A `model` option: an architecture by name and its library's weights (files and heads: loop/model/__init__.py)."""
    name: str
    weights: str | None  # model.weights: a name the library knows, or a local file; None: random
    num_classes: int  # 0: the data's

    @abstractmethod
    def architecture(self, classes: int) -> torch.nn.Module:
        """The model with `classes` outputs, randomly initialised."""

    @abstractmethod
    def library_weights(self) -> Pretrained:
        """The weights model.weights names in the library's words, which it downloads once, into its cache."""


class Exporter(Protocol):
    """An export target (conf/export/target/), a file format: writes a model for batches like `example`; loads the file
    back to run."""
    suffix: str

    def write(self, model: torch.nn.Module, example: torch.Tensor, path: Path) -> None: ...
    def load(self, path: Path) -> Callable[[torch.Tensor], torch.Tensor]: ...


@dataclass(frozen=True, kw_only=True)
class Axis:
    """An x axis other than the step, for figures plotted against it (validation's top-1 against the run's seconds):
    the figure it is and its value at this point."""
    tag: str
    value: float


# How a run ended, as its logger is told at `close`: its epochs (or train.max_steps) done; a failure; or a stop request
# (a preemption's SIGTERM, a Ctrl-C) that ended it with a checkpoint saved, from which `resume=auto` carries on.
Outcome = Literal["finished", "failed", "stopped"]


class Logger(Protocol):
    """Where each logging window's figures go. Each figure is at the run's step (its optimizer steps so far), the x
    axis they all share, unless the call gives an `axis` of its own, which each logger draws as its tracker charts
    one, never as the step. Several calls may come at one step (the window's, the ranks', validation's); every
    figure of each is kept. A write that fails raises `core.files.WriteError`, naming the file; `close` runs on every
    way out of the run, a failure's included, marks the tracker's run as it ended (`Outcome`), and logs what it
    cannot write instead."""

    def scalars(self, values: dict[str, float], step: int, axis: Axis | None = None) -> None: ...

    def close(self, outcome: Outcome) -> None: ...


class Profiler(Protocol):
    """A context manager around the training epochs, told of every step."""

    def __enter__(self) -> "Profiler": ...
    def __exit__(self, *exc) -> None: ...
    def step(self) -> None: ...


class Schedule(Protocol):
    """A learning-rate schedule (conf/schedule/), built with the run's train.epochs: the factor of the peak learning
    rate at `position`, the run's place in epochs (epochs done plus the share of this epoch's images trained), the
    same on any number of processes."""

    def factor(self, position: float) -> float: ...
