"""Packed formats as the tests make them and read them back."""
from pathlib import Path

from omegaconf import OmegaConf

from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.data.staging import no_staging

from helpers.paths import CONF

TENSOR_SHORT_SIDE = 40


def open_pack(format: str, path):
    """The format option built as its YAML file gives it (its cache, for litdata), reading `path`."""
    node = OmegaConf.load(CONF / "format" / f"{format}.yaml")
    node.path = str(path)
    return build(node).stores(None, no_staging)


def packed_tree(root: Path, num_classes: int, train_per_class: int) -> tuple[Path, Path]:
    """A synthetic class-folder tree under `root` (two validation images a class) and its HDF5 pack, whose records
    order=blocks reads in runs: (pack, tree)."""
    from {{ cookiecutter.package }}.data.synth import write_dataset
    from {{ cookiecutter.package }}.tools.pack import pack

    tree = write_dataset(root / "tree", num_classes=num_classes, train_per_class=train_per_class, val_per_class=2,
                         workers=2)
    pack(tree, "hdf5", root / "packed", None, 90, 2, False, "raise")
    return root / "packed", tree
