"""The loggers: each keeps every figure as it was given it, read back as its tracker's charts read it, and draws a
figure against an axis of its own apart from the steps; on a disk that fills, a write that fails names its file and
errno, closing never raises over the failure on its way out, and the writer thread's failure leaves no traceback on
stderr."""
import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from omegaconf import OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }} import train as train_module
from {{ cookiecutter.package }}.contracts import Axis
from {{ cookiecutter.package }}.core import failures
from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.faults import InjectedFault
from {{ cookiecutter.package }}.core.files import WriteError
from {{ cookiecutter.package }}.diagnosis.ranks import spread
from {{ cookiecutter.package }}.loop.clock import Window
from {{ cookiecutter.package }}.loop import logger as logger_module
from {{ cookiecutter.package }}.loop.logger import NullLogger, csv_table, jsonl, tensorboard
from {{ cookiecutter.package }}.train import step as train_step

from helpers.full_disk import fill
from helpers.machines import installed
from helpers.paths import CONF

# Two windows, the second with a figure the first lacks, as validation's top-1 arrives at an epoch's end.
WINDOWS = {20: {"train/loss": 2.0, "time/data_ms": 3.0}, 40: {"train/loss": 1.5, "time/data_ms": 2.5, "val/top1": 40.0}}
ELAPSED = "time/elapsed_s"


def two_epochs() -> list[tuple[dict[str, float], int, Axis | None]]:
    """The calls train.py makes to its logger over two epochs of 4 steps on 2 processes, in its order: the set-up
    time; a window every 2 steps, then the ranks' spread at the same step; at each epoch's end, validation's top-1,
    then the same top-1 against the run's seconds. Every figure is exact in float32, as TensorBoard keeps it."""
    calls = [({"time/setup_s": 3.0}, 0, None)]
    for step in (2, 4, 6, 8):
        ranks = [Window(steps=2, images=8, wall_s=1.0, data_s=step / 8), Window(steps=2, images=8, wall_s=1.0)]
        calls += [({"train/loss": 2.0 - step / 16, "time/data_ms": 5.0 * step}, step, None), (spread(ranks), step, None)]
        if step % 4 == 0:
            calls += [({"val/top1": 10.0 * step}, step, None),
                      ({"val/top1_by_second": 10.0 * step}, step, Axis(tag=ELAPSED, value=25.0 * step))]
    return calls


def per_step(rows: list[dict]) -> dict[str, dict[int, float]]:
    """Rows of a table, `step` among their columns, as each figure by step."""
    series = {}
    for row in rows:
        for tag, value in row.items():
            if tag != "step" and value != "":
                series.setdefault(tag, {})[int(row["step"])] = float(value)
    return series


CALLS = two_epochs()
STEPS = {step for _, step, _ in CALLS}
SERIES = per_step([{"step": step, **values} for values, step, axis in CALLS if axis is None])  # each figure by step
BY_TIME = {axis.value: values["val/top1_by_second"] for values, _, axis in CALLS if axis is not None}


def tensorboard_figures(run_dir, logger) -> tuple[dict, dict]:
    """Each tag's events against its steps, as TensorBoard's scalar charts read the event files; the top-1 against
    time is the tag whose steps are the run's seconds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    series = {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    return series, series.pop("val/top1_by_second", {})


def table_figures(run_dir, logger) -> tuple[dict, dict]:
    """The table as csv.DictReader reads it: each column by the `step` column; top-1 against the seconds column."""
    with (run_dir / "scalars.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    return per_step(rows), {float(row[ELAPSED]): float(row["val/top1_by_second"]) for row in rows
                            if row.get("val/top1_by_second")}


def json_figures(run_dir, logger) -> tuple[dict, dict]:
    lines = [json.loads(line) for line in (run_dir / "scalars.jsonl").read_text().splitlines()]
    return per_step(lines), {line[ELAPSED]: line["val/top1_by_second"] for line in lines if "val/top1_by_second" in line}


def wandb_records(run_dir) -> list[dict]:
    """The records of the run folder's offline W&B runs, oldest first, as W&B's own reader of a run's transaction
    log (run-*.wandb) prints them: history rows, define_metric's axes, the exit."""
    records = []
    for run in sorted((run_dir / "wandb").glob("offline-run-*")):
        printed = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run)],
                                 capture_output=True, text=True, timeout=120, env={**os.environ, "WANDB_MODE": "offline"})
        if printed.returncode != 0 and "No such" in printed.stderr:
            pytest.skip("reading an offline W&B run back needs `wandb leet inspect --json`: pip install -U wandb")
        assert printed.returncode == 0, printed.stderr
        records += [json.loads(line) for line in printed.stdout.splitlines()]
    return records


def wandb_figures(run_dir, logger) -> tuple[dict, dict]:
    """W&B's history as its charts read it: each figure against its row's step, or against the figure that
    define_metric named its step_metric."""
    records = wandb_records(run_dir)
    axes = {record["metric"]["name"]: record["metric"]["step_metric"] for record in records
            if record["type"] == "metric" and record["metric"].get("step_metric")}
    series, by_time = {}, {}
    for record in records:
        row = record["history"]["item"] if record["type"] == "history" else {}
        for tag, value in row.items():
            if tag in axes:
                by_time[row[axes[tag]]] = value
            elif not tag.startswith("_"):  # W&B's own: _step, _runtime, _timestamp
                series.setdefault(tag, {})[row["_step"]] = value
    return series, by_time


def mlflow_figures(run_dir, logger) -> tuple[dict, dict]:
    """Every value of the run's metric histories, read from the store in the run folder by MLflow's own client; the
    top-1 against time is the metric whose steps are the run's seconds."""
    history = logger.client.get_metric_history
    series = {tag: {metric.step: metric.value for metric in history(logger.run_id, tag)}
              for tag in logger.client.get_run(logger.run_id).data.metrics}
    return series, series.pop("val/top1_by_second", {})


READ_BACK = {"tensorboard": tensorboard_figures, "csv": table_figures, "jsonl": json_figures, "wandb": wandb_figures,
             "mlflow": mlflow_figures}


def tiered(params: list) -> list:
    """`params`, those of the trackers in the full tier: each sets up MLflow's SQLite store or starts W&B's run and its
    reader, 2-4 s."""
    return [pytest.param(*param.values, marks=[*param.marks, *([pytest.mark.full] * (param.values[0] in TRACKERS))])
            for param in params]


TRACKERS = ("wandb", "mlflow")


def test_every_logger_has_a_way_to_read_it_back_here():
    assert set(READ_BACK) == set(options.options("logger")) - {"none"}


@pytest.mark.parametrize("option", tiered(installed("logger", sorted(READ_BACK))))
def test_every_logger_keeps_every_series_and_top1_against_time_on_an_axis_of_its_own(option, tmp_path):
    """Every window, the ranks' spread, validation's top-1 at every epoch, read back as the tracker's charts read
    them; the top-1 against the run's seconds on an axis of its own, and no second on the steps' axis."""
    logger = build(OmegaConf.load(CONF / "logger" / f"{option}.yaml"), run_dir=tmp_path)
    for values, step, axis in CALLS:
        logger.scalars(values, step, axis)
    logger.close("finished")
    series, by_time = READ_BACK[option](tmp_path, logger)
    assert {tag: series.get(tag) for tag in SERIES} == SERIES
    assert {step for points in series.values() for step in points} <= STEPS
    assert by_time == BY_TIME == {100.0: 40.0, 200.0: 80.0}
    if option == "wandb":
        assert any((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))  # offline, in the run folder


def wandb_ending(run_dir, logger) -> tuple[int, bool]:
    """The exit code in the W&B run's transaction log, and whether it was marked preempting: W&B's server names a run
    finished for 0, failed for another code, and preempted for another code after a preempting mark."""
    records = wandb_records(run_dir)
    (ended,) = [record["exit"] for record in records if record["type"] == "exit"]
    return ended.get("exit_code", 0), any(record["type"] == "preempting" for record in records)


def mlflow_ending(run_dir, logger) -> str:
    return logger.client.get_run(logger.run_id).info.status


ENDINGS = {"wandb": (wandb_ending, {"finished": (0, False), "failed": (1, False), "stopped": (143, True)}),
           "mlflow": (mlflow_ending, {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"})}


@pytest.mark.full  # each tracker's three runs, 2-4 s
@pytest.mark.parametrize("option", installed("logger", sorted(ENDINGS)))
def test_a_trackers_run_is_marked_finished_failed_or_stopped_as_it_ended(option, tmp_path):
    node = OmegaConf.load(CONF / "logger" / f"{option}.yaml")
    if option == "mlflow":
        node.tracking_uri = f"sqlite:///{tmp_path / 'mlruns.db'}"  # one store for the three runs: set up once
    read, expected = ENDINGS[option]
    ended = {}
    for outcome in expected:
        run_dir = tmp_path / outcome
        run_dir.mkdir()
        logger = build(node, run_dir=run_dir)
        logger.scalars({"train/loss": 1.0}, 2)
        logger.close(outcome)
        ended[outcome] = read(run_dir, logger)
    assert ended == expected


@pytest.mark.parametrize("ending", ["finished", "failed", "stopped"])
def test_train_tells_its_logger_how_the_run_ended(ending, train_in_process, monkeypatch):
    """Two steps then validation; an injected failure at the first image; a SIGTERM at the first step, after which
    the run stops at its window's end, its checkpoint saved."""
    told = []

    class Told(NullLogger):
        def close(self, outcome: str) -> None:
            told.append(outcome)

    def preempted(run, loss):
        os.kill(os.getpid(), signal.SIGTERM)
        train_step(run, loss)

    monkeypatch.setattr(logger_module, "none", lambda run_dir: Told())  # what logger=none builds
    if ending == "stopped":
        monkeypatch.setattr(train_module, "step", preempted)
        monkeypatch.setattr(sys, "argv", ["train.py"])  # pytest's own is no command line the resume line can name
    faults = ["faults.worker_error_at=1"] if ending == "failed" else []
    with pytest.raises(InjectedFault) if ending == "failed" else contextlib.nullcontext():
        train_in_process("logger=none", "train.max_steps=2", *faults)
    assert told == [ending]


@pytest.mark.full  # MLflow's store set up twice, 2 s
@pytest.mark.parametrize("option", installed("logger", ["mlflow"]))
def test_a_resumed_run_goes_on_in_the_mlflow_run_its_folder_started(option, tmp_path):
    node = OmegaConf.load(CONF / "logger" / f"{option}.yaml")
    first = build(node, run_dir=tmp_path)
    first.scalars({"train/loss": 2.0}, 10)
    first.close("finished")
    again = build(node, run_dir=tmp_path)
    again.scalars({"train/loss": 1.0}, 20)
    again.close("finished")
    assert again.run_id == first.run_id == (tmp_path / "mlflow-run-id").read_text()
    assert (tmp_path / "mlruns.db").is_file()
    assert mlflow_figures(tmp_path, again)[0] == {"train/loss": {10: 2.0, 20: 1.0}}


@pytest.mark.full  # two W&B runs started, 3 s
@pytest.mark.parametrize("option", installed("logger", ["wandb"]))
def test_a_resumed_run_goes_on_in_the_wandb_run_its_folder_started(option, tmp_path):
    node = OmegaConf.load(CONF / "logger" / f"{option}.yaml")
    ids = []
    for step in (10, 20):
        logger = build(node, run_dir=tmp_path)
        logger.scalars({"train/loss": 1.0}, step)
        ids.append(logger.run.id)
        logger.close("finished")
    assert ids[0] == ids[1] == (tmp_path / "wandb-run-id").read_text()
    offline = sorted(path.name for path in (tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(ids[0] in name for name in offline), offline  # wandb sync joins them by id


@pytest.mark.parametrize("option", installed("logger", ["mlflow"]))
def test_an_mlflow_store_it_cannot_open_is_refused_in_one_line(option, tmp_path):
    node = OmegaConf.load(CONF / "logger" / f"{option}.yaml")
    node.tracking_uri = "nosuch://tracking"
    with pytest.raises(ConfigError, match=r"^logger=mlflow could not start a run at nosuch://tracking \(.+\): pass "
                                          r"logger.tracking_uri=null, a store in the run folder, or a server it "
                                          r"reaches$"):
        build(node, run_dir=tmp_path)


@pytest.mark.parametrize("option", installed("logger", ["wandb"]))
def test_a_wandb_mode_it_does_not_know_is_refused_in_one_line_before_a_run_starts(option, tmp_path):
    node = OmegaConf.load(CONF / "logger" / f"{option}.yaml")
    node.mode = "sometimes"
    with pytest.raises(ConfigError, match=r"^logger.mode=sometimes: pick one of auto, online, offline, disabled$"):
        build(node, run_dir=tmp_path)
    assert not (tmp_path / "wandb").exists()


@pytest.mark.parametrize("option", installed("logger", ["wandb"]))
def test_wandb_online_without_an_api_key_is_refused_in_one_line_naming_offline(option, tmp_path, monkeypatch):
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # nor a key that `wandb login` left in ~/.netrc
    node = OmegaConf.load(CONF / "logger" / f"{option}.yaml")
    node.mode = "online"
    with pytest.raises(ConfigError, match=r"^logger=wandb could not start a run in mode online \(.*API key.*\): pass "
                                          r"logger.mode=offline, whose run wandb sync uploads later$"):
        build(node, run_dir=tmp_path)


def test_a_resumed_runs_csv_goes_on_after_the_rows_it_holds_and_widens_for_new_figures(tmp_path):
    first = csv_table(tmp_path, "scalars.csv")
    first.scalars(WINDOWS[20], 20)
    first.close("finished")
    resumed = csv_table(tmp_path, "scalars.csv")
    resumed.scalars(WINDOWS[40], 40)  # val/top1 is new: the table is written anew, whole
    resumed.scalars({"train/loss": 1.0}, 60)
    resumed.close("finished")
    rows = list(csv.DictReader((tmp_path / "scalars.csv").open(newline="")))
    assert list(rows[0]) == ["step", "train/loss", "time/data_ms", "val/top1"]
    assert [(row["step"], row["train/loss"], row["val/top1"]) for row in rows] == [("20", "2.0", ""), ("40", "1.5", "40.0"),
                                                                                  ("60", "1.0", "")]
    assert not list(tmp_path.glob(".scalars.csv.partial-*"))


@pytest.fixture
def full_disk(small_disk):
    """A run folder on a tmpfs of 1 MB."""
    disk = small_disk(1)
    if disk is None:
        pytest.skip(small_disk.refused)
    return disk


def failed_write(logger, seconds: float = 30) -> WriteError:
    """Log windows until one fails; the failure. TensorBoard's thread writes, and its failure is raised at a later call."""
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline:
        try:
            logger.scalars({"train/loss": 1.0, "train/lr": 0.1, "time/data_ms": 3.0}, step)
        except WriteError as err:
            return err
        step += 1
        time.sleep(0.01)
    raise AssertionError(f"no write failed in {seconds} s")


LOGGERS = {"tb": tensorboard, "scalars.jsonl": lambda run_dir: jsonl(run_dir, "scalars.jsonl"),  # what each writes
           "scalars.csv": lambda run_dir: csv_table(run_dir, "scalars.csv")}


@pytest.mark.parametrize("written", sorted(LOGGERS))
def test_a_logger_whose_disk_fills_names_its_file_and_errno_and_closes_without_raising(written, full_disk, monkeypatch,
                                                                                      capsys, caplog):
    monkeypatch.setattr(threading, "excepthook", failures.thread_failed)  # as failures.one_line has it for a command
    logger = LOGGERS[written](full_disk)
    fill(full_disk)
    err = failed_write(logger)
    assert str(err).startswith(f"could not write {full_disk / written}: No space left on device (ENOSPC; ")
    logger.close("failed")  # what it still held cannot be written either: logged, not raised
    assert any(record.levelname == "ERROR" and record.getMessage().startswith(f"could not write {full_disk / written}")
               for record in caplog.records), caplog.text
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and "Exception in thread" not in stderr, stderr


def test_a_threads_failure_the_user_can_meet_is_one_logged_line_and_a_bug_keeps_its_traceback(monkeypatch, capsys,
                                                                                            caplog):
    monkeypatch.setattr(threading, "excepthook", failures.thread_failed)

    def run(target) -> str:
        thread = threading.Thread(target=target, name="writer")
        thread.start()
        thread.join()
        return capsys.readouterr().err

    def full_disk():
        raise OSError(28, "No space left on device")

    assert run(full_disk) == ""
    assert [record.getMessage() for record in caplog.records] == [
        "thread writer failed: the disk is full (OSError: [Errno 28] No space left on device): free some space"]
    bug = run(lambda: 1 / 0)
    assert "Traceback" in bug and "ZeroDivisionError" in bug
