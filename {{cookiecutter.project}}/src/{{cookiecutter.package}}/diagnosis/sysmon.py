"""The htop/iostat/nvidia-smi checks, sampled once per logging window: CPU load, iowait, disk reads, GPU load,
the CPU the loader's workers used, where they spent each image and where the training process spent each batch."""
import logging
import os
import time

import psutil
import torch

from ..core.faults import FailingNvml
from ..data.device import UploadTimes
from ..data.images import ReadTimes

log = logging.getLogger(__name__)


def _disk_read_bytes() -> int:
    counters = psutil.disk_io_counters()
    return counters.read_bytes if counters else 0


def _children_cpu_s() -> float:
    """CPU seconds used by this process's children (loader workers): those alive, and those it has waited for."""
    alive = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # ended since it was listed: its time is in os.times() once it is waited for
            continue
        alive += times.user + times.system
    ended = os.times()
    return alive + ended.children_user + ended.children_system


class SystemMonitor:
    """Each `sample()` returns averages since the previous call (or since construction), with `sys/` tags,
    `loader_times`'s figures (where the loader's workers spend each image) and `upload_times`'s, where given (where
    the training process spends each batch: waiting for it, or uploading and, with a batch decoder, decoding it):
    those of `FIGURES` it could read.

    `nvml_fails_after` (faults.nvml_fails_after): NVML answers that many windows, then fails, as on a node of a
    container job whose driver went away; on a machine without a GPU a stand-in reads 0% until then."""
    # Every figure a sample can hold, in the report's order, with the words and unit the report shows it in.
    FIGURES = {"sys/cpu_util": "CPU {:.0f}% busy", "sys/iowait": "iowait {:.1f}%",
               "sys/disk_read_mb_s": "disk reads {:.1f} MB/s", "sys/loader_cpu": "loader workers {:.0f}% of all cores",
               "sys/gpu_util": "GPU {:.0f}% busy", **ReadTimes.FIGURES, **UploadTimes.FIGURES}

    def __init__(self, device: torch.device, loader_times: ReadTimes, nvml_fails_after: int = -1,
                 upload_times: UploadTimes | None = None):
        self.device, self.loader_times, self.upload_times = device, loader_times, upload_times
        psutil.cpu_percent(None)  # psutil measures from the previous call; this is the first
        psutil.cpu_times_percent(None)
        self.cores = os.cpu_count() or 1
        self.read_gpu_util = (lambda: float(torch.cuda.utilization(device))) if device.type == "cuda" else None
        if nvml_fails_after >= 0:
            self.read_gpu_util = FailingNvml(self.read_gpu_util or (lambda: 0.0), nvml_fails_after)
        self.last_time, self.last_read, self.last_children = time.perf_counter(), _disk_read_bytes(), _children_cpu_s()

    def _gpu_util(self) -> dict[str, float]:
        """`sys/gpu_util`: NVML's share of its last sample period (1/6 to 1 s, by product) in which a kernel ran on
        the GPU, read at the window's end; not an average over the window. Where NVML cannot say (a MIG slice, some
        containers, no pynvml), the figure is left out from then on, after one line that says why."""
        try:
            return {"sys/gpu_util": self.read_gpu_util()}
        except Exception as err:  # noqa: BLE001 - pynvml's NVMLError and torch's RuntimeError alike: a figure missing
            self.read_gpu_util = None
            log.warning("sys/gpu_util is not recorded: NVML cannot give this GPU's utilisation (%s: %s); the run goes "
                        "on without it", type(err).__name__, err)
            return {}

    def sample(self) -> dict[str, float]:
        now, read, children = time.perf_counter(), _disk_read_bytes(), _children_cpu_s()
        elapsed = max(1e-9, now - self.last_time)
        values = {
            "sys/cpu_util": psutil.cpu_percent(None),
            "sys/iowait": getattr(psutil.cpu_times_percent(None), "iowait", 0.0),
            "sys/disk_read_mb_s": (read - self.last_read) / 1e6 / elapsed,
            "sys/loader_cpu": 100 * (children - self.last_children) / (elapsed * self.cores),  # % of all cores
        }
        if self.read_gpu_util is not None:
            values |= self._gpu_util()
        self.last_time, self.last_read, self.last_children = now, read, children
        return {**values, **self.loader_times.sample(), **(self.upload_times.sample() if self.upload_times else {})}
