"""Optional profiling of the training loop; each profiler is a `Profiler` (contracts/): a context manager with a
per-step `step()`."""
import cProfile
import logging
from pathlib import Path

import torch

from ..contracts import Profiler

log = logging.getLogger(__name__)


class NoProfiler:
    """Profiles nothing: `profiler=none`, and every process but the first."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def step(self) -> None:
        pass


class TorchTrace:
    """torch.profiler over wait + warmup + active steps, exported as a Chrome trace (Perfetto opens it)."""

    def __init__(self, path: Path, wait: int, warmup: int, active: int):
        self.path = path
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=self._export,
        )
        self.written = False

    def _export(self, profile: torch.profiler.profile) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        profile.export_chrome_trace(str(self.path))
        self.written = True
        log.info("profiler trace written to %s", self.path)

    def __enter__(self):
        self.profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.profile.__exit__(*exc)
        if not self.written:
            log.warning("the run ended before the profiler's active steps; no trace written")

    def step(self) -> None:
        self.profile.step()


class CProfile:
    """cProfile of the main process for the whole training; workers are separate processes and not in it."""

    def __init__(self, path: Path):
        self.path, self.profile = path, cProfile.Profile()

    def __enter__(self):
        self.profile.enable()
        return self

    def __exit__(self, *exc) -> None:
        self.profile.disable()
        self.profile.dump_stats(self.path)
        log.info("cProfile stats written to %s (snakeviz %s)", self.path, self.path)

    def step(self) -> None:
        """cProfile sees every call: no step to mark."""


def none(run_dir: Path) -> Profiler:
    return NoProfiler()


def torch_trace(run_dir: Path, wait: int, warmup: int, active: int) -> Profiler:
    return TorchTrace(Path(run_dir) / "profile" / "trace.json", wait, warmup, active)


def cprofile(run_dir: Path) -> Profiler:
    return CProfile(Path(run_dir) / "profile.prof")
