"""Images made by the tests, as encoded bytes: a noisy ramp in any size and mode, and ImageNet's known oddities."""
import io

import numpy as np
from PIL import Image

from helpers.paths import DATA


def encoded(image: Image.Image, format: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


def photo(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A left-to-right ramp with noise: smooth enough for JPEG, different in every row and column."""
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, width)[None, :, None] * np.ones((height, 1, 3))
    pixels = np.clip(base + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels).convert(mode)


def large_photo(width: int, height: int, seed: int = 0, tile: int = 256) -> Image.Image:
    """photo()'s ramp at a size where noise drawn for every pixel would take over a second, in every test process
    that imports this module: the noise of one tile, repeated."""
    rng = np.random.default_rng(seed)
    noise = np.tile(rng.normal(0, 20, (tile, tile, 3)).astype(np.float32),
                    (-(-height // tile), -(-width // tile), 1))[:height, :width]
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    return Image.fromarray(np.clip(ramp + noise, 0, 255).astype(np.uint8))


def exif_rotated(width: int, height: int) -> bytes:
    """A JPEG whose EXIF orientation (6) asks viewers to turn it 90 degrees clockwise."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encoded(photo(width, height), exif=exif.tobytes())


# ImageNet's known oddities; every decoder reads each of them.
ODD_FILES = {
    "rgb": encoded(photo(500, 375)),
    "grayscale": encoded(photo(500, 375, "L")),
    "cmyk": encoded(photo(500, 375, "CMYK")),
    "png_named_jpeg": encoded(photo(300, 200), "PNG"),
    "progressive": encoded(photo(500, 375), progressive=True),
    "exif_rotated": exif_rotated(500, 375),
    "large": encoded(large_photo(4000, 3000)),
    "tiny": encoded(photo(16, 16)),
    "trailer": encoded(photo(500, 375)) + b"ftypmp42" + bytes(range(256)) * 40,  # a motion photo's video after EOI
    # Arithmetic coding, which nvJPEG does not decode; no Python library writes it, so this one was written by
    # libjpeg-turbo's `cjpeg -arithmetic` from photo(64, 48).
    "arithmetic": (DATA / "arithmetic.jpg").read_bytes(),
}
