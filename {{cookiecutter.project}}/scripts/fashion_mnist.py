"""Fashion-MNIST as a JPEG class-folder tree that data=folder reads: 60,000 training and 10,000 validation photos of
clothes, 28x28 grayscale, 10 classes (Expat licence). A real data set, small enough for a CPU, that no model learns to
100%: what tells a correct training loop from a subtly wrong one.

    python scripts/fashion_mnist.py /data/fashion-mnist                     # from Debian's dataset-fashion-mnist
    python scripts/fashion_mnist.py /data/fashion-mnist --idx DIR           # from the four IDX files in DIR
    python scripts/fashion_mnist.py /data/fashion-mnist --download DIR      # torchvision downloads them into DIR
    python -m {{ cookiecutter.package }}.train experiment=fashion_mnist data.root=/data/fashion-mnist

The tree is written under a temporary name and renamed when complete; a folder that exists is never written into.
Class folders are numbered as the IDX labels are (0_t-shirt_top ... 9_ankle_boot), so their sorted order is the
labels' order.
"""
import argparse
import gzip
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

DEBIAN = Path("/usr/share/datasets/fashion-mnist")
INSTALL = "apt-get install dataset-fashion-mnist, or pass --download DIR to fetch them with torchvision"
CLASSES = ("t-shirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle_boot")
SPLITS = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
UNSIGNED_BYTES = 0x08  # the IDX type code of both files


class Refused(Exception):
    """A problem with the input or the output folder, said in one line."""


def idx_file(folder: Path, name: str) -> Path:
    """`name` in `folder`, gzipped (as Debian ships it) or not (as torchvision leaves it)."""
    for path in (folder / f"{name}.gz", folder / name):
        if path.is_file():
            return path
    raise Refused(f"{folder} has no {name} (nor {name}.gz): {INSTALL}")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file of unsigned bytes as an array of the shape its header gives; a truncated or foreign file refused."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as file:
            data = file.read()
    except (OSError, EOFError) as err:
        raise Refused(f"{path} cannot be read ({err}): download it again, or {INSTALL}") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != UNSIGNED_BYTES:
        raise Refused(f"{path} is not an IDX file of unsigned bytes: its first bytes are {data[:4].hex()}")
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    body = data[4 + 4 * dims:]
    if len(body) != math.prod(shape):
        raise Refused(f"{path} holds {len(body)} bytes of data where its header promises {math.prod(shape)} "
                      f"({' x '.join(map(str, shape))}): it is truncated; download it again, or {INSTALL}")
    return np.frombuffer(body, np.uint8).reshape(shape)


def from_idx(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    splits = {}
    for split, (images_name, labels_name) in SPLITS.items():
        images, labels = read_idx(idx_file(folder, images_name)), read_idx(idx_file(folder, labels_name))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise Refused(f"{folder}: {images_name} holds {images.shape} and {labels_name} {labels.shape}; they "
                          "should be N images of HxW pixels and N labels")
        splits[split] = images, labels
    return splits


def from_torchvision(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """torchvision's download, which it skips where the files are in `folder` already."""
    from torchvision.datasets import FashionMNIST

    try:
        return {split: (data.data.numpy(), data.targets.numpy())
                for split, data in (("train", FashionMNIST(folder, train=True, download=True)),
                                    ("val", FashionMNIST(folder, train=False, download=True)))}
    except (OSError, RuntimeError) as err:
        raise Refused(f"torchvision could not download Fashion-MNIST into {folder} ({str(err).splitlines()[0]}): "
                      "apt-get install dataset-fashion-mnist, or pass --idx DIR") from None


def first_per_class(labels: np.ndarray, limit: int | None) -> np.ndarray:
    """The indices of the first `limit` images of each class, in file order (all of them for None)."""
    if limit is None:
        return np.arange(len(labels))
    return np.sort(np.concatenate([np.flatnonzero(labels == label)[:limit] for label in np.unique(labels)]))


def write_tree(splits: dict[str, tuple[np.ndarray, np.ndarray]], out: Path, limits: dict[str, int | None],
               quality: int) -> dict[str, int]:
    """Every image as out/<split>/<label>_<class>/<index>.jpg, written under a temporary name, then renamed."""
    if out.exists():
        raise Refused(f"{out} exists already: pass another folder, or delete it to write it again")
    if not out.parent.is_dir():
        raise Refused(f"{out.parent} does not exist: create it first, or pass a folder in one that does")
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    counts = {}
    try:
        for split, (images, labels) in splits.items():
            for label, name in enumerate(CLASSES):
                (partial / split / f"{label}_{name}").mkdir(parents=True)
            kept = first_per_class(labels, limits[split])
            for index in kept:
                Image.fromarray(images[index], "L").save(
                    partial / split / f"{labels[index]}_{CLASSES[labels[index]]}" / f"{index:05d}.jpg", quality=quality)
            counts[split] = len(kept)
        partial.rename(out)
    except OSError as err:
        raise Refused(f"writing {partial} failed ({err.strerror or err}): free some space on that disk, or pass "
                      "another folder; nothing was left under the name asked for") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write; it must not exist")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--idx", type=Path, help=f"a folder of the four IDX files, gzipped or not (default: {DEBIAN})")
    source.add_argument("--download", type=Path, help="a folder for torchvision to download the IDX files into")
    parser.add_argument("--train-per-class", type=int, help="keep the first N training images of each class")
    parser.add_argument("--val-per-class", type=int, help="keep the first N validation images of each class")
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality, 1 to 95 (default 95)")
    args = parser.parse_args(argv)
    try:
        splits = from_torchvision(args.download) if args.download else from_idx(args.idx or DEBIAN)
        counts = write_tree(splits, args.out, {"train": args.train_per_class, "val": args.val_per_class},
                            args.quality)
    except Refused as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    print(f"wrote {counts['train']} training and {counts['val']} validation images of {len(CLASSES)} classes to "
          f"{args.out}; train with: python -m {{ cookiecutter.package }}.train experiment=fashion_mnist "
          f"data.root={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
