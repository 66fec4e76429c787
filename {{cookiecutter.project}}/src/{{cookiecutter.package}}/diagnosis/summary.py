"""summary.json, one finished run's figures: written once by train.py (`Summary.write`), and read by tune, compare,
gpu_check and scripts/accuracy.py through `Summary.read` alone. The fields below are its schema, each with its unit.

The timings are those of one process, the one the others waited for (`timing_rank`), over every logging window but
the first (worker start-up, allocator warm-up) where the run had more than one; seconds from the run's start count its
set-up, and those of the runs it resumed.
"""
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from ..core.errors import ClearError
from ..core.files import write_atomic


@dataclass(kw_only=True)
class Summary:
    # The run
    overrides: list[str]  # the command line's overrides
    choices: dict[str, str]  # config group -> option
    # Where the time went
    images_per_s: float  # training images a second, per process
    data_ms: float  # per step: waiting for the next batch
    host_ms: float  # per step: the GPU idle with its batch ready (0 on a CPU, where the step runs on the host)
    compute_ms: float  # per step: the rest
    data_frac: float  # data_ms's share of the step, 0..1
    host_frac: float  # host_ms's share of the step, 0..1
    data_cost: float  # the share of the step loading costs, 0..1: on a CPU, also the cores the workers take from it
    bound: str  # data | host | compute: what to fix first
    verdict: str  # one sentence, naming the measurement behind it
    advice: list[str]  # the suggestions' lines, as the report prints them
    suggestions: list[dict]  # diagnosis.advice.Suggestion records: key, value, also, side, why, fact, tunable
    withheld: list[dict]  # the suggestions this machine would run slower, with why
    # On what
    hardware: dict  # core.hardware.Hardware's record: the device and CPU facts the advice read
    system: dict[str, float]  # sys/ figures: CPU and disk load, the loader's read and decode shares
    env: dict[str, str]  # library versions, the device and the core count
    # What it learned
    val_top1: float  # the last validation's top-1, percent
    val_top5: float | None  # percent; None with 5 classes or fewer
    classes: int
    # absent from the summaries older versions wrote, which compare still reads
    train_top1: float | None = None  # percent, on the last epoch's training batches; None before an epoch ended
    time_to_top1_s: dict[str, float] = field(default_factory=dict)  # each train.top1_levels reached -> seconds
    best_top1: dict = field(default_factory=dict)  # top1 (percent), at_s (seconds) and epoch of the best validation
    # How it ran
    steps: int  # optimizer steps in all, those of the runs it resumed included
    skipped_files: int  # unreadable images met, each counted once
    skipped_steps: int  # steps the fp16 loss scaler skipped
    processes: int
    timing_rank: int  # the process whose timings these are
    ranks: list[dict]  # every process's shares: rank, host, data_frac, host_frac, compute_frac, images_per_s
    epoch_start_ms: list[float]  # each epoch: the wait for its first batch, those of the runs it resumed included
    coverage: list[dict]  # each epoch's check that it trained every image once (data/coverage.py)
    setup: dict[str, float]  # seconds before the first step, by stage: total_s, data_s, workers_s, first_batch_s

    def write(self, path: Path) -> None:
        write_atomic(path, lambda temporary: temporary.write_text(json.dumps(asdict(self), indent=2)))

    @classmethod
    def read(cls, path: Path, needs: tuple[str, ...] | None = None) -> "Summary":
        """The summary.json at `path`; one line naming the file and what it lacks where it lacks a field the reader
        `needs` (every field without a default, unless the reader names fewer). A reader that names fewer reads files
        older versions wrote: a field such a file lacks is None."""
        try:
            held = json.loads(path.read_text())
        except ValueError as err:
            raise ClearError(f"{path} is not JSON ({err})") from err
        required = [key.name for key in fields(cls) if key.default is MISSING and key.default_factory is MISSING]
        missing = [name for name in (required if needs is None else needs) if name not in held]
        if missing:
            raise ClearError(f"{path} has no {', '.join(missing)}: it comes from an older version of the project")
        return cls(**{name: None for name in required} | {key.name: held[key.name] for key in fields(cls)
                                                              if key.name in held})

    def figures(self) -> dict[str, float]:
        """The timing split, named as a logging window's figures are (tools/trials.py): what tune's and gpu_check's
        tables show."""
        return {"images_per_s": self.images_per_s, "data_frac": self.data_frac, "host_frac": self.host_frac,
                "data_ms": self.data_ms, "host_ms": self.host_ms, "compute_ms": self.compute_ms}
