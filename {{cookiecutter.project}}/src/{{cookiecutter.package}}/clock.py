"""Where the time goes: each step split into waiting for data and the rest, with one device sync per window.

On the CPU, data time is what the host spends blocked in `next(loader)`. On CUDA the host runs
ahead of the GPU, so a host-side wait can overlap GPU work; there compute time is the GPU's own
busy time from a pair of CUDA events per step, and data time is the rest of the window: the time
the GPU sat idle. Events are read only at `lap()`, after the one sync, so no step waits on them.
"""
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch


@dataclass
class Window:
    steps: int = 0
    images: int = 0
    wall_s: float = 0.0
    data_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.wall_s - self.data_s

    @property
    def data_ms(self) -> float:
        return 1000 * self.data_s / max(1, self.steps)

    @property
    def compute_ms(self) -> float:
        return 1000 * self.compute_s / max(1, self.steps)

    @property
    def data_frac(self) -> float:
        return self.data_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    def __add__(self, other: "Window") -> "Window":
        return Window(self.steps + other.steps, self.images + other.images,
                      self.wall_s + other.wall_s, self.data_s + other.data_s)


class Clock:
    def __init__(self, device: torch.device):
        self.device = device
        self.events = device.type == "cuda"
        self.start()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        """Open a new window: call before a stretch of training steps (after validation, say)."""
        self._sync()
        self._reset()

    def _reset(self) -> None:
        self.window_start = time.perf_counter()
        self.waited_s, self.steps, self.images = 0.0, 0, 0
        self.step_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.open_event: torch.cuda.Event | None = None

    def _close_step(self) -> None:
        if self.open_event is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.step_events.append((self.open_event, end))
            self.open_event = None

    def timed(self, loader: Iterable) -> Iterator:
        """Yield the loader's batches, charging the time spent getting each one to data."""
        batches = iter(loader)
        while True:
            if self.events:
                self._close_step()
            begin = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.waited_s += time.perf_counter() - begin
            if self.events:
                self.open_event = torch.cuda.Event(enable_timing=True)
                self.open_event.record()
            self.steps += 1
            self.images += len(batch[0])
            yield batch

    def lap(self) -> Window:
        """Close the window with one device sync, return its split, and open the next."""
        if self.events:
            self._close_step()
        self._sync()
        wall = time.perf_counter() - self.window_start
        if self.events:
            busy = sum(start.elapsed_time(end) for start, end in self.step_events) / 1000
            data = max(0.0, wall - busy)
        else:
            data = min(self.waited_s, wall)
        window = Window(self.steps, self.images, wall, data)
        self._reset()
        return window
