"""The built-in data set: real JPEGs in ImageNet's folder layout, learnable and as costly to decode as photos.

Each class owns a hue and a stripe frequency, painted as a textured object on a cluttered
background; the orientation, place and size of the object vary, and multi-octave texture plus
sensor noise give the files the size and entropy of camera JPEGs (about 80-110 KB at 500x400).

    python -m {{ cookiecutter.package }}.data.synth --out /tmp/synthetic --classes 10 --train-per-class 100
"""
import argparse
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from ..core.errors import ClearError
from ..core.failures import one_line

JPEG_QUALITY = 90


def class_look(label: int, num_classes: int) -> tuple[np.ndarray, float]:
    """The colour (RGB, 0-255) and stripe period (pixels) that identify a class."""
    hue = 180.0 * label / num_classes  # OpenCV hue runs 0-180
    hsv = np.uint8([[[hue, 200, 210]]])
    rgb = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float32)
    period = (6.0, 11.0, 19.0)[label % 3]
    return rgb, period


def octave_noise(rng: np.random.Generator, height: int, width: int, cells: int, channels: int = 3) -> np.ndarray:
    """Smooth noise in [-1, 1] with about `cells` blobs across the shorter side, shape (height, width, channels)."""
    scale = max(1, min(height, width) // cells)
    coarse = rng.uniform(-1, 1, (height // scale + 2, width // scale + 2, channels)).astype(np.float32)
    return cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC).reshape(height, width, channels)


def render(label: int, num_classes: int, seed: list[int]) -> np.ndarray:
    """One RGB uint8 image of class `label`, fully determined by `seed`."""
    rng = np.random.default_rng(seed)
    short = int(rng.integers(300, 501))
    long = int(short * rng.uniform(1.15, 1.5))
    height, width = (short, long) if rng.random() < 0.8 else (long, short)

    # Scenes are mostly light and shade with a little colour, so the class colour stands out as in photos.
    background = rng.uniform(60, 190) + rng.uniform(-20, 20, 3).astype(np.float32)
    image = background + 55 * octave_noise(rng, height, width, 4, 1) + 25 * octave_noise(rng, height, width, 24, 1)
    image += 15 * octave_noise(rng, height, width, 8)

    colour, period = class_look(label, num_classes)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, np.pi)
    phase = rng.uniform(0, 2 * np.pi)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period + phase)
    cy, cx = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width
    ry, rx = rng.uniform(0.25, 0.45) * height, rng.uniform(0.25, 0.45) * width
    inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
    inside = cv2.GaussianBlur(inside.astype(np.float32), (0, 0), 3)[..., None]
    shade = 1.0 + 0.25 * octave_noise(rng, height, width, 6)
    obj = colour * shade * (0.8 + 0.2 * stripes[..., None])
    image = image * (1 - inside) + obj * inside

    image += 16 * octave_noise(rng, height, width, max(height, width) // 2)  # fine texture
    image += rng.normal(0, 8, image.shape).astype(np.float32)  # sensor noise
    return np.clip(image, 0, 255).astype(np.uint8)


def write_image(job: tuple[Path, int, int, list[int]]) -> int:
    path, label, num_classes, seed = job
    ok, encoded = cv2.imencode(".JPEG", cv2.cvtColor(render(label, num_classes, seed), cv2.COLOR_RGB2BGR),
                               [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise RuntimeError(f"could not encode {path}")
    path.write_bytes(encoded.tobytes())
    return len(encoded)


def write_dataset(out: Path, num_classes: int, train_per_class: int, val_per_class: int,
                  seed: int = 0, workers: int | None = None) -> Path:
    """Write train/ and val/ under `out`, atomically: a half-written set never has the final name."""
    out = Path(out)
    staging = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    jobs = []
    for split, per_class, offset in (("train", train_per_class, 0), ("val", val_per_class, 1 << 20)):
        for label in range(num_classes):
            folder = staging / split / f"class_{label:03d}"
            jobs += [(folder / f"{split}_{label:03d}_{index:05d}.JPEG", label, num_classes, [seed, offset + index, label])
                     for index in range(per_class)]
    try:
        for folder in {path.parent for path, *_ in jobs}:
            folder.mkdir(parents=True)
        with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
            total = sum(pool.map(write_image, jobs, chunksize=16))
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(out)
        except OSError:  # another process finished the same set first
            if not (out / "val").is_dir():
                raise
    except OSError as err:
        raise ClearError(f"could not write the synthetic data set to {out}: {err.strerror or err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"synth: wrote {len(jobs)} JPEGs ({total / 2**20:.0f} MiB) to {out}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.out.exists():
        parser.error(f"{args.out} exists; pick a new folder")
    start = time.perf_counter()
    one_line(lambda: write_dataset(args.out, args.classes, args.train_per_class, args.val_per_class, args.seed))
    print(f"synth: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
