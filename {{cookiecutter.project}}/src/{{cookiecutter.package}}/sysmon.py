"""The htop/iostat/nvidia-smi checks, sampled once per logging window: CPU load, iowait, disk reads, GPU load."""
import time

import psutil
import torch


def _disk_read_bytes() -> int:
    counters = psutil.disk_io_counters()
    return counters.read_bytes if counters else 0


class SystemMonitor:
    """Each `sample()` returns averages since the previous call (or since construction), with `sys/` tags."""

    def __init__(self, device: torch.device):
        self.device = device
        psutil.cpu_percent(None)  # psutil measures from the previous call; this is the first
        psutil.cpu_times_percent(None)
        self.last_time, self.last_read = time.perf_counter(), _disk_read_bytes()

    def sample(self) -> dict[str, float]:
        now, read = time.perf_counter(), _disk_read_bytes()
        values = {
            "sys/cpu_util": psutil.cpu_percent(None),
            "sys/iowait": getattr(psutil.cpu_times_percent(None), "iowait", 0.0),
            "sys/disk_read_mb_s": (read - self.last_read) / 1e6 / max(1e-9, now - self.last_time),
        }
        if self.device.type == "cuda":
            values["sys/gpu_util"] = float(torch.cuda.utilization(self.device))  # NVML, through pynvml
        self.last_time, self.last_read = now, read
        return values
