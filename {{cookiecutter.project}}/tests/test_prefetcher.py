"""Prefetchers hand over the same batches as the plain loader, keep its length and sampler, and stop cleanly."""
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.device import ToDevice
from {{ cookiecutter.package }}.data.loaders import make_loader
from {{ cookiecutter.package }}.data.prefetcher import cuda_stream, none, resident, thread

from helpers.machines import DEVICE
from helpers.paths import CONF

CPU = torch.device("cpu")
PREFETCHERS = sorted(path.stem for path in (CONF / "prefetcher").glob("*.yaml"))
MAKERS = {"none": none, "thread": lambda loader, to_device: thread(loader, to_device, depth=2),
          "cuda_stream": cuda_stream, "resident": resident}
REPLAYS = {"resident"}  # hands out one batch again and again, by design


def uint8_batches() -> DataLoader:
    images = torch.randint(0, 256, (10, 4, 4, 3), dtype=torch.uint8)  # NHWC, as workers deliver them
    return DataLoader(TensorDataset(images, torch.arange(10)), batch_size=3)


def test_every_prefetcher_has_a_maker():
    assert set(PREFETCHERS) == set(MAKERS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.gpu) if n == "cuda_stream" else n
                                  for n in PREFETCHERS if n not in REPLAYS]
                         + [pytest.param("thread", marks=pytest.mark.gpu, id="thread-on-its-side-stream")])
def test_yields_exactly_the_plain_batches(name):
    loader = uint8_batches()
    to_device = ToDevice(PilDecoder(), DEVICE, non_blocking=True)
    expected = [to_device(batch) for batch in loader]
    prefetched = MAKERS[name](loader, to_device)
    assert len(prefetched) == len(loader) == 4
    for _ in range(2):  # a second epoch starts over
        got = list(prefetched)
        assert len(got) == len(expected)
        for (images, labels), (want_images, want_labels) in zip(got, expected):
            assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_resident_replays_the_first_batch_without_loading_again():
    loaded = []

    class Counted(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, item):
            index, _ = item  # the training sampler hands out (index, epoch)
            loaded.append(index)
            return torch.full((2, 2, 3), index, dtype=torch.uint8), index

    batches = resident(make_loader(Counted(), 3, True, 0, World(0, 0, 1, CPU), 0, 2, False, False),
                       ToDevice(PilDecoder(), CPU, False))
    steps = list(batches)
    assert len(steps) == len(batches) == 3 and steps[0][1].tolist() == loaded
    assert all(images is steps[0][0] for images, _ in steps)
    batches.set_epoch(1, skip_images=6)
    assert len(list(batches)) == len(batches) == 1  # a resumed epoch replays only the batches it has left
    assert len(loaded) == 3  # one batch was ever loaded


def test_thread_prefetcher_runs_ahead_in_the_background():
    seen = []

    class Slow(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, index):
            seen.append(threading.current_thread().name)
            return torch.zeros(2, 2, 3, dtype=torch.uint8), index

    batches = thread(DataLoader(Slow(), batch_size=2), ToDevice(PilDecoder(), CPU, False), depth=2)
    assert [labels.tolist() for _, labels in batches] == [[0, 1], [2, 3], [4, 5]]
    assert set(seen) == {"prefetcher"}


def test_thread_prefetcher_hands_errors_over_and_stops_when_left_early():
    class Broken(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            if index == 2:
                raise ValueError("bad sample 2")
            return torch.zeros(2, 2, 3, dtype=torch.uint8), index

    batches = thread(DataLoader(Broken(), batch_size=1), ToDevice(PilDecoder(), CPU, False), depth=1)
    with pytest.raises(ValueError, match="bad sample 2"):
        list(batches)
    before = threading.active_count()
    for _ in zip(range(1), thread(uint8_batches(), ToDevice(PilDecoder(), CPU, False), depth=1)):
        pass  # leaving after one batch must not leave a thread blocked on a full queue
    assert threading.active_count() == before


@pytest.mark.parametrize("last", ["end", "error"])
def test_thread_prefetcher_left_with_a_full_queue_returns_at_once(last):
    """The consumer leaves (its step failed) while the thread waits to queue the loader's end or error."""
    class TwoThenLast(Dataset):
        def __len__(self):
            return 3 if last == "error" else 2

        def __getitem__(self, index):
            if index == 2:
                raise ValueError("the loader's own failure, after the consumer left")
            return torch.zeros(2, 2, 3, dtype=torch.uint8), index

    def consume_one_then_fail():
        batches = iter(thread(DataLoader(TwoThenLast(), batch_size=1), ToDevice(PilDecoder(), CPU, False), depth=1))
        next(batches)
        time.sleep(0.3)  # the thread queues batch 2 and then waits with the last item
        batches.close()

    consumer = threading.Thread(target=consume_one_then_fail, daemon=True)
    consumer.start()
    consumer.join(timeout=10)
    assert not consumer.is_alive()


def test_cuda_stream_is_refused_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="prefetcher=cuda_stream .* no GPU: pick prefetcher=thread"):
        cuda_stream(uint8_batches(), ToDevice(PilDecoder(), CPU, False))
    with pytest.raises(ConfigError, match="prefetcher.depth=0"):
        thread(uint8_batches(), ToDevice(PilDecoder(), CPU, False), depth=0)


class PinnedBatches:
    """Ready uint8 batches in page-locked memory, as pinned loader workers hand them over, at no host cost."""

    def __init__(self, count: int, shape: tuple[int, ...]):
        self.batches = [(torch.randint(0, 256, shape, dtype=torch.uint8).pin_memory(), torch.arange(shape[0]))
                        for _ in range(count)]
        self.batch_size = shape[0]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


@pytest.mark.gpu
def test_cuda_stream_copies_on_a_side_stream_while_the_step_computes(gpu_busy):
    loader = PinnedBatches(12, (16, 512, 512, 3))  # 12 MB a batch: about a millisecond to copy
    plain = ToDevice(PilDecoder(), DEVICE, non_blocking=True)
    streams = []

    class Recorded(ToDevice):
        """The stream each batch is made on."""

        def stream(self, batches):
            for batch in super().stream(batches):
                streams.append(torch.cuda.current_stream())
                yield batch

    to_device = Recorded(PilDecoder(), DEVICE, non_blocking=True)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    plain(loader.batches[0])
    end.record()
    end.synchronize()
    copy_s = start.elapsed_time(end) / 1000

    def epoch_seconds(prefetcher) -> float:
        torch.cuda.synchronize()
        began = time.perf_counter()
        for images, _ in prefetcher:
            gpu_busy(copy_s)  # a step that computes as long as a copy takes
            images.sum()
        torch.cuda.synchronize()
        return time.perf_counter() - began

    epoch_seconds(none(loader, plain))  # warm-up
    serial, overlapped = epoch_seconds(none(loader, plain)), epoch_seconds(cuda_stream(loader, to_device))
    main = torch.cuda.default_stream()
    assert len(streams) == len(loader) and all(stream != main for stream in streams)
    assert overlapped < 0.8 * serial, (overlapped, serial, copy_s)
