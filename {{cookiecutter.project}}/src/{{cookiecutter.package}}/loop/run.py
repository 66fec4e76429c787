"""The run: everything the loop touches, built once before it, and what a checkpoint of it holds (`Run.parts`)."""
import logging
from collections.abc import Callable
from dataclasses import asdict, astuple, dataclass, field

import torch

from ..contracts import Logger, Profiler, Stateful
from ..core import distributed
from ..core.distributed import World
from ..core.files import WriteError
from ..core.forensics import Forensics
from ..core.hardware import Hardware
from ..data.coverage import NO_RECORD, Coverage, EpochRecord
from ..data.loaders import Loaders
from ..diagnosis.sysmon import SystemMonitor
from .accumulate import GradientAccumulation
from .accuracy import TimeToAccuracy
from .average import WeightAverage
from .checkpoint import Checkpoints
from .clock import Clock, Window
from .draws import BatchSeeds
from .freeze import FrozenBackbone
from .meter import TrainMeter
from .mix import BatchMix
from .precision import NonFiniteLoss, Precision
from .preempt import StopRequest
from .schedule import LearningRate

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Progress:
    """Where the run stands: the epochs it finished, the optimizer steps it took, and the images of the current epoch
    all processes together trained on."""
    epoch: int = 0
    step: int = 0
    images_in_epoch: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.step, self.images_in_epoch = state["epoch"], state["step"], state["images_in_epoch"]


class WindowLog(list):
    """Every logging window's timing split and system figures, `(Window, figures)` in order, the windows of the runs
    this one resumed first: what the report sums."""
    resumed = 0  # of them, those of the runs this one resumed

    def state_dict(self) -> dict:
        return {"windows": [(asdict(window), system) for window, system in self]}

    def load_state_dict(self, state: dict) -> None:
        self[:] = [(Window(**window), system) for window, system in state["windows"]]
        self.resumed = len(self)


@dataclass
class AtProgress:
    """A checkpoint part whose state is asked at the run's progress rather than read from the part: the training loader
    reads ahead of the step, and the coverage record hears of the other processes only at each window."""
    save: Callable[[Progress], dict]
    load: Callable[[dict], None]
    progress: Progress

    def state_dict(self) -> dict:
        return self.save(self.progress)

    def load_state_dict(self, state: dict) -> None:
        self.load(state)


@dataclass(frozen=True, kw_only=True)
class Limits:
    """How far the run goes and how often it reports, as train.* sets them."""
    log_every: int  # optimizer steps per logging window
    max_steps: int | None  # where this command stops; None: at the last epoch
    limit_val_batches: int | None  # the batches each validation scores; None: all of them
    clip_grad_norm: float  # the largest total gradient norm a step applies; 0: no clipping


@dataclass(kw_only=True)
class Weights:
    """The model that trains, which of its layers train in each epoch, and the weights validation scores."""
    model: torch.nn.Module  # wrapped for DDP and compiled where asked
    freeze: FrozenBackbone  # which layers train in each epoch: all, or the head alone at a fine-tune's start
    average: WeightAverage  # the weights validation scores: a moving average of the live ones, or those


@dataclass(kw_only=True)
class Optimization:
    """What turns a batch into an optimizer step, in the order the step uses them."""
    seeds: BatchSeeds  # seeds the step's draws before each batch
    mix: BatchMix  # mixup and CutMix of each training batch, or nothing
    criterion: torch.nn.Module
    accumulation: GradientAccumulation  # how many batches' gradients make an optimizer step
    optimizer: torch.optim.Optimizer
    learning_rate: LearningRate  # the schedule's, set before each optimizer step


@dataclass(kw_only=True)
class Run:
    """Everything the loop touches, built once before it: its parts, the services around them, and its progress."""
    weights: Weights
    optimization: Optimization
    precision: Precision
    loaders: Loaders
    limits: Limits
    clock: Clock
    meter: TrainMeter
    sysmon: SystemMonitor
    logger: Logger
    profiler: Profiler
    checkpoints: Checkpoints
    stop: StopRequest
    forensics: Forensics
    world: World
    hardware: Hardware
    coverage: Coverage  # each epoch's check that it trained every image once
    accuracy: TimeToAccuracy  # the seconds from the run's start to each top-1 level its validations reached
    progress: Progress = field(default_factory=Progress)
    windows: WindowLog = field(default_factory=WindowLog)
    setup: dict[str, float] = field(default_factory=dict)  # this run's seconds before its first step, by stage
    records: list[EpochRecord | None] = field(default_factory=list)  # every process's, at the last window
    updating: bool = False  # inside train.py's step(): the weights may be ahead of the step count

    @property
    def device(self) -> torch.device:
        return self.world.device

    @property
    def out_of_steps(self) -> bool:
        return self.limits.max_steps is not None and self.progress.step >= self.limits.max_steps

    def share_window(self, window: Window) -> tuple[list[Window], bool]:
        """Every rank's split of a logging window, and whether any rank was asked to stop: the window's one
        collective, a small all-reduce after the window's device sync. It also carries each rank's record of the
        epoch so far (`records`), which the epoch's last window checks."""
        trace = self.loaders.train.coverage()
        record = trace.record(self.progress.images_in_epoch).row() if trace else NO_RECORD
        rows = self.world.gather([float(self.stop.asked), *record, *astuple(window)])
        self.records = [EpochRecord.from_row(row[1:1 + EpochRecord.WIDTH]) for row in rows]
        self.coverage.window(self.records, self.progress.images_in_epoch)
        return [Window.from_row(row[1 + EpochRecord.WIDTH:]) for row in rows], any(row[0] for row in rows)

    def check_coverage(self) -> None:
        """At an epoch's end, after its last window: every image once, the left-out ones aside, or stop the run."""
        trace = self.loaders.train.coverage()

        def counts():  # only where the records do not add up: which images were missed and doubled
            mine = torch.from_numpy(trace.counts(self.coverage.size)).to(self.device)
            return self.world.sum(mine).cpu().numpy()

        entry = self.coverage.check(self.records, trace, counts)
        if entry["checked"]:
            log.info("epoch %d trained each of its %d images once across %d process%s (%d left out)",
                     self.progress.epoch, entry["images"] - entry["left_out"], entry["processes"],
                     "es" if entry["processes"] > 1 else "", entry["left_out"])

    def parts(self) -> dict[str, Stateful]:
        """What a checkpoint of the run holds, by key: each part saves and restores itself (loop/checkpoint.py)."""
        train, progress = self.loaders.train, self.progress
        return {"model": distributed.unwrap(self.weights.model), "optimizer": self.optimization.optimizer,
                "scaler": self.precision, "progress": progress,
                "loader": AtProgress(lambda at: train.state(at.epoch, at.images_in_epoch), train.load_state, progress),
                "unreadable": self.loaders.splits,
                "coverage": AtProgress(lambda at: self.coverage.state_dict(at.images_in_epoch, train.coverage()),
                                       self.coverage.load_state_dict, progress),
                "windows": self.windows, "accuracy": self.accuracy, "ema": self.weights.average}


def keep_progress(run: Run, err: BaseException) -> None:
    """After a failure that left the weights sound, save the last completed step, and tell the error where
    `resume=auto` will carry on from. A non-finite loss, or a failure in the middle of an update, keeps the
    last good checkpoint instead."""
    sound = not (run.updating or isinstance(err, (NonFiniteLoss, KeyboardInterrupt)))
    if sound and run.progress.step > run.checkpoints.saved_step:
        try:
            run.checkpoints.save(run.parts())
        except WriteError as unsaved:
            log.error("the run failed, and saving its last step failed too: %s", unsaved)
    if run.checkpoints.writes and run.checkpoints.saved_step >= 0:
        err.resume_step = run.checkpoints.saved_step
