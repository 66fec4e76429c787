"""Packed formats as the tests make them."""
from pathlib import Path

TENSOR_SHORT_SIDE = 40


def packed_tree(root: Path, num_classes: int, train_per_class: int) -> tuple[Path, Path]:
    """A synthetic class-folder tree under `root` (two validation images a class) and its HDF5 pack, whose records
    order=blocks reads in runs: (pack, tree)."""
    from {{ cookiecutter.package }}.data.synth import write_dataset
    from {{ cookiecutter.package }}.tools.pack import pack

    tree = write_dataset(root / "tree", num_classes=num_classes, train_per_class=train_per_class, val_per_class=2,
                         workers=2)
    pack(tree, "hdf5", root / "packed", None, 90, 2, False, "raise")
    return root / "packed", tree
