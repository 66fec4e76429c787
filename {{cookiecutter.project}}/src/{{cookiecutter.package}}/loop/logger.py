"""Where the per-window numbers go: TensorBoard, a CSV table (`logger=csv`), Weights & Biases (`logger=wandb`), MLflow
(`logger=mlflow`), JSON lines (`logger=jsonl`), or nowhere (`logger=none`); each a `Logger` (contracts/), which keeps
every figure it is given and draws a figure given an `Axis` against that axis, as its tracker charts one. W&B and
MLflow mark their run as it ended (`Outcome`); the files keep no such mark."""
import csv
import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..contracts import Axis, Logger, Outcome
from ..core.errors import ConfigError
from ..core.files import WriteError, write_atomic, write_failure, writing

log = logging.getLogger(__name__)

# The three parts of each step on one chart, under TensorBoard's Custom Scalars tab.
LAYOUT = {
    "where the time goes": {
        "data stall, host overhead, compute (ms per step)": [
            "Multiline", ["time/data_ms", "time/host_ms", "time/compute_ms"]],
        "share of time the device was idle: waiting for data, for the host": [
            "Multiline", ["time/data_frac", "time/host_frac"]],
        "throughput (images/s)": ["Multiline", ["throughput/images_per_s"]],
        "several processes: the highest and lowest rank's share of time waiting for data": [
            "Multiline", ["ranks/data_frac_max", "ranks/data_frac_min"]],
        "several processes: the rank whose device idled most": ["Multiline", ["ranks/slowest"]],
    },
}


class NullLogger:
    """Logs nothing: `logger=none`, and every process but the first."""

    def scalars(self, values: dict[str, float], step: int, axis: Axis | None = None) -> None:
        pass

    def close(self, outcome: Outcome) -> None:
        pass


@contextmanager
def closing(path: Path) -> Iterator[None]:
    """Around a logger's close, which runs on every way out of the run, a failure's included: a last write that fails
    is logged, not raised over the failure on its way out."""
    try:
        yield
    except OSError as err:
        log.error("could not write %s: %s", path, write_failure(path, err))


def row(values: dict[str, float], step: int, axis: Axis | None) -> dict[str, float]:
    """A call's figures as one row of a table, `step` first, and the axis's figure where the call gives one."""
    return {"step": step, **values, **({axis.tag: axis.value} if axis else {})}


class TensorBoardLogger:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        with writing(log_dir):
            self.writer = SummaryWriter(str(log_dir))
            self.writer.add_custom_scalars(LAYOUT)

    def scalars(self, values: dict[str, float], step: int, axis: Axis | None = None) -> None:
        # A TensorBoard chart plots one tag against that tag's own steps: a figure against another axis takes the
        # axis's values, rounded, as its steps, and no other tag shares them.
        at = step if axis is None else round(axis.value)
        # The writer's thread writes; a write it failed is raised here, at the next call.
        with writing(self.log_dir):
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, at)

    def close(self, outcome: Outcome) -> None:
        with closing(self.log_dir):
            self.writer.close()


class JsonLinesLogger:
    """One JSON object per call, `{"step": ..., tag: value, ...}`, flushed at once: for a program that follows a
    run while it goes, as tune does its trials. A call with an axis adds the axis's figure to its object."""

    def __init__(self, path: Path):
        self.path = path
        with writing(path):
            self.file = path.open("a")

    def scalars(self, values: dict[str, float], step: int, axis: Axis | None = None) -> None:
        with writing(self.path):
            self.file.write(json.dumps(row(values, step, axis)) + "\n")
            self.file.flush()

    def close(self, outcome: Outcome) -> None:
        with closing(self.path):
            self.file.close()


class CsvLogger:
    """One row per call (the window's, the ranks', validation's), `step` first and a column per figure: the wide table
    a spreadsheet or pandas.read_csv opens. A figure against another axis has the axis's figure beside it, in a
    column of its own (top-1 and `time/elapsed_s`), so `step` holds only steps. A figure first logged after the first
    window (validation's, at an epoch's end) widens the table, and the file is then written anew, whole, under a
    temporary name; otherwise each row is appended and flushed at once. A resumed run goes on after the rows its
    folder's file holds."""

    def __init__(self, path: Path):
        self.path, self.columns, self.rows = path, ["step"], []
        self.stale = True  # the file lacks rows or columns the table has: it is written anew at the next call
        with writing(path):
            if path.exists():
                with path.open(newline="") as file:
                    reader = csv.DictReader(file)
                    self.columns, self.rows = list(reader.fieldnames or ["step"]), list(reader)
            self.file = path.open("a", newline="")
            self.write_anew()

    def write_anew(self) -> None:
        """The whole table, under a temporary name renamed over the file; rows are appended to it after."""
        def write(temporary: Path) -> None:
            with temporary.open("w", newline="") as file:
                table = csv.DictWriter(file, self.columns)
                table.writeheader()
                table.writerows(self.rows)

        write_atomic(self.path, write)  # a failure raises WriteError, naming the file, and the table stays stale
        self.stale = False
        self.file.close()
        self.file = self.path.open("a", newline="")

    def scalars(self, values: dict[str, float], step: int, axis: Axis | None = None) -> None:
        line = row(values, step, axis)
        self.rows.append(line)
        new = [tag for tag in line if tag not in self.columns]
        self.columns += new
        self.stale = self.stale or bool(new)
        with writing(self.path):
            if self.stale:
                self.write_anew()
            else:
                csv.DictWriter(self.file, self.columns).writerow(line)
                self.file.flush()

    def close(self, outcome: Outcome) -> None:
        with closing(self.path):
            self.file.close()
        if self.stale:  # a write failed: one more try, and what is still missing is said, not raised
            try:
                self.write_anew()
                self.file.close()
            except WriteError as err:
                log.error("%s", err)


def kept_run_id(path: Path, new_id) -> str:
    """The id of the tracker's run this run folder started, kept in `path`; made by `new_id()` and kept there at the
    folder's first start, so that a resumed run, on any node, goes on in the same tracked run."""
    if path.is_file():
        return path.read_text().strip()
    run_id = new_id()
    write_atomic(path, lambda temporary: temporary.write_text(run_id))
    return run_id


class WandbLogger:
    """A Weights & Biases run whose files stay in the run folder (`wandb/`). `mode=auto` logs online where an API key
    is set (WANDB_API_KEY) and offline elsewhere, as on a cluster without internet: `wandb sync <run folder>/wandb`
    uploads it later. A resumed run goes on in the W&B run its folder started (its id kept in `wandb-run-id`).

    Each step is one row of the run's history, gathered from the calls at that step; a figure against another axis
    is charted against that axis's figure, which its row holds (define_metric's step_metric). The run ends with an
    exit code, which W&B reads as finished (0) or failed; a stopped run is marked preempting first, which W&B turns
    into preempted."""

    # A stopped run's code is that of a process ended by SIGTERM, as a preemption ends one.
    EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 128 + signal.SIGTERM}

    def __init__(self, run_dir: Path, project: str, mode: str):
        import wandb

        modes = ("auto", "online", "offline", "disabled")
        if mode not in modes:
            raise ConfigError(f"logger.mode={mode}: pick one of {', '.join(modes)}")
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        try:
            run_id = kept_run_id(Path(run_dir) / "wandb-run-id", lambda: secrets.token_hex(8))
            self.run = wandb.init(project=project, dir=str(run_dir), name=Path(run_dir).name, mode=mode, id=run_id,
                                  resume="allow", settings=wandb.Settings(console="off", silent=True))
        except wandb.errors.Error as err:  # no API key, no network: the run would log nowhere
            raise ConfigError(f"logger=wandb could not start a run in mode {mode} ({str(err).splitlines()[0]}): "
                              "pass logger.mode=offline, whose run wandb sync uploads later") from None
        self.against_axis: set[str] = set()  # the figures whose charts define_metric has given their axis

    def scalars(self, values: dict[str, float], step: int, axis: Axis | None = None) -> None:
        if axis is not None:
            for tag in values.keys() - self.against_axis:
                self.run.define_metric(tag, step_metric=axis.tag)
            self.against_axis |= values.keys()
            values = {**values, axis.tag: axis.value}
        # Not committed: W&B ignores a figure logged at a step it has written, so the step's row waits for the other
        # calls at that step and is written when a later step, or the run's end, comes.
        self.run.log(values, step=step, commit=False)

    def close(self, outcome: Outcome) -> None:
        if outcome == "stopped":
            self.run.mark_preempting()
        self.run.finish(exit_code=self.EXIT_CODES[outcome])


class MlflowLogger:
    """An MLflow run, in a SQLite store in the run folder (`mlruns.db`) unless logger.tracking_uri names a server or
    another store: nothing leaves the machine by default. A resumed run goes on in the MLflow run its folder started
    (its id kept in `mlflow-run-id`), so that one curve spans the restarts. A stopped run ends KILLED, the status
    MLflow has for a run ended before it was done."""

    STATUSES = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}

    def __init__(self, run_dir: Path, experiment: str, tracking_uri: str | None):
        import mlflow
        from mlflow.entities import Metric

        self.metric, folder = Metric, str(Path(run_dir).resolve())
        uri = tracking_uri or f"sqlite:///{folder}/mlruns.db"
        try:
            self.client = mlflow.MlflowClient(uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            self.run_id = kept_run_id(Path(folder) / "mlflow-run-id", lambda: self.client.create_run(
                experiment_id, run_name=Path(folder).name, tags={"run_dir": folder}).info.run_id)
            self.client.update_run(self.run_id, status="RUNNING")
        except mlflow.exceptions.MlflowException as err:
            raise ConfigError(f"logger=mlflow could not start a run at {uri} ({str(err).strip().splitlines()[0]}): "
                              "pass logger.tracking_uri=null, a store in the run folder, or a server it reaches") from None

    def scalars(self, values: dict[str, float], step: int, axis: Axis | None = None) -> None:
        # MLflow keeps each metric's history on steps of its own: a figure against another axis takes the axis's
        # values, rounded, as its steps, and no other metric shares them.
        at = step if axis is None else round(axis.value)
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, [self.metric(tag, float(value), now, at) for tag, value in values.items()])

    def close(self, outcome: Outcome) -> None:
        self.client.set_terminated(self.run_id, status=self.STATUSES[outcome])


def tensorboard(run_dir: Path) -> Logger:
    return TensorBoardLogger(Path(run_dir) / "tb")


def csv_table(run_dir: Path, file: str) -> Logger:
    return CsvLogger(Path(run_dir) / file)


def wandb(run_dir: Path, project: str, mode: str) -> Logger:
    return WandbLogger(Path(run_dir), project, mode)


def mlflow(run_dir: Path, experiment: str, tracking_uri: str | None) -> Logger:
    return MlflowLogger(Path(run_dir), experiment, tracking_uri)


def jsonl(run_dir: Path, file: str) -> Logger:
    return JsonLinesLogger(Path(run_dir) / file)


def none(run_dir: Path) -> Logger:
    return NullLogger()
