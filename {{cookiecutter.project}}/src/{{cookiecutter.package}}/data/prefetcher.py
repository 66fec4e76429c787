"""How batches reach the device: `prefetcher=none|thread|cuda_stream|resident`.

Each is a `Prefetcher` (contracts/): it wraps the loader, keeps its len and place in the epoch, and yields
(normalised images, labels) on the device.
- `none`: copy and normalise in the training thread, just before the step.
- `thread`: a background thread keeps `depth` batches copied and normalised ahead (pick when the host
  side of a batch, collation and the copy, shows up as data time). On CUDA it queues them on a side stream,
  so that the training stream holds only the step's work, as the timing split assumes.
- `cuda_stream`: the copy and normalisation of batch i+1 run on a side CUDA stream while batch i computes.
- `resident`: no loading at all. The first batch stays on the device and is replayed for every step: the
  compute ceiling, timed by the same loop as the real pipelines it is compared with. (Validation scores
  are then those of one batch.)
"""
import queue
import threading
from collections.abc import Iterator
from contextlib import closing

import torch

from ..contracts import Batch, Prefetcher, ResumableLoader
from ..core.errors import ConfigError
from .device import ToDevice


class NoPrefetcher(Prefetcher):
    """Each batch copied and normalised in the training thread, just before its step."""

    def __iter__(self) -> Iterator[Batch]:
        yield from self.to_device.stream(self.loader)


class _Raised:
    """An exception from the background thread, re-raised in the training thread."""

    def __init__(self, error: BaseException):
        self.error = error


class ThreadPrefetcher(Prefetcher):
    """A bounded queue of ready batches filled by a background thread, in the spirit of BackgroundGenerator."""

    def __init__(self, loader: ResumableLoader, to_device: ToDevice, depth: int):
        super().__init__(loader, to_device)
        self.depth, self.side = depth, None

    def __iter__(self) -> Iterator[Batch]:
        ready, stop = queue.Queue(self.depth), threading.Event()
        done = object()

        def offer(item) -> bool:
            """Queue `item` unless the consumer has left; a blocking put would wait for it forever."""
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        if self.to_device.device.type == "cuda":  # one for every pass: the caching allocator reuses memory only on
            self.side = self.side or torch.cuda.Stream(self.to_device.device)  # the stream that took it
        side = self.side

        def fill() -> None:
            try:
                if side is not None:  # a new thread's device is GPU 0: on another, leaving the stream would touch it
                    torch.cuda.set_device(side.device)  # indexed, where to_device's may be a bare "cuda"
                with torch.cuda.stream(side), closing(self.to_device.stream(self.loader)) as batches:  # no side: no-op
                    for batch in batches:
                        if not offer((batch, side.record_event() if side else None)):
                            return
                offer(done)
            except BaseException as error:  # noqa: BLE001 - handed to the training thread as it is
                offer(_Raised(error))

        thread = threading.Thread(target=fill, daemon=True, name="prefetcher")
        thread.start()
        try:
            while (item := ready.get()) is not done:
                if isinstance(item, _Raised):
                    raise item.error
                batch, uploaded = item
                yield on_current_stream(batch, uploaded) if uploaded else batch
        finally:
            stop.set()  # a consumer that stops early (max_steps, limit_val_batches) frees the thread
            thread.join()


class CudaStreamPrefetcher(Prefetcher):
    """Apex's data_prefetcher: batch i+1 is copied and normalised on a side stream while batch i computes."""

    def __init__(self, loader: ResumableLoader, to_device: ToDevice):
        super().__init__(loader, to_device)
        self.stream = None

    def __iter__(self) -> Iterator[Batch]:
        self.stream = stream = self.stream or torch.cuda.Stream()  # one for every pass, as for the thread's
        batches = self.to_device.stream(self.loader)

        def preload():
            with torch.cuda.stream(stream):
                batch = next(batches, None)
                return None if batch is None else (batch, stream.record_event())

        upcoming = preload()
        while upcoming is not None:
            batch = on_current_stream(*upcoming)
            upcoming = preload()
            yield batch


def on_current_stream(batch: Batch, uploaded: torch.cuda.Event) -> Batch:
    """A batch made on a side stream, handed to the current one: it waits for the upload, and the caching
    allocator does not reuse the batch's memory until the current stream's work on it is done."""
    current = torch.cuda.current_stream()
    current.wait_event(uploaded)
    for tensor in batch:
        tensor.record_stream(current)
    return batch


class ResidentBatch(Prefetcher):
    """The first batch, copied and normalised once, then handed out as many times as the loader has batches."""

    def __init__(self, loader: ResumableLoader, to_device: ToDevice):
        super().__init__(loader, to_device)
        self.batch = None

    def __iter__(self) -> Iterator[Batch]:
        if self.batch is None:
            self.batch = self.to_device(next(iter(self.loader)))
        for _ in range(len(self)):
            yield self.batch

    def coverage(self) -> None:
        """Its epochs replay one batch: there is no epoch's coverage to check."""
        return None


def none(loader: ResumableLoader, to_device: ToDevice) -> Prefetcher:
    return NoPrefetcher(loader, to_device)


def thread(loader: ResumableLoader, to_device: ToDevice, depth: int) -> Prefetcher:
    if depth < 1:
        raise ConfigError(f"prefetcher.depth={depth}: keep at least 1 batch ready")
    return ThreadPrefetcher(loader, to_device, depth)


def cuda_stream(loader: ResumableLoader, to_device: ToDevice) -> Prefetcher:
    if not torch.cuda.is_available():
        raise ConfigError("prefetcher=cuda_stream overlaps copies on a CUDA stream and this run has no GPU: "
                          "pick prefetcher=thread")
    return CudaStreamPrefetcher(loader, to_device)


def resident(loader: ResumableLoader, to_device: ToDevice) -> Prefetcher:
    return ResidentBatch(loader, to_device)
