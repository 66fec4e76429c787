"""A model whose every prediction is known from the pixels, for the tests of evaluate, predict and export: it scores
each class by how near an image's mean colour is to the class's colour. A checkpoint of it names this module's
`ColourNetwork` as its model option, so the commands build it as they build any other."""
import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from {{ cookiecutter.package }}.contracts import Network, Preprocessing
from {{ cookiecutter.package }}.data.device import IMAGENET_MEAN, IMAGENET_STD
from {{ cookiecutter.package }}.loop.checkpoint import Inference, save

COLOURS = {"blue": (0, 0, 255), "cyan": (0, 255, 255), "green": (0, 255, 0), "magenta": (255, 0, 255),
           "red": (255, 0, 0), "yellow": (255, 255, 0)}
CLASSES = sorted(COLOURS)  # as the class folders list them
PREPROCESSING = Preprocessing(mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_size=32, resize=36)


class ColourScores(torch.nn.Module):
    """Each class's score: the image's mean over pixels, per normalised channel, against the class's colour as +1
    (full) and -1 (none) per channel."""

    def __init__(self):
        super().__init__()
        signs = [[1.0 if channel else -1.0 for channel in COLOURS[name]] for name in CLASSES]
        self.register_buffer("colours", torch.tensor(signs))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.mean(dim=(2, 3)) @ self.colours.T


class ColourNetwork(Network):
    def __init__(self, name: str, weights: str | None = None, num_classes: int = 0, channels_last: bool = False,
                 compile: bool = False):
        self.name, self.weights, self.num_classes = name, weights, num_classes

    def architecture(self, classes: int) -> torch.nn.Module:
        assert classes == len(CLASSES)
        return ColourScores()

    def library_weights(self):
        raise AssertionError("the colour model has no library of weights")


def colour_photo(colour: str, seed: int = 0, size: tuple[int, int] = (64, 48)) -> bytes:
    """A JPEG of `colour` with some noise, as a photo of a coloured wall would be."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(COLOURS[colour]) + rng.normal(0, 12, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def colour_tree(root: Path, val: dict[str, list[str]]) -> Path:
    """root/train/<class>/ with one photo of each class's colour, and root/val/<folder>/ with a photo of each colour
    `val[folder]` lists: a photo of another colour than its folder's is one the model gets wrong."""
    for name in CLASSES:
        (root / "train" / name).mkdir(parents=True)
        (root / "train" / name / "0.jpg").write_bytes(colour_photo(name))
    for folder, colours in val.items():
        (root / "val" / folder).mkdir(parents=True)
        for index, colour in enumerate(colours):
            (root / "val" / folder / f"{index}.jpg").write_bytes(colour_photo(colour, seed=index))
    return root


def colour_checkpoint(path: Path) -> Path:
    """A checkpoint of the colour model as training writes one: weights, class names, preprocessing, model option."""
    inference = Inference(classes=CLASSES, preprocessing=PREPROCESSING,
                          model={"_target_": f"{__name__}.ColourNetwork", "name": "colours", "weights": None,
                                 "num_classes": 0})
    save({"model": ColourScores().state_dict(), "inference": inference.state_dict(), "step": 0}, path)
    return path
