"""Assembling the loaders: the data, format, staging, order, decoder and prefetcher options, each built from
its own node, into training and validation batches that reach the step as normalised float images on the device.

The loop sees `Loaders` and nothing of which options were picked.
"""
import random
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from functools import partial

import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from .. import options
from ..contracts import Decoder, Layout, Order, Prefetcher, ResumableLoader, Stores
from ..core.config import RANGES, build
from ..core.distributed import World
from ..core.failures import STOP_SIGNALS
from ..core.faults import Faults, FaultyReads
from .batch_memory import lend_batches
from .coverage import EpochTrace
from .crops import CenterCrop
from .device import ToDevice, UploadTimes
from .fit import check_fit, check_order
from .images import Images, Splits, make_splits
from .order import FULL_SHUFFLE
from .resident import fitting
from .sampling import EpochBatches, EpochSampler, Shard, agreed_layout
from .workers import pick_num_workers, work_of


@dataclass
class Loaders:
    train: Prefetcher
    val: Prefetcher
    num_workers: int  # as given, or as loader.num_workers=auto measured it
    splits: Splits
    upload_times: UploadTimes  # the training batches': waiting for the loader, and uploading (a batch decoder decodes)
    setup: dict[str, float]  # seconds opening the data (listing it, or reading a kept index), then picking workers
    pack_fits: str | None = None  # a pixel pack read in loader workers that the device's memory could hold: the fact

    @property
    def classes(self) -> list[str]:
        return self.splits.classes

    @property
    def train_crop_size(self) -> int:
        """The side the training crop ends at: data.crop_size, or data.train_crop_size where one is set."""
        return self.splits.train.crop.schedule.final

    def crop_sizes(self, epochs: int) -> set[int]:
        """The training crop's sides over `epochs` epochs: one, unless the crop grows (progressive resizing)."""
        return self.splits.train.crop.schedule.sizes(epochs)

    def skipped_files(self, world: World) -> int:
        """Unreadable files met so far, counted once each across workers and processes."""
        return self.splits.skipped_files(world)

    def share_unreadable(self, world: World) -> None:
        """At each logging window: the same unreadable images, and the same decision on them, in every process."""
        self.splits.share_unreadable(world)


def start_worker(worker_id: int, lent_batches: int = 0) -> None:
    """Seed Python's and NumPy's generators from the per-worker, per-epoch seed torch gives each worker; keep
    `lent_batches` batch buffers for the worker to use again (batch_memory.py), where that is more than none."""
    # Ctrl-C and a scheduler's signals reach the workers too; the training process alone decides how to stop.
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
    if lent_batches:
        lend_batches(lent_batches)


def training_worker_start(prefetch_factor: int) -> Callable[[int], None]:
    """A training loader's worker_init_fn: a buffer for each batch the worker has prefetched and for the two the
    training process may still hold, the step's and the one handed over before it. Validation's workers keep none,
    since they sit idle, holding them, through each epoch of training."""
    return partial(start_worker, lent_batches=prefetch_factor + 2)


class SampledLoader(DataLoader):
    """A DataLoader over our samplers, a `ResumableLoader` (contracts/). Where an epoch stands is all a resumed
    run needs, since augmentation is seeded per image, and the layout of readers the epoch's order was drawn for.

    With workers kept between epochs, one iterator of the DataLoader runs over the batches of epoch after epoch
    (EpochBatches), and each epoch takes its own from it: the workers are already decoding the next epoch when this
    one ends. An epoch that is not the one that iterator goes on with (a resumed epoch, an epoch left part-way)
    starts a new iterator, which drops what the workers had begun.

    Each batch it yields is traced (coverage.py): which images it holds, as the batch sampler dispatched them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stream, self.stream_goes_on_with = None, None  # the iterator, and the (epoch, skip, layout) it is at
        self.trace = None

    @property
    def epoch_sampler(self) -> EpochSampler:
        return self.batch_sampler.sampler

    def set_epoch(self, epoch: int, skip_images: int = 0) -> None:
        """Shuffle for `epoch`, leaving out the first `skip_images` images all processes trained on; the
        loader's len is then the batches left."""
        self.epoch_sampler.set_epoch(epoch, skip_images)
        self.trace = None

    def new_stream(self):
        self.batch_sampler.dispatched.clear()  # what an iterator left behind had dispatched, never to be yielded
        return super().__iter__()

    def traced(self, batch):
        """`batch`, once its images are in this epoch's trace."""
        plan, number = self.batch_sampler.dispatched.popleft()
        if self.trace is None:
            self.trace = EpochTrace(plan, self.num_workers)
        assert plan is self.trace.plan and number == len(self.trace.taken), "batches out of the order dispatched"
        self.trace.took(plan.indices(number))
        return batch

    def __iter__(self):
        if not self.batch_sampler.endless:  # one epoch, and its workers end with it
            for batch in self.new_stream():
                yield self.traced(batch)
            return
        sampler = self.epoch_sampler
        if self.stream is None or self.stream_goes_on_with != (sampler.epoch, sampler.skip, sampler.epoch_layout):
            self.stream = self.new_stream()
        self.stream_goes_on_with = None  # until this epoch has been taken whole
        for _ in range(len(self)):
            yield self.traced(next(self.stream))
        self.stream_goes_on_with = (sampler.epoch + 1, 0, sampler.layout)

    def coverage(self) -> EpochTrace | None:
        return self.trace

    def state(self, epoch: int, images_done: int) -> dict:
        return {"layout": asdict(self.epoch_sampler.epoch_layout)}

    def load_state(self, state: dict) -> None:
        if "layout" in state:
            self.epoch_sampler.resume_layout(Layout(**state["layout"]))


def make_loader(dataset: Images | Dataset, batch_size: int, train: bool, seed: int, world: World,
                num_workers: int, prefetch_factor: int, pin_memory: bool, persistent_workers: bool,
                collate=None, order: Order = FULL_SHUFFLE, layout: Layout | None = None) -> SampledLoader | DataLoader:
    """Training batches are shuffled and full, a different share per process; validation covers each image once.

    The training sampler serves a single process too; its order depends only on seed, epoch and `layout` (the
    processes' agreed one; by default every process as this one), so a resumed run sees the order the uninterrupted
    one would have, from the batch where it stopped. `order` draws that order (validation's is the stored one).
    """
    settings = dict(num_workers=num_workers, collate_fn=collate, pin_memory=pin_memory and world.device.type == "cuda",
                    prefetch_factor=prefetch_factor if num_workers else None,
                    persistent_workers=persistent_workers and num_workers > 0,
                    worker_init_fn=training_worker_start(prefetch_factor) if train else start_worker,
                    generator=torch.Generator().manual_seed(seed + world.rank))  # a new worker base seed each epoch
    if not train:
        return DataLoader(dataset, batch_size=batch_size, sampler=Shard(dataset, world), **settings)
    sampler = EpochSampler(dataset, world.rank, seed, order, layout or Layout(world.size, num_workers, batch_size))
    return SampledLoader(dataset, batch_sampler=EpochBatches(sampler, settings["persistent_workers"]), **settings)


def training_loader(stores: Stores, images: Images, batch_size: int, seed: int, world: World, collate,
                    order: Order = FULL_SHUFFLE, layout: Layout | None = None, **settings) -> ResumableLoader:
    """Ours, in `order` drawn for `layout`, or the format's own where it shards and shuffles the stream itself."""
    if stores.train_loader is None:
        return make_loader(images, batch_size, True, seed, world, collate=collate, order=order, layout=layout,
                           **settings)
    return stores.train_loader(images, world=world, batch_size=batch_size, seed=seed, collate=collate,
                               worker_init_fn=training_worker_start(settings["prefetch_factor"]),
                               **{**settings, "pin_memory": settings["pin_memory"] and world.device.type == "cuda"})


def data_setting(data: DictConfig, format: DictConfig) -> str:
    """The setting that says where this process reads its images: a pack's format.path, else data.root, or the
    built-in set's data.cache_dir (every data option has one of them, checked before the stores opened)."""
    return next(f"{group}.{key}={node[key]}" for group, node, key in
                (("format", format, "path"), ("data", data, "root"), ("data", data, "cache_dir"))
                if node.get(key) is not None)


def make_loaders(data: DictConfig, format: DictConfig, staging: DictConfig, order: DictConfig, decoder: DictConfig,
                 prefetcher: DictConfig, loader: DictConfig, *, batch_size: int, seed: int, world: World,
                 memory_format: torch.memory_format, faults: Faults = Faults(),
                 augment: DictConfig | None = None) -> Loaders:
    """Stages 1 to 11 of data/README.md, each from its option's node, with the `faults` this process injects.
    Options that cannot work together are refused first, from their facts. The sampler's layout (5) is agreed after
    the decoder and augmentation (6, 7) are built: it depends on the worker count, which loader.num_workers=auto
    finds by timing their batches."""
    check_fit(format, staging, decoder, order, augment)
    started = time.perf_counter()
    source = build(data)  # 1: where the images are, the crops to cut
    staged = build(staging, world=world)
    stores = build(format).stores(source, staged)  # 2 and 3: a copy in RAM, the stores
    opened = time.perf_counter()
    visiting = build(order)  # 4: the epoch's order, and the runs its workers read
    check_order(stores, order)
    whole, stores = stores, replace(stores, train=visiting.reads(stores.train))
    on_device = options.facts_of(staging).on_device  # the batches made there, from the whole pack: no worker
    decoding = build(decoder)  # 6: decode and crop
    decoding.check_device(world.device)
    splits = make_splits(source, stores, decoding, seed)
    work = augment_training(splits.train, augment, decoding, source.train_crop_size)  # 7: the augmentation policy
    inject_reads(splits.train, faults)
    settings = {key: value for key, value in loader.items() if key != RANGES}
    non_blocking = settings.pop("non_blocking")

    def swept(workers: int) -> Iterable:
        """What loader.num_workers=auto times: batches as the step receives them, from `workers` workers."""
        return decoding.uploads(training_loader(stores, splits.train, batch_size, seed, world, decoding.collate,
                                                visiting, **{**settings, "num_workers": workers,
                                                             "persistent_workers": False}),
                                world.device, non_blocking)

    settings["num_workers"] = 0 if on_device else pick_num_workers(  # 9's
        settings["num_workers"], splits.train, batch_size, work, swept, decodes_beside=decoding.queued_batches > 0,
        device=world.device)
    counted = time.perf_counter()
    layout = agreed_layout(  # 5: the sampler's layout, every process's
        world, settings["num_workers"], batch_size, read_from=data_setting(data, format),
        data={"the number of training images": len(splits.train), "the number of validation images": len(splits.val)},
        settings={"the seed": seed, "the batch size": batch_size,
                  "the order's settings": f"order={options.name_of('order', order)} {vars(visiting)}"})
    if faults.unagreed_workers >= 0:  # this process draws its order as if every process had its own worker count
        settings["num_workers"] = faults.unagreed_workers
        layout = Layout(world.size, faults.unagreed_workers, batch_size)
    if on_device:  # 5, 8 and 9 on the device: the sampler, and each batch cut there
        train, val = staged.loaders(whole, splits.train.crop, CenterCrop(source.crop_size, source.val_resize), world,
                                    batch_size, seed, visiting, layout)
    else:  # 5, 8 and 9: the sampler, the timed collate and the loader
        train = training_loader(stores, splits.train, batch_size, seed, world,
                                splits.train.times.timed(decoding.collate), visiting, layout, **settings)
        val = make_loader(splits.val, batch_size, False, seed, world, collate=splits.val.times.timed(decoding.collate),
                          **settings)
    # 10: a ToDevice each, so that the training batches' upload times leave out validation's.
    to_device, val_to_device = (ToDevice(decoding, world.device, non_blocking, memory_format, source.mean, source.std)
                                for _ in range(2))
    train = build(prefetcher, to_device=to_device, loader=train)  # 11
    val = build(prefetcher, to_device=val_to_device, loader=val)
    held = not on_device and options.facts_of(format).holds_pixels  # the pack a staging on the device could hold
    return Loaders(train, val, settings["num_workers"], splits, to_device.times,
                   setup={"data_s": opened - started, "workers_s": counted - opened},
                   pack_fits=fitting(whole, world.device) if held else None)


def augment_training(train: Images, augment: DictConfig | None, decoding: Decoder, crop_size: int) -> str:
    """Wrap the training split's transform in the augmentation policy (evaluate's loaders have none); what the
    workers and the decoder then do to each image, as `work_of` tells it apart."""
    plain = train.transform
    if augment is not None:
        train.transform = build(augment, transform=plain, decoder=decoding)
    return work_of(decoding, crop_size, train.transform if train.transform is not plain else None)


def inject_reads(train: Images, faults: Faults) -> None:
    """Slow the training split's reads, or fail one, where `faults` asks."""
    if faults.worker_error_at > 0 or faults.read_delay_ms > 0:
        train.transform = FaultyReads(train.transform, faults.worker_error_at, faults.read_delay_ms / 1000)
