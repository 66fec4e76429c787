"""Where the time goes: each logging window split into data stall, host overhead and compute.

The loop touches it three times: `timed(loader)` around the batches, `lap()` at each logging window
(the window's one device sync), and `start()` after anything that is not training (validation).

On the CPU the device is the host, so the split is two-way: data is the time the host spends blocked
in `next(loader)`, compute is the rest, and host overhead is zero by definition (Python time there is
the device's own time).

On CUDA the host runs ahead of the GPU, so the window is split by what the GPU was doing:
- data stall: the GPU idle while the host waited for the next batch. At each `next()` an event marks the
  end of the work queued so far; the GPU is idle from the moment it reaches that event until the batch
  arrives. Exact, up to the few microseconds an event takes to reach the GPU.
- host overhead: the GPU idle while the host was in the step (Python, kernel launches, syncs, the
  optimizer on the host). Estimated by sampling, see `QueueSampler`.
- compute: the rest, GPU busy with the step (including the end of the previous step's work, which the
  GPU may still be running while the host waits for data).
Events are read only at `lap()`, after its sync, so no step waits on them.
"""
import itertools
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import astuple, dataclass, fields

import torch


@dataclass(kw_only=True)
class Window:
    steps: int = 0
    images: int = 0
    wall_s: float = 0.0
    data_s: float = 0.0
    host_s: float = 0.0
    epoch_start_s: float = 0.0  # from the start of an epoch to its first batch (part of data_s)
    epoch_starts: int = 0  # epochs that started in the window

    @property
    def compute_s(self) -> float:
        return self.wall_s - self.data_s - self.host_s

    def _per_step_ms(self, seconds: float) -> float:
        return 1000 * seconds / max(1, self.steps)

    def _share(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def data_ms(self) -> float:
        return self._per_step_ms(self.data_s)

    @property
    def host_ms(self) -> float:
        return self._per_step_ms(self.host_s)

    @property
    def compute_ms(self) -> float:
        return self._per_step_ms(self.compute_s)

    @property
    def data_frac(self) -> float:
        return self._share(self.data_s)

    @property
    def host_frac(self) -> float:
        return self._share(self.host_s)

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    def scalars(self) -> dict[str, float]:
        """The window's figures as the logger takes them; `time/epoch_start_ms` where an epoch started in it."""
        started = {"time/epoch_start_ms": 1000 * self.epoch_start_s / self.epoch_starts} if self.epoch_starts else {}
        return {"time/data_ms": self.data_ms, "time/host_ms": self.host_ms, "time/compute_ms": self.compute_ms,
                "time/data_frac": self.data_frac, "time/host_frac": self.host_frac,
                "throughput/images_per_s": self.images_per_s, **started}

    def __add__(self, other: "Window") -> "Window":
        return Window.from_row([mine + theirs for mine, theirs in zip(astuple(self), astuple(other))])

    @classmethod
    def from_row(cls, row: list[float]) -> "Window":
        """The window whose astuple() is `row` (the figures a gather carries), each field as its type."""
        return cls(**{field.name: type(field.default)(value) for field, value in zip(fields(cls), row)})


class Clock:
    """The CPU clock: data is the host's time blocked in `next(loader)`, compute the rest."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start()

    def start(self) -> None:
        """Open a new window: call before a stretch of training steps (after validation, say)."""
        self.window_start = time.perf_counter()
        self.waited_s, self.steps, self.images = 0.0, 0, 0
        self.epoch_start_s, self.epoch_starts = 0.0, 0

    def timed(self, loader: Iterable) -> Iterator:
        """Yield the loader's batches, charging the time spent getting each one to data. The first one's wait,
        from before the loader starts its workers (which a loader without persistent workers does at every
        epoch), is also the epoch's start."""
        batches = lazily(loader)
        for index in itertools.count():
            begin = time.perf_counter()
            self.waiting(begin)
            try:
                batch = next(batches)
            except StopIteration:  # the loader's last call: its workers end here when they do not persist
                end = time.perf_counter()
                self.got(begin, end)
                self.waited_s += end - begin
                return
            got = time.perf_counter()
            self.got(begin, got)
            self.waited_s += got - begin
            if index == 0:
                self.epoch_start_s, self.epoch_starts = self.epoch_start_s + got - begin, self.epoch_starts + 1
            self.steps += 1
            self.images += len(batch[0])
            yield batch

    def waiting(self, begin: float) -> None:
        """The host starts waiting for a batch at `begin`."""

    def got(self, begin: float, end: float) -> None:
        """The host waited for a batch from `begin` to `end`."""

    def lap(self) -> Window:
        """Close the window, return its split, and open the next."""
        wall = time.perf_counter() - self.window_start
        window = Window(steps=self.steps, images=self.images, wall_s=wall, data_s=min(self.waited_s, wall),
                        **self._epoch_start(wall))
        self.start()
        return window

    def _epoch_start(self, wall: float) -> dict[str, float | int]:
        return {"epoch_start_s": min(self.epoch_start_s, wall), "epoch_starts": self.epoch_starts}

    def close(self) -> None:
        """Stop anything the clock runs in the background."""


def lazily(loader: Iterable) -> Iterator:
    """The loader's batches, with iter(loader) (where a loader starts its workers) at the first next()."""
    yield from loader


IDLE_LAG_S = 50e-6  # an event the GPU reaches this soon after its recording found nothing queued ahead of it
SAMPLE_EVERY_S = 0.002


class QueueSampler:
    """Samples whether the GPU has work queued, from a background thread, every `SAMPLE_EVERY_S`.

    Each sample records an event on the training stream and notes the host time: if the GPU reaches the
    event within `IDLE_LAG_S`, nothing was queued ahead of it and the GPU was idle at that moment. A
    sample's weight is the time since the previous one, so stretches where the thread ran late (the
    training thread holding the GIL in pure Python) still count for their length. The idle share of the
    weighted samples taken while the host was in the step estimates the GPU's idle share of that time.
    Two boundary events cannot tell a step whose host waits in a sync for a busy GPU from one whose host
    sleeps while the GPU idles; sampling the queue can.
    """

    def __init__(self, stream: torch.cuda.Stream):
        self.stream, self.lock = stream, threading.Lock()
        self.samples: list[tuple[float, torch.cuda.Event, bool]] = []  # (host time, event, host waiting for data)
        self.active = self.host_waiting = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="gpu-queue-sampler")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            if self.active:
                event = torch.cuda.Event(enable_timing=True)
                event.record(self.stream)
                sample = (time.perf_counter(), event, self.host_waiting)
                with self.lock:
                    self.samples.append(sample)

    def take(self) -> list[tuple[float, torch.cuda.Event, bool]]:
        """The samples so far (call before the device sync that completes their events), and a fresh list."""
        with self.lock:
            samples, self.samples = self.samples, []
        return samples

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class CudaClock(Clock):
    """The three-way split on CUDA; see the module docstring."""

    def __init__(self, device: torch.device, sample_queue: bool = True):
        self.stream = torch.cuda.current_stream(device)
        self.sampler = QueueSampler(self.stream) if sample_queue else None
        super().__init__(device)

    def start(self) -> None:
        if self.sampler:
            self.sampler.take()  # from outside any window (validation, say): never read
        torch.cuda.synchronize(self.device)
        self._open(self._idle_anchor())

    def _idle_anchor(self) -> tuple[float, torch.cuda.Event]:
        """(host time, event) right after a sync: the GPU is idle, so it reaches the event at that host time."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return time.perf_counter(), event

    def _open(self, anchor: tuple[float, torch.cuda.Event]) -> None:
        super().start()
        self.window_start, self.anchor = anchor[0], anchor
        self.fetches: list[tuple[float, float, torch.cuda.Event]] = []  # (wait begins, wait ends, queue's end)
        self.queue_end: torch.cuda.Event | None = None

    def timed(self, loader: Iterable) -> Iterator:
        if self.sampler:
            self.sampler.active = True
        try:
            yield from super().timed(loader)
        finally:
            if self.sampler:
                self.sampler.active = False

    def waiting(self, begin: float) -> None:
        self.queue_end = torch.cuda.Event(enable_timing=True)
        self.queue_end.record(self.stream)
        if self.sampler:
            self.sampler.host_waiting = True

    def got(self, begin: float, end: float) -> None:
        if self.sampler:
            self.sampler.host_waiting = False
        self.fetches.append((begin, end, self.queue_end))

    def lap(self) -> Window:
        samples = self.sampler.take() if self.sampler else []
        sync_begin = time.perf_counter()
        torch.cuda.synchronize(self.device)  # the window's one device sync
        sync_end = time.perf_counter()
        closing = self._idle_anchor()
        closing[1].synchronize()  # returns at once: the GPU is idle, and this event is all it has
        on_host = self._host_clock(closing)
        wall = closing[0] - self.window_start
        waited = sum(end - begin for begin, end, _ in self.fetches)
        # The GPU is idle from when it reaches the end of the queued work until the batch arrives.
        data = sum(max(0.0, end - max(begin, on_host(queue_end))) for begin, end, queue_end in self.fetches)
        in_step = max(0.0, wall - waited - (sync_end - sync_begin))  # the sync's wait is the GPU's busy time
        host = idle_share(samples, on_host, self.window_start) * in_step
        window = Window(steps=self.steps, images=self.images, wall_s=wall, data_s=min(data, wall),
                        host_s=min(host, wall - min(data, wall)), **self._epoch_start(wall))
        self._open(closing)
        return window

    def _host_clock(self, closing: tuple[float, torch.cuda.Event]):
        """Maps an event of this window to the host time the GPU reached it, from the two idle anchors.

        Both anchors were reached at their host times, so the mapping also corrects any drift between the
        GPU's timer and the host's clock over the window.
        """
        start_time, start_event = self.anchor
        gpu_span = start_event.elapsed_time(closing[1]) / 1000
        scale = (closing[0] - start_time) / gpu_span if gpu_span > 0 else 1.0
        return lambda event: start_time + scale * start_event.elapsed_time(event) / 1000

    def close(self) -> None:
        if self.sampler:
            self.sampler.close()


def idle_share(samples: list[tuple[float, torch.cuda.Event, bool]], on_host, window_start: float) -> float:
    """The time-weighted share of the in-step samples at which the GPU had nothing queued."""
    idle = total = 0.0
    previous = window_start
    for taken, event, host_waiting in samples:
        weight, previous = taken - previous, taken
        if taken < window_start or host_waiting:
            continue  # from before this window, or in a data wait, which the fetch events measure exactly
        total += weight
        if on_host(event) - taken < IDLE_LAG_S:
            idle += weight
    return idle / total if total > 0 else 0.0


def make_clock(device: torch.device, sample_queue: bool = True) -> Clock:
    """The clock for `device`; `sample_queue=False` gives a two-way split on CUDA (host overhead counted as compute)."""
    return CudaClock(device, sample_queue) if device.type == "cuda" else Clock(device)
