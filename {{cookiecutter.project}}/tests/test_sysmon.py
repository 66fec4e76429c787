"""The system figures each logging window records: CPU load, iowait, disk reads, and the GPU's load through NVML."""
import time

import pytest
import torch

from {{ cookiecutter.package }}.sysmon import SystemMonitor


def test_cpu_run_samples_the_host_and_no_gpu():
    monitor = SystemMonitor(torch.device("cpu"))
    sum(range(2_000_000))  # some CPU work to measure
    values = monitor.sample()
    assert set(values) == {"sys/cpu_util", "sys/iowait", "sys/disk_read_mb_s"}
    assert 0 < values["sys/cpu_util"] <= 100 and values["sys/disk_read_mb_s"] >= 0


@pytest.mark.gpu
def test_gpu_utilisation_comes_from_nvml_while_a_kernel_runs(gpu_busy):
    monitor = SystemMonitor(torch.device("cuda"))
    gpu_busy(2.0)
    time.sleep(1.0)  # NVML averages over its last sample period, which the running kernel fills
    busy = monitor.sample()["sys/gpu_util"]
    torch.cuda.synchronize()
    time.sleep(1.0)
    idle = monitor.sample()["sys/gpu_util"]
    assert busy >= 50 and idle < busy, (busy, idle)
