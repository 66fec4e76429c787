"""Decoders as the tests drive them, outside a loader."""
import torch


def uploaded(decoder, images, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
    """One collated batch's images through the decoder's uploads to `device`, as the training loop gets them."""
    return next(decoder.uploads([(images, None)], device, non_blocking))[0]
