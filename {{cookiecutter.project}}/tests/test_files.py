"""The run's files on a disk that fills: the log file ends at its last whole line, and nothing on stderr but the
one line the run ends with."""
import logging

import pytest

from {{ cookiecutter.package }}.core.files import LogFile

from helpers.full_disk import fill

LINE = "a line of the run's log " * 8  # about 200 bytes, so that a few fill the room left


def run_log(path) -> tuple[logging.Logger, LogFile]:
    """A logger writing through LogFile alone, as train.log is written, apart from the root logger."""
    logger = logging.getLogger(f"test_files.{path}")
    logger.propagate, logger.level = False, logging.INFO
    handler = LogFile(path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger, handler


def test_a_log_file_whose_disk_fills_ends_at_its_last_whole_line_and_says_so_once(small_disk, capsys, caplog):
    disk = small_disk(1)
    if disk is None:
        pytest.skip(small_disk.refused)
    path = disk / "train.log"
    logger, handler = run_log(path)
    logger.info("before the disk filled")
    fill(disk, leave_bytes=4096)  # room for some lines, then for half of one
    for number in range(100):
        logger.info("%d %s", number, LINE)
    written = path.read_text()
    assert "--- Logging error ---" not in capsys.readouterr().err
    warnings = [record.getMessage() for record in caplog.records if record.name.endswith("core.files")]
    assert len(warnings) == 1 and warnings[0].startswith(f"could not write {path}: No space left on device (ENOSPC; ")
    assert written.endswith("\n") and written.startswith("INFO before the disk filled\n")
    lines = written.splitlines()
    assert 1 < len(lines) < 100 and all(line == f"INFO {number} {LINE}" for number, line in enumerate(lines[1:]))
    (disk / "filler").unlink()  # room again: the file stays where it ended, rather than go on with a gap in it
    logger.info("after the disk was freed")
    assert path.read_text() == written and handler.failed
    handler.close()


def test_a_wrong_logging_call_still_shows_as_the_bug_it_is(tmp_path, capsys):
    logger, handler = run_log(tmp_path / "train.log")
    logger.info("%d images", "many")
    assert "--- Logging error ---" in capsys.readouterr().err and not handler.failed
    logger.info("the next line")
    assert (tmp_path / "train.log").read_text().endswith("INFO the next line\n")
    handler.close()
