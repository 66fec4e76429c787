"""Where the per-window numbers go: TensorBoard, JSON lines (`logger=jsonl`), or nowhere (`logger=none`); each a
`Logger` (contracts/)."""
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..contracts import Logger
from ..core.files import write_failure, writing

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

    def scalars(self, values: dict[str, float], step: int) -> None:
        pass

    def close(self) -> None:
        pass


@contextmanager
def closing(path: Path) -> Iterator[None]:
    """Around a logger's close, which runs on every way out of the run, a failure's included: a last write that fails
    is logged, not raised over the failure on its way out."""
    try:
        yield
    except OSError as err:
        log.error("could not write %s: %s", path, write_failure(path, err))


class TensorBoardLogger:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        with writing(log_dir):
            self.writer = SummaryWriter(str(log_dir))
            self.writer.add_custom_scalars(LAYOUT)

    def scalars(self, values: dict[str, float], step: int) -> None:
        # The writer's thread writes; a write it failed is raised here, at the next call.
        with writing(self.log_dir):
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        with closing(self.log_dir):
            self.writer.close()


class JsonLinesLogger:
    """One JSON object per call, `{"step": ..., tag: value, ...}`, flushed at once: for a program that follows a
    run while it goes, as tune does its trials."""

    def __init__(self, path: Path):
        self.path = path
        with writing(path):
            self.file = path.open("a")

    def scalars(self, values: dict[str, float], step: int) -> None:
        with writing(self.path):
            self.file.write(json.dumps({"step": step, **values}) + "\n")
            self.file.flush()

    def close(self) -> None:
        with closing(self.path):
            self.file.close()


def tensorboard(run_dir: Path) -> Logger:
    return TensorBoardLogger(Path(run_dir) / "tb")


def jsonl(run_dir: Path, file: str) -> Logger:
    return JsonLinesLogger(Path(run_dir) / file)


def none(run_dir: Path) -> Logger:
    return NullLogger()
