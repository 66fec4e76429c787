"""The built-in data: ImageNet-like sizes, photo-like file sizes, and classes that carry signal."""
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from {{ cookiecutter.package }}.data.synth import write_dataset


def test_synthetic_images_look_like_imagenet_files(tmp_path):
    root = write_dataset(tmp_path / "set", num_classes=4, train_per_class=6, val_per_class=2, workers=2)
    files = sorted(root.glob("*/*/*.JPEG"))
    assert len(files) == 4 * 8 and {f.parent.parent.name for f in files} == {"train", "val"}
    sizes = [Image.open(f).size for f in files]
    assert all(300 <= min(size) <= 500 for size in sizes)
    kilobytes = np.mean([f.stat().st_size for f in files]) / 1024
    assert 60 < kilobytes < 160, "texture and noise should give camera-like JPEG sizes"
    assert not list(tmp_path.glob("*.partial-*")), "the staging folder is renamed into place"


def test_classes_are_separable_by_a_simple_feature(tmp_path):
    """Nearest class-mean of hue histograms over strongly coloured pixels beats chance by far: a network can learn."""
    root = write_dataset(tmp_path / "set", num_classes=5, train_per_class=8, val_per_class=4, workers=2)

    def features(split):
        rows, labels = [], []
        for label, folder in enumerate(sorted((root / split).iterdir())):
            for path in sorted(folder.iterdir()):
                image = Image.open(path).convert("RGB").resize((64, 64))
                rgb = np.asarray(image).astype(float)
                chroma = rgb.max(-1) - rgb.min(-1)
                hues = np.histogram(np.asarray(image.convert("HSV"))[..., 0], bins=32, range=(0, 256),
                                    weights=chroma > 100)[0]
                rows.append(hues / max(1, hues.sum()))
                labels.append(label)
        return np.array(rows), np.array(labels)

    train_x, train_y = features("train")
    val_x, val_y = features("val")
    means = np.stack([train_x[train_y == c].mean(0) for c in range(5)])
    predicted = np.argmin(((val_x[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == val_y).mean() >= 0.8  # chance is 0.2


def test_unwritable_destination_is_one_clear_error(tmp_path):
    from {{ cookiecutter.package }}.core.errors import ClearError

    (tmp_path / "file").write_text("a file where a folder should go")
    with pytest.raises(ClearError, match="could not write the synthetic data set"):
        write_dataset(tmp_path / "file" / "set", num_classes=2, train_per_class=1, val_per_class=1, workers=1)


@pytest.mark.full
def test_command_line_writes_the_layout_and_refuses_to_overwrite(tmp_path):
    command = [sys.executable, "-m", "{{ cookiecutter.package }}.data.synth", "--out", str(tmp_path / "set"),
               "--classes", "2", "--train-per-class", "2", "--val-per-class", "1"]
    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 0
    assert len(list((tmp_path / "set/train").glob("*/*.JPEG"))) == 4
    assert len(list((tmp_path / "set/val").glob("*/*.JPEG"))) == 2
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "exists; pick a new folder" in again.stderr
