"""The timing split: a slow iterator shows as data, a slow Python step as host overhead, a slow device op as compute."""
import threading
import time

import pytest
import torch

from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.device import ToDevice
from {{ cookiecutter.package }}.data.prefetcher import thread
from {{ cookiecutter.package }}.loop.clock import Clock, CudaClock, Window, make_clock

DELAY = 0.02


def slow_batches(count: int, delay: float):
    for _ in range(count):
        time.sleep(delay)
        yield torch.zeros(8, 3, 4, 4), torch.zeros(8)


def measure(iterator_delay: float, step_delay: float) -> Window:
    clock = Clock(torch.device("cpu"))
    clock.start()
    for _ in clock.timed(slow_batches(10, iterator_delay)):
        time.sleep(step_delay)
    return clock.lap()


def test_slow_iterator_is_data_time():
    window = measure(DELAY, 0.0)
    assert window.data_frac > 0.9
    assert window.data_ms == pytest.approx(1000 * DELAY, rel=0.5)
    assert window.compute_ms < 5


def test_slow_step_is_compute_time_and_the_cpu_has_no_host_overhead():
    window = measure(0.0, DELAY)
    assert window.data_frac < 0.1 and window.host_s == 0.0
    assert window.compute_ms == pytest.approx(1000 * DELAY, rel=0.5)


def test_window_counts_steps_and_images():
    window = measure(0.001, 0.001)
    assert (window.steps, window.images) == (10, 80)
    assert window.images_per_s == pytest.approx(80 / window.wall_s)


def test_lap_opens_a_new_window():
    clock = Clock(torch.device("cpu"))
    for _ in clock.timed(slow_batches(3, 0.0)):
        pass
    assert clock.lap().steps == 3
    assert clock.lap().steps == 0


def test_windows_add_up():
    total = (Window(steps=2, images=16, wall_s=1.0, data_s=0.25, host_s=0.125)
             + Window(steps=2, images=16, wall_s=1.0, data_s=0.75, host_s=0.125))
    assert (total.steps, total.images, total.data_frac, total.host_frac) == (4, 32, 0.5, 0.125)
    assert total.compute_ms == pytest.approx(1000 * 0.75 / 4)


class FakeGpu:
    """One CUDA stream, simulated on the host clock: work runs in launch order, and an event is reached when
    the work launched before it is done. `timer_rate` makes the GPU's timer run fast or slow."""

    def __init__(self, timer_rate: float = 1.0):
        self.lock, self.busy_until, self.timer_rate = threading.Lock(), 0.0, timer_rate
        self.device = torch.device("cuda", 0)
        self.events = 0

    def run(self, seconds: float) -> None:
        """A kernel launch: returns at once, the work queues behind what is already there."""
        with self.lock:
            self.busy_until = max(time.perf_counter(), self.busy_until) + seconds

    def synchronize(self, device=None) -> None:
        time.sleep(max(0.0, self.busy_until - time.perf_counter()))

    def event_class(self):
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.reached = None

            def record(self, stream=None) -> None:
                with gpu.lock:
                    self.reached = max(time.perf_counter(), gpu.busy_until)
                    gpu.events += 1

            def elapsed_time(self, end) -> float:
                return 1000 * gpu.timer_rate * (end.reached - self.reached)

            def synchronize(self) -> None:
                time.sleep(max(0.0, self.reached - time.perf_counter()))

        return Event


@pytest.fixture
def fake_gpu(monkeypatch):
    def install(timer_rate: float = 1.0) -> FakeGpu:
        gpu = FakeGpu(timer_rate)
        monkeypatch.setattr(torch.cuda, "Event", gpu.event_class())
        monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: gpu)
        return gpu

    return install


def run_steps(clock, batches, step) -> Window:
    try:
        for _ in clock.timed(batches):
            step()
        return clock.lap()
    finally:
        clock.close()


def fake_window(gpu: FakeGpu, iterator_delay: float = 0.0, host_delay: float = 0.0, kernel: float = 0.001,
                sync_in_step: bool = False, steps: int = 15, sample_queue: bool = True) -> Window:
    def step():
        time.sleep(host_delay)  # Python between launches: the GPU has nothing to do
        gpu.run(kernel)
        if sync_in_step:  # .item() or fp16's loss scaler: the host waits while the GPU works
            gpu.synchronize()

    return run_steps(CudaClock(torch.device("cuda"), sample_queue), slow_batches(steps, iterator_delay), step)


def test_cuda_slow_iterator_is_data_stall(fake_gpu):
    window = fake_window(fake_gpu(), iterator_delay=DELAY)
    assert window.data_frac > 0.8 and window.host_frac < 0.1, window


def test_cuda_slow_python_step_is_host_overhead(fake_gpu):
    window = fake_window(fake_gpu(), host_delay=DELAY)
    assert window.host_frac > 0.75 and window.data_frac < 0.1, window
    assert window.host_ms == pytest.approx(1000 * DELAY, rel=0.3)


def test_cuda_slow_device_op_is_compute(fake_gpu):
    window = fake_window(fake_gpu(), kernel=DELAY)
    assert window.compute_s / window.wall_s > 0.9 and window.data_frac < 0.05 and window.host_frac < 0.05, window
    assert window.compute_ms == pytest.approx(1000 * DELAY, rel=0.3)


def test_cuda_host_waiting_in_a_sync_for_a_busy_gpu_is_compute(fake_gpu):
    """Two events per step could not tell this from a sleeping host; sampling the GPU's queue can."""
    window = fake_window(fake_gpu(), kernel=DELAY, sync_in_step=True)
    assert window.compute_s / window.wall_s > 0.8 and window.host_frac < 0.15, window


@pytest.mark.parametrize(("iterator_delay", "kernel", "stall"), [(0.010, 0.015, 0.0), (0.015, 0.010, 0.005)])
def test_cuda_data_stall_is_only_the_idle_part_of_the_wait(fake_gpu, iterator_delay, kernel, stall):
    """While the host waits for a batch the GPU may still be running the previous step: that is not a stall."""
    window = fake_window(fake_gpu(), iterator_delay=iterator_delay, kernel=kernel)
    assert window.data_s / window.steps == pytest.approx(stall, abs=0.003), window


def test_cuda_split_survives_a_gpu_timer_that_drifts(fake_gpu):
    """A GPU timer 1% fast would put every sample 1 ms off after 0.1 s; the two idle anchors correct it."""
    window = fake_window(fake_gpu(timer_rate=1.01), host_delay=DELAY)
    assert window.host_frac > 0.75, window


def test_cuda_without_queue_sampling_counts_host_time_as_compute(fake_gpu):
    gpu = fake_gpu()
    window = fake_window(gpu, host_delay=DELAY, sample_queue=False)
    assert window.host_s == 0.0 and window.compute_s / window.wall_s > 0.75
    assert gpu.events <= 2 * 16 + 4  # an event per batch and the anchors: nothing sampled


def test_cuda_clock_stops_its_sampler_and_keeps_nothing_from_outside_a_window(fake_gpu):
    fake_gpu()
    clock = CudaClock(torch.device("cuda"))
    list(clock.timed(slow_batches(2, 0.0)))
    time.sleep(0.05)  # validation, say: not inside timed(), so nothing is sampled
    clock.start()
    assert clock.sampler.take() == []
    clock.close()
    assert not clock.sampler.thread.is_alive()
    assert isinstance(make_clock(torch.device("cpu")), Clock) and not isinstance(
        make_clock(torch.device("cpu")), CudaClock)


def real_window(gpu_busy, iterator_delay: float = 0.0, host_delay: float = 0.0, kernel: float = 0.0005,
                steps: int = 20) -> Window:
    def step():
        time.sleep(host_delay)
        gpu_busy(kernel)

    return run_steps(make_clock(torch.device("cuda")), slow_batches(steps, iterator_delay), step)


@pytest.mark.gpu
def test_real_gpu_slow_iterator_is_data_stall(gpu_busy):
    window = real_window(gpu_busy, iterator_delay=DELAY)
    assert window.data_frac > 0.8 and window.host_frac < 0.1, window


@pytest.mark.gpu
def test_real_gpu_slow_python_step_is_host_overhead(gpu_busy):
    window = real_window(gpu_busy, host_delay=DELAY)
    assert window.host_frac > 0.75 and window.data_frac < 0.1, window


@pytest.mark.gpu
def test_real_gpu_slow_device_op_is_compute(gpu_busy):
    window = real_window(gpu_busy, kernel=DELAY)
    assert window.compute_s / window.wall_s > 0.85 and window.data_frac < 0.05 and window.host_frac < 0.1, window


def uint8_batches(count: int, delay: float):
    """Batches as the loader's workers deliver them (NHWC uint8), each after `delay`."""
    for _ in range(count):
        time.sleep(delay)
        yield torch.zeros(64, 64, 64, 3, dtype=torch.uint8), torch.zeros(64, dtype=torch.long)


@pytest.mark.gpu
@pytest.mark.parametrize(("iterator_delay", "kernel", "bound"), [(DELAY, 0.0005, "data"), (0.0, DELAY, "compute")])
def test_real_gpu_split_through_the_thread_prefetcher(gpu_busy, iterator_delay, kernel, bound):
    """The thread uploads on a side stream, so the training stream holds only the step: a slow loader is still a
    data stall and a slow kernel compute, with no host share from the uploads."""
    device = torch.device("cuda")
    batches = thread(uint8_batches(20, iterator_delay), ToDevice(PilDecoder(), device, non_blocking=True), depth=2)
    window = run_steps(make_clock(device), batches, lambda: gpu_busy(kernel))
    shares = {"data": window.data_frac, "compute": window.compute_s / window.wall_s}
    assert shares[bound] > 0.8 and window.host_frac < 0.1, window

