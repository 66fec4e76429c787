"""Decoders as the tests drive them, outside a loader: each option as this machine can run it, and how far two
decoders' pixels are apart."""
import pytest
import torch
from hydra import compose, initialize_config_dir

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.contracts import Decoder
from {{ cookiecutter.package }}.core.config import build

from helpers.machines import on_this_machine

DECODERS = [name for name in options.options("decoder") if name != "none"]  # none: for format=tensor alone


def compose_decoder(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(options.CONF), version_base="1.3"):
        return compose("train", [f"decoder={name}", "train.batch_size=32", *overrides]).decoder


def make_decoder(name: str, *overrides: str) -> Decoder:
    """The option as this machine can run it: its way without a GPU where there is none."""
    missing = options.facts("decoder", name).missing()
    if missing:
        pytest.skip(f"decoder={name}: {missing}")
    return build(compose_decoder(name, *on_this_machine(f"decoder={name}"), *overrides))


def uploaded(decoder, images, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
    """One collated batch's images through the decoder's uploads to `device`, as the training loop gets them."""
    return next(decoder.uploads([(images, None)], device, non_blocking))[0]


def mean_difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference per image, in 0-255 levels."""
    return (a.float() - b.float()).abs().flatten(1).mean(1)
