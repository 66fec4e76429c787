"""A disk filled as another program filling it would."""
import errno
import os
import shutil
from pathlib import Path


def fill(disk: Path, leave_bytes: int = 0) -> None:
    """Take the free space of `disk` but `leave_bytes` with a file of its own, as another program filling it would."""
    descriptor = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while (free := shutil.disk_usage(disk).free) > leave_bytes:
            os.write(descriptor, bytes(min(2**20, free - leave_bytes)))
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
    finally:
        os.close(descriptor)
