"""The loggers on a disk that fills: a write that fails names its file and errno, closing never raises over the
failure on its way out, and the writer thread's failure leaves no traceback on stderr."""
import threading
import time

import pytest

from {{ cookiecutter.package }}.core import failures
from {{ cookiecutter.package }}.core.files import WriteError
from {{ cookiecutter.package }}.loop.logger import jsonl, tensorboard

from conftest import fill


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


LOGGERS = {"tb": tensorboard, "scalars.jsonl": lambda run_dir: jsonl(run_dir, "scalars.jsonl")}  # what each writes


@pytest.mark.parametrize("written", sorted(LOGGERS))
def test_a_logger_whose_disk_fills_names_its_file_and_errno_and_closes_without_raising(written, full_disk, monkeypatch,
                                                                                      capsys, caplog):
    monkeypatch.setattr(threading, "excepthook", failures.thread_failed)  # as failures.one_line has it for a command
    logger = LOGGERS[written](full_disk)
    fill(full_disk)
    err = failed_write(logger)
    assert str(err).startswith(f"could not write {full_disk / written}: No space left on device (ENOSPC; ")
    logger.close()  # what it still held cannot be written either: logged, not raised
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
