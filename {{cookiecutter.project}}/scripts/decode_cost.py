"""What one training image costs each CPU decoder, in one process: the figure each decoder's facts declare as
`decode_us`, by which advice and a default that cannot run here pick the fastest decoder installed.

    python scripts/decode_cost.py                    # 300 synthetic photos of ImageNet's shapes, 224-pixel crops
    python scripts/decode_cost.py --root /data/imagenet --images 1000

Each decoder runs its loader workers' whole transform on every file, as training does: the header, the random
crop, the decode (of the crop's region, or of the whole image at the DCT scale the crop allows) and, for a decoder
that decodes whole images, the resize that keeps the worker's memory small. The files are in memory, torch and
OpenCV keep to one thread, and the crops are drawn from one seed, the same for every decoder. The figure is the
median of `--passes` passes, in microseconds per image; the collate's resize into the batch, the same for every
decoder, is left out.
"""
import argparse
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.errors import ClearError
from {{ cookiecutter.package }}.core.hardware import cpu_description
from {{ cookiecutter.package }}.data.crops import TrainCrop
from {{ cookiecutter.package }}.data.decoder import Unreadable
from {{ cookiecutter.package }}.data.format.folder import open_tree
from {{ cookiecutter.package }}.data.synth import write_dataset


def cpu_decoders() -> list[str]:
    """The decoders that decode in the loader's workers: neither on a device nor of stored pixels."""
    return [name for name in options.options("decoder")
            if not options.facts("decoder", name).gpu and not options.facts("decoder", name).takes_pixels]


def microseconds_per_image(name: str, files: list[bytes], crop_size: int, passes: int) -> float:
    transform = build(OmegaConf.load(options.CONF / "decoder" / f"{name}.yaml")).transform(TrainCrop(crop_size))
    times = []
    for _ in range(passes):
        random.seed(0)  # the same crops for every decoder
        start = time.perf_counter()
        for data in files:
            try:
                transform(data)
            except Unreadable:
                pass
        times.append((time.perf_counter() - start) / len(files))
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="a class-folder tree whose train/ files to decode; default: "
                                                  "synthetic photos")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.root or write_dataset(Path(scratch) / "photos", num_classes=10,
                                          train_per_class=-(-args.images // 10), val_per_class=1)
        try:
            train, _, _ = open_tree(root)  # the images training would read, whatever their extension's case
        except ClearError as err:
            sys.exit(f"error: {err}")
        files = [Path(path).read_bytes() for path in train.paths[:args.images]]
    print(f"# {cpu_description()[0]}, {platform.machine()}, Python {platform.python_version()}, {len(files)} files, "
          f"{args.crop_size}-pixel crops, median of {args.passes} passes")
    for name in cpu_decoders():
        missing = options.facts("decoder", name).missing()
        cost = f"{microseconds_per_image(name, files, args.crop_size, args.passes):.0f}" if not missing else "-"
        print(f"decoder={name}: decode_us: {cost}{f'  # {missing}' if missing else ''}")


if __name__ == "__main__":
    main()
