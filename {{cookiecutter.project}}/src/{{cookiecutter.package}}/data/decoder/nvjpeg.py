"""`decoder=nvjpeg`: each batch decoded by one batched nvJPEG call (the A100/H100 hardware JPEG decoder where it
applies), through TorchCodec or torchvision (decoder.backend), then cropped, resized and flipped on the device in one
`roi_align` over the whole batch.

Decoded images differ in size, and roi_align wants one tensor: they are laid out side by side on one
canvas, each with a one-pixel border repeating its own edge so that no crop samples its neighbour.
"""
import io
import logging
import math
import warnings
from collections.abc import Callable

import torch
from PIL import Image
from torch.nn.functional import pad

from ... import options
from ...core.errors import ConfigError
from ..images import UnreadableImage
from . import Unreadable, decoding, pillow_decode
from .batch import BatchDecoder, Encoded

log = logging.getLogger(__name__)

# RuntimeErrors that are the device's, not the image's: no CPU decode would mend them (AcceleratorError: torch 2.8+).
DEVICE_FAULTS = tuple(getattr(torch, name) for name in ("OutOfMemoryError", "AcceleratorError") if hasattr(torch, name))
# torchvision 0.29 deprecates its image decoding in favour of TorchCodec's, which decoder.backend=auto takes first:
# where it falls back to torchvision's, the user has nothing to act on.
TORCHVISION_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"


def torchcodec_decode(data: torch.Tensor | list[torch.Tensor], device: torch.device):
    from torchcodec.decoders import decode_jpeg

    return decode_jpeg(data, mode="RGB", device=device)


def torchvision_decode(data: torch.Tensor | list[torch.Tensor], device: torch.device):
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def torchcodec_refusal() -> str | None:
    """Why TorchCodec cannot decode for this option, with the install command, or None: missing, older than its
    extra asks (0.16, the first with decode_jpeg), or failing to load (a build for another torch)."""
    if why := options.Facts(extra="torchcodec", module="torchcodec").missing():
        return why
    try:
        from torchcodec.decoders import decode_jpeg  # noqa: F401
    except (ImportError, OSError, RuntimeError) as err:
        return f"torchcodec does not load ({str(err).splitlines()[0]}): pip install -e '.[torchcodec]'"
    return None


def torchvision_refusal() -> str | None:
    """Why torchvision cannot decode for this option, or None: 0.29 deprecated its decode_jpeg, to be removed."""
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except ImportError as err:
        return f"this torchvision has no decode_jpeg ({err}): pip install -e '.[torchcodec]'"
    return None


# Each backend's batched decode (a list of images in one call) and why it cannot serve here, in auto's order of
# preference: torchvision's comes with torch's own companion package, but 0.29 deprecated it for TorchCodec's.
BACKENDS = {"torchcodec": (torchcodec_decode, torchcodec_refusal), "torchvision": (torchvision_decode,
                                                                                   torchvision_refusal)}


def pick_backend(backend: str) -> str:
    """decoder.backend as given, or for `auto` the first in BACKENDS that serves here; one that cannot, refused."""
    if backend not in ("auto", *BACKENDS):
        raise ConfigError(f"decoder.backend={backend}: pick auto, {' or '.join(BACKENDS)}")
    refusals = []
    for name in BACKENDS if backend == "auto" else [backend]:
        why = BACKENDS[name][1]()
        if why is None:
            if refusals:
                log.info("decoder=nvjpeg decodes through %s, since %s", name, "; ".join(refusals))
            return name
        refusals.append(f"{name}: {why}")
    advice = "; or pass decoder.backend=auto" if backend != "auto" else ""
    raise ConfigError(f"decoder.backend={backend}: no backend decodes here ({'; '.join(refusals)}){advice}")


class NvjpegDecoder(BatchDecoder):
    def __init__(self, on_cpu: bool, backend: str):
        super().__init__(on_cpu)
        self.backend = pick_backend(backend)
        self.decode_jpeg = BACKENDS[self.backend][0]
        warnings.filterwarnings("ignore", TORCHVISION_DEPRECATION, DeprecationWarning)
        self.warned = False  # the first image nvJPEG refuses is logged, not every one

    def check_device(self, device: torch.device) -> None:
        super().check_device(device)
        if self.on_cpu:
            return
        tiny = io.BytesIO()
        Image.new("RGB", (16, 16)).save(tiny, "JPEG")
        try:  # a CPU-only build (what a plain pip install of torchcodec gives) would leave every image to Pillow
            self.decode_jpeg(torch.frombuffer(bytearray(tiny.getvalue()), dtype=torch.uint8), device)
        except RuntimeError as err:
            raise ConfigError(f"decoder=nvjpeg: this {self.backend} does not decode on the GPU "
                              f"({str(err).splitlines()[0]}): install {self.backend}'s CUDA build for this torch, or "
                              f"pick decoder={options.fastest_cpu_decoder()}") from err

    def start(self, encoded: list[Encoded], device: torch.device, non_blocking: bool) -> Callable[[], torch.Tensor]:
        images = self.decode(encoded, torch.device("cpu") if self.on_cpu else device)
        crops = crop_resize_flip(images, [item.box for item in encoded], [item.flip for item in encoded],
                                 encoded[0].size).to(device, non_blocking=non_blocking)
        return lambda: crops  # decoded in this call (on a GPU, queued on its stream): nothing is left to wait for

    def decode(self, encoded: list[Encoded], device: torch.device) -> list[torch.Tensor]:
        """The images as stored (the workers hid their APP1 segments, by which TorchCodec would turn them), in one
        batched call; where nvJPEG refuses the batch, one by one, with Pillow on the CPU for each image it refuses (as
        DALI falls back to the host), so that one odd file never ends the run."""
        if device.type == "cuda":
            # nvJPEG's hardware path does not wait for the kernels queued before it, which may still read memory it
            # is handed (pytorch/vision#9606, meta-pytorch/torchcodec#1634): it starts once they are done. Those
            # kernels are this stream's, since the caching allocator hands a stream only the blocks its own work freed
            # (or, after record_stream, work on other streams has finished with). So the decode waits for this stream
            # alone, and under a prefetcher's side stream it overlaps the step.
            torch.cuda.current_stream(device).synchronize()
        try:
            return self.decode_jpeg([torch.from_numpy(item.data) for item in encoded], device)
        except DEVICE_FAULTS:
            raise
        except RuntimeError:
            return [self.decode_one(item, device) for item in encoded]

    def decode_one(self, item: Encoded, device: torch.device) -> torch.Tensor:
        try:
            return self.decode_jpeg(torch.from_numpy(item.data), device)
        except DEVICE_FAULTS:
            raise
        except RuntimeError as refused:
            if not self.warned:
                log.warning("nvJPEG refused an image (%s); such images are decoded by Pillow on the CPU",
                            str(refused).splitlines()[0])
                self.warned = True
        try:
            with decoding():
                pixels = pillow_decode(item.data.tobytes(), shrink=1)
        except Unreadable as err:
            raise UnreadableImage(f"an image that nvJPEG refused does not decode with Pillow either ({err}): pick "
                                  f"decoder={options.fastest_cpu_decoder()}, whose workers skip such files under "
                                  f"data.on_error=skip") from err
        return torch.from_numpy(pixels).permute(2, 0, 1).to(device)  # Pillow leaves EXIF orientation alone


def shelves(sizes: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int, int]:
    """Top-left corners that lay (height, width) rectangles out on rows ("shelves") of one canvas, tallest
    first, and the canvas's height and width."""
    width = max(max(w for _, w in sizes), math.isqrt(sum(h * w for h, w in sizes)) + 1)
    corners, x, y, shelf = [(0, 0)] * len(sizes), 0, 0, 0
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i][0]):
        h, w = sizes[index]
        if x + w > width:
            x, y, shelf = 0, y + shelf, 0
        corners[index], x, shelf = (y, x), x + w, max(shelf, h)
    return corners, y + shelf, width


def crop_resize_flip(images: list[torch.Tensor], boxes: list[tuple[int, int, int, int]], flips: list[bool],
                     size: int) -> torch.Tensor:
    """CHW uint8 images of any sizes -> their boxes resized to size x size (area-averaged when shrinking,
    as roi_align averages ceil(box / size) samples per output pixel), flipped where asked: N x C x size x size."""
    from torchvision.ops import roi_align  # torchvision is imported where its op is used, not by every run

    device = images[0].device
    padded = [(image.shape[1] + 2, image.shape[2] + 2) for image in images]
    corners, height, width = shelves(padded)
    canvas = torch.zeros((images[0].shape[0], height, width), dtype=torch.float32, device=device)
    for image, (y, x), (h, w) in zip(images, corners, padded):
        canvas[:, y:y + h, x:x + w] = pad(image[None].float(), (1, 1, 1, 1), mode="replicate")[0]
    rois = torch.tensor([(0, x + 1 + left, y + 1 + top, x + 1 + right, y + 1 + bottom)  # 0: the one canvas
                         for (y, x), (left, top, right, bottom) in zip(corners, boxes)],
                        dtype=torch.float32, device=device)
    crops = roi_align(canvas[None], rois, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    crops = crops.round_().clamp_(0, 255).to(torch.uint8)
    flipped = torch.tensor(flips, device=device).view(-1, 1, 1, 1)
    return torch.where(flipped, crops.flip(-1), crops)
