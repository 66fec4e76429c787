"""`augment=<option>`: an augmentation policy on each training crop, in the loader's workers, after the crop is
cut, resized and mirrored: torchvision's TrivialAugmentWide or RandAugment (torchvision.transforms.v2), as its
reference recipes use them (--auto-augment ta_wide | ra).

Its time counts as the workers' decoding time (`loader/decode_ms`), so the verdict, `loader.num_workers=auto` and
`tune` see what it costs. Its randomness comes from Python's `random`, which Images seeds per (seed, epoch, image):
a resumed epoch, or one read by another number of workers, sees the same augmented images. Validation is never
augmented. A policy needs the crop's pixels in the worker, so a decoder that decodes batches on the device, after
the workers (nvjpeg, dali), is refused with one.
"""
import random
from collections.abc import Callable

import numpy as np
import torch

from .. import options
from ..contracts import Augment
from ..core.errors import ConfigError
from .decoder import CpuDecoder, Decoded


class Policy:
    """A torchvision.transforms.v2 policy on a CHW uint8 tensor, drawing from torch's generator seeded for the crop."""

    def __init__(self, policy: Callable[[torch.Tensor], torch.Tensor]):
        self.policy = policy

    def __repr__(self) -> str:
        return repr(self.policy)  # its settings: what the cache of measured worker counts tells apart

    def __call__(self, pixels: np.ndarray, seed: int) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            augmented = self.policy(torch.from_numpy(pixels).permute(2, 0, 1))
        pixels[...] = augmented.permute(1, 2, 0).numpy()


class Augmented:
    """The training split's worker transform, then `augment` on the crop it made, resized in the worker."""

    def __init__(self, transform: Callable, augment: Augment):
        self.transform, self.augment = transform, augment

    def __repr__(self) -> str:
        return f"augment {self.augment!r}"

    def __call__(self, payload) -> Decoded:
        decoded = self.transform(payload).whole()
        self.augment(decoded.pixels, random.getrandbits(63))
        return decoded


def augmented(name: str, transform: Callable, decoder, augment: Augment) -> Augmented:
    if not isinstance(decoder, CpuDecoder):
        raise ConfigError(f"augment={name} changes each crop in the loader's workers, and this decoder "
                          f"({type(decoder).__name__}) decodes batches on the device, after them: pick a CPU decoder "
                          f"(decoder={options.fastest_cpu_decoder()}, the fastest installed here), or augment=none")
    return Augmented(transform, augment)


def none(transform: Callable, decoder) -> Callable:
    return transform


def trivial_augment(transform: Callable, decoder, num_magnitude_bins: int) -> Augmented:
    from torchvision.transforms import v2  # here, so that augment=none never imports torchvision

    return augmented("trivial_augment", transform, decoder,
                     Policy(v2.TrivialAugmentWide(num_magnitude_bins=num_magnitude_bins)))


def rand_augment(transform: Callable, decoder, num_ops: int, magnitude: int, num_magnitude_bins: int) -> Augmented:
    if magnitude >= num_magnitude_bins:
        raise ConfigError(f"augment.magnitude={magnitude} must be below augment.num_magnitude_bins="
                          f"{num_magnitude_bins}, the number of steps between no change and the strongest")
    from torchvision.transforms import v2

    return augmented("rand_augment", transform, decoder,
                     Policy(v2.RandAugment(num_ops=num_ops, magnitude=magnitude,
                                           num_magnitude_bins=num_magnitude_bins)))
