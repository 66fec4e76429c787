"""Where the per-window numbers go: TensorBoard, JSON lines (`logger=jsonl`), or nowhere (`logger=none`); each a
`Logger` (contracts.py)."""
import json
from pathlib import Path

from ..contracts import Logger

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


class TensorBoardLogger:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))
        self.writer.add_custom_scalars(LAYOUT)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class JsonLinesLogger:
    """One JSON object per call, `{"step": ..., tag: value, ...}`, flushed at once: for a program that follows a
    run while it goes, as tune does its trials."""

    def __init__(self, path: Path):
        self.file = path.open("a")

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.file.write(json.dumps({"step": step, **values}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def tensorboard(run_dir: Path) -> Logger:
    return TensorBoardLogger(Path(run_dir) / "tb")


def jsonl(run_dir: Path, file: str) -> Logger:
    return JsonLinesLogger(Path(run_dir) / file)


def none(run_dir: Path) -> Logger:
    return NullLogger()
