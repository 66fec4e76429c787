"""`staging=device`: a pack of decoded pixels (format=tensor) held whole in the training device's memory, and each batch
made there from the sampler's indices: a random-resized crop and flip for training, the centre crop for validation,
cut for all of a batch's images at once, with no loader worker and no Python per image. Pick it for a data set that
fits beside the model (Fashion-MNIST 47 MB, CIFAR 150 MB, ImageNet at 64 px 16 GB) and whose loader workers cannot
keep up with the step.

On a GPU the pack is copied into its memory once a run. On a CPU it stays memory-mapped and is read through once, so
that the page cache holds it: the processes of a machine share those pages.

Each training crop is drawn per image from (seed, epoch, index), as the loader workers draw theirs, by the same rule
(torchvision's RandomResizedCrop: ten tries, then the centre at the nearest ratio), from a counter-based hash instead
of Python's generator: an image gets the same crop whatever batch, process or resume it is read in. The crop is
resized as the workers' OpenCV resizes it: bilinearly with pixel centres aligned and the crop's edge pixels repeated,
and averaged over each output pixel's area where the crop is twice the output's side or more.
"""
from dataclasses import asdict

import numpy as np
import psutil
import torch
from omegaconf import OmegaConf

from .. import options
from ..contracts import Layout, Order
from ..core.distributed import World
from ..core.errors import ConfigError
from .coverage import EpochTrace, hashed
from .crops import CenterCrop, TrainCrop
from .sampling import EpochSampler

GIB = 1 << 30
PAGE_PIXELS = 4096 // 3  # pixels in a 4 KiB page, at most
AREA_SAMPLES = 8  # samples a side, at most, that average an output pixel's area where the box is far larger
TRIES = 10  # torchvision's RandomResizedCrop tries this many boxes before it falls back to the centre
DRAWS = 2 * TRIES + 3  # uniforms per image and epoch: area and ratio per try, then left, top and the flip


def uniforms(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """DRAWS numbers in [0, 1) for each image, from (seed, epoch, index) alone: [len(indices), DRAWS]."""
    salts = hashed(np.arange(DRAWS, dtype=np.int64) + (seed * 1_000_003 + epoch) * DRAWS, 0x5DEECE66D)
    mixed = hashed(indices.astype(np.int64)[:, None] ^ salts[None, :].view(np.int64), 0x2545F4914F6CDD1D)
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)  # the top 53 bits: a double's mantissa


def train_boxes(widths: np.ndarray, heights: np.ndarray, crop: TrainCrop, drawn: np.ndarray) -> tuple:
    """(left, top, width, height) in whole pixels and the flips of each image's crop, by TrainCrop's rule, from its
    `drawn` uniforms; each array as long as the batch."""
    area = (widths * heights).astype(np.float64)[:, None]
    target = area * (crop.scale[0] + (crop.scale[1] - crop.scale[0]) * drawn[:, :TRIES])
    aspect = np.exp(crop.log_ratio[0] + (crop.log_ratio[1] - crop.log_ratio[0]) * drawn[:, TRIES:2 * TRIES])
    tried_w, tried_h = np.round(np.sqrt(target * aspect)), np.round(np.sqrt(target / aspect))
    fits = (tried_w > 0) & (tried_w <= widths[:, None]) & (tried_h > 0) & (tried_h <= heights[:, None])
    first = fits.argmax(axis=1)  # the first try that fits, as the loop takes it
    rows = np.arange(len(widths))
    # Where no try fits: the centre at the nearest allowed ratio.
    ratio = widths / heights
    fallback_w = np.where(ratio < crop.ratio[0], widths, np.where(ratio > crop.ratio[1],
                                                                  np.round(heights * crop.ratio[1]), widths))
    fallback_h = np.where(ratio < crop.ratio[0], np.round(widths / crop.ratio[0]), heights)
    fitted = fits.any(axis=1)
    box_w = np.where(fitted, tried_w[rows, first], fallback_w).astype(np.int64)
    box_h = np.where(fitted, tried_h[rows, first], fallback_h).astype(np.int64)
    # random.randint(0, room), both ends included, where a try fitted; the middle, rounded down, where none did.
    left = np.where(fitted, np.floor(drawn[:, 2 * TRIES] * (widths - box_w + 1)), (widths - box_w) // 2)
    top = np.where(fitted, np.floor(drawn[:, 2 * TRIES + 1] * (heights - box_h + 1)), (heights - box_h) // 2)
    return (np.stack([left, top, box_w, box_h], axis=1).astype(np.int64), drawn[:, 2 * TRIES + 2] < 0.5)


def center_boxes(widths: np.ndarray, heights: np.ndarray, crop: CenterCrop) -> np.ndarray:
    """(left, top, width, height) in whole pixels of each image's centre crop, as the workers round CenterCrop's box
    (decoder.pixel_box)."""
    side = crop.size * np.minimum(widths, heights) / crop.resize
    left, top = (widths - side) / 2, (heights - side) / 2
    first_x, first_y = np.minimum(left.astype(np.int64), widths - 1), np.minimum(top.astype(np.int64), heights - 1)
    last_x = np.maximum(first_x + 1, np.minimum(np.round(left + side), widths)).astype(np.int64)
    last_y = np.maximum(first_y + 1, np.minimum(np.round(top + side), heights)).astype(np.int64)
    return np.stack([first_x, first_y, last_x - first_x, last_y - first_y], axis=1)


class DevicePack:
    """One split of a pixel pack in the device's memory: every image's pixels end to end (RGB triples), where each
    begins, its size, and the labels."""

    def __init__(self, store, device: torch.device):
        # Copy-on-write: a view torch may take as writable, which nothing writes, so nothing is copied.
        pixels = torch.from_numpy(np.memmap(store.path, np.uint8, "c")).view(-1, 3)
        if device.type == "cuda":
            self.pixels = pixels.to(device)
        else:
            self.pixels = pixels
            int(pixels[::PAGE_PIXELS].sum())  # read through once, a pixel a page: the page cache holds the pack
        index = np.asarray(store.index, dtype=np.int64)
        self.heights, self.widths = index[:, 1], index[:, 2]  # on the host: the boxes are drawn there
        self.starts = torch.from_numpy(index[:, 0] // 3).to(device)  # in pixels
        self.row_pixels = torch.from_numpy(self.widths.copy()).to(device)
        self.labels = torch.from_numpy(np.asarray(store.labels, dtype=np.int64)).to(device)
        self.device = device

    def crops(self, indices: np.ndarray, boxes: np.ndarray, flips: np.ndarray, size: int) -> torch.Tensor:
        """Each image's box resized to size x size, mirrored where `flips` says: uint8 NHWC on the device. As OpenCV
        resizes the workers' crops: bilinear with pixel centres aligned and the box's edge pixels repeated past it;
        and a box at least twice the output each way averaged over each output pixel's area, from bilinear samples
        on a grid of as many a side as the box is times the output (AREA_SAMPLES at most), where a single sample
        would alias. Images of one grid are cut together, a few kernels for each grid a batch holds: each image's
        pixels depend on it alone, not on the batch it is in."""
        factors = boxes[:, 2:] / size  # each box's side over the output's: x, y
        grids = np.where(factors.min(axis=1) >= 2, np.minimum(AREA_SAMPLES, np.ceil(factors.max(axis=1))), 1)
        if len(set(grids.tolist())) == 1:
            return self.resized(indices, boxes, flips, size, int(grids[0]))
        cut = torch.empty((len(indices), size, size, 3), dtype=torch.uint8, device=self.device)
        for grid in np.unique(grids):
            members = np.flatnonzero(grids == grid)
            cut[torch.from_numpy(members).to(self.device)] = self.resized(indices[members], boxes[members],
                                                                           flips[members], size, int(grid))
        return cut

    def resized(self, indices: np.ndarray, boxes: np.ndarray, flips: np.ndarray, size: int, grid: int) -> torch.Tensor:
        """The boxes resized from `grid` x `grid` bilinear samples an output pixel, over its area (one: at its
        centre)."""
        device = self.device
        box = torch.from_numpy(boxes).to(device, torch.float32)
        # Each output pixel's samples, relative to its centre, in output pixels.
        offsets = (torch.arange(grid, device=device, dtype=torch.float32) + 0.5) / grid - 0.5
        steps = torch.arange(size, device=device, dtype=torch.float32) + 0.5
        xs = self.sampled(box[:, 0], box[:, 2], steps, offsets)
        xs = torch.where(torch.from_numpy(flips).to(device)[:, None], xs.flip(1), xs)
        ys = self.sampled(box[:, 1], box[:, 3], steps, offsets)
        x0, y0 = xs.floor(), ys.floor()
        x1 = torch.minimum(x0 + 1, (box[:, 0] + box[:, 2] - 1)[:, None])
        y1 = torch.minimum(y0 + 1, (box[:, 1] + box[:, 3] - 1)[:, None])
        wx, wy = (xs - x0)[:, None, :, None], (ys - y0)[:, :, None, None]
        at = torch.from_numpy(indices).to(device)
        starts, row = self.starts[at][:, None], self.row_pixels[at][:, None]

        def pixels(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # [B, S * grid, S * grid, 3] floats
            rows = (starts + y.long() * row)[:, :, None]
            return self.pixels[rows + x.long()[:, None, :]].float()

        upper = torch.lerp(pixels(y0, x0), pixels(y0, x1), wx)
        lower = torch.lerp(pixels(y1, x0), pixels(y1, x1), wx)
        sampled = torch.lerp(upper, lower, wy)
        if grid > 1:
            sampled = sampled.view(len(indices), size, grid, size, grid, 3).mean(dim=(2, 4))
        return sampled.round_().clamp_(0, 255).to(torch.uint8)

    @staticmethod
    def sampled(start: torch.Tensor, length: torch.Tensor, steps: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Where each output pixel's samples fall in the source, kept inside the box: [B, S * grid], each pixel's
        `offsets` (in output pixels) around its centre."""
        scale = (length / len(steps))[:, None, None]
        where = start[:, None, None] + (steps[None, :, None] + offsets[None, None, :]) * scale - 0.5
        return torch.maximum(torch.minimum(where.flatten(1), (start + length - 1)[:, None]), start[:, None])


def pack_bytes(stores) -> int:
    return sum(np.memmap(store.path, np.uint8, "r").nbytes for store in (stores.train, stores.val))


def free_bytes(device: torch.device) -> int:
    """Memory this device can still give: the GPU's free memory, or the RAM the OS can give the process."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else psutil.virtual_memory().available


def fits(stores, device: torch.device, reserve_gb: float) -> tuple[bool, str]:
    """Whether both splits of the pack fit in the device's free memory with `reserve_gb` to spare, and the fact, in
    words."""
    needed, free = pack_bytes(stores), free_bytes(device)
    enough = needed + reserve_gb * GIB <= free
    return enough, (f"the pack's {amount(needed)} {'fit' if enough else 'do not fit'} in the {device.type}'s "
                    f"{amount(free)} free with staging.reserve_gb={reserve_gb:g} to spare")


def amount(count: int) -> str:
    """Bytes in words: MiB under a GiB, GiB above."""
    return f"{count / 2**20:.1f} MiB" if count < GIB else f"{count / GIB:.2f} GiB"


def fitting(stores, device: torch.device) -> str | None:
    """Where a pixel pack would fit in the device's memory under this option's own settings, the fact, for the advice
    to a run that reads it in loader workers; None where it would not."""
    node = OmegaConf.load(options.CONF / "staging" / f"{options.only('staging', 'on_device')}.yaml")
    enough, fact = fits(stores, device, node.reserve_gb)
    return fact if enough else None


class DeviceBatches:
    """A split's batches made on the device, a `ResumableLoader` (contracts/): training in the sampler's order (every
    image once an epoch, the coverage trace, a resume on the layout its epoch began with), validation in rank order
    as `Shard` gives it. Yields (uint8 NHWC images, labels) on the device, as a loader's collate would on the host."""

    def __init__(self, pack: DevicePack, batch_size: int, world: World, crop, seed: int, order: Order | None,
                 layout: Layout | None):
        self.pack, self.batch_size, self.world, self.crop, self.seed = pack, batch_size, world, crop, seed
        self.train = order is not None
        size = len(pack.labels)
        self.sampler = EpochSampler(range(size), world.rank, seed, order, layout) if self.train else None
        self.shard = np.arange(world.rank, size, world.size)
        self.trace = None

    def set_epoch(self, epoch: int, skip_images: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip_images)
        self.trace = None

    def __len__(self) -> int:
        if not self.train:
            return -(-len(self.shard) // self.batch_size)
        return len(self.sampler) // self.batch_size

    def __iter__(self):
        if not self.train:
            for start in range(0, len(self.shard), self.batch_size):
                indices = self.shard[start:start + self.batch_size]
                boxes = center_boxes(self.pack.widths[indices], self.pack.heights[indices], self.crop)
                yield self.pack.crops(indices, boxes, np.zeros(len(indices), bool), self.crop.size), \
                    self.pack.labels[torch.from_numpy(indices).to(self.pack.device)]
            return
        sampler = self.sampler
        plan = sampler.plan(sampler.epoch, sampler.skip, sampler.epoch_layout)
        self.trace = EpochTrace(plan, 0)
        size = self.crop.schedule.size(plan.epoch)
        for batch in range(plan.batches):
            indices = plan.indices(batch)
            drawn = uniforms(self.seed, plan.epoch, indices)
            boxes, flips = train_boxes(self.pack.widths[indices], self.pack.heights[indices], self.crop, drawn)
            images = self.pack.crops(indices, boxes, flips, size)
            self.trace.took(indices)
            yield images, self.pack.labels[torch.from_numpy(indices).to(self.pack.device)]

    def state(self, epoch: int, images_done: int) -> dict:
        return {"layout": asdict(self.sampler.epoch_layout)}

    def load_state(self, state: dict) -> None:
        if "layout" in state:
            self.sampler.resume_layout(Layout(**state["layout"]))

    def coverage(self) -> EpochTrace | None:
        return self.trace


def device_loaders(stores, train_crop: TrainCrop, val_crop: CenterCrop, world: World, batch_size: int, seed: int,
                   order: Order, layout: Layout, reserve_gb: float) -> tuple[DeviceBatches, DeviceBatches]:
    """The training and validation batches of a pixel pack held in `world.device`'s memory; refused in one line where
    it does not fit."""
    enough, fact = fits(stores, world.device, reserve_gb)
    if not enough:
        raise ConfigError(f"staging={options.only('staging', 'on_device')} cannot hold the pack: {fact}; train from it "
                          f"where it is with staging={options.default('staging')}, whose loader workers crop it, lower "
                          "staging.reserve_gb where the model needs less, or pack smaller images (pack.short_side)")
    train, val = (DevicePack(store, world.device) for store in (stores.train, stores.val))
    return (DeviceBatches(train, batch_size, world, train_crop, seed, order, layout),
            DeviceBatches(val, batch_size, world, val_crop, seed, None, None))
