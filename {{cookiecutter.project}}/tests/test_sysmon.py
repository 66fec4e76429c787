"""The system figures each logging window records: CPU load, iowait, disk reads, the CPU the loader's workers
used, and the GPU's load through NVML."""
import time

import pytest
import torch

from {{ cookiecutter.package }}.diagnosis.sysmon import SystemMonitor


def test_cpu_run_samples_the_host_and_no_gpu():
    monitor = SystemMonitor(torch.device("cpu"))
    sum(range(2_000_000))  # some CPU work to measure
    values = monitor.sample()
    assert set(values) == {"sys/cpu_util", "sys/iowait", "sys/disk_read_mb_s", "sys/loader_cpu"}
    assert 0 < values["sys/cpu_util"] <= 100 and values["sys/disk_read_mb_s"] >= 0


def burn(seconds: float, spent) -> None:
    """A child's work: busy for `seconds`, then what its own clock says it used."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    spent.value = time.process_time()


def test_the_cpu_children_use_is_the_loaders_share_of_all_cores(monkeypatch):
    """A child busy for a while, as a loader worker is: the share of all cores it took, whatever their number."""
    import multiprocessing
    import os

    monitor = SystemMonitor(torch.device("cpu"))
    spent = multiprocessing.Value("d", 0.0)
    began = time.perf_counter()
    child = multiprocessing.Process(target=burn, args=(0.5, spent))
    child.start()
    child.join()
    elapsed = time.perf_counter() - began
    share = monitor.sample()["sys/loader_cpu"]
    expected = 100 * spent.value / (elapsed * (os.cpu_count() or 1))
    assert share == pytest.approx(expected, rel=0.3), (share, expected)


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
