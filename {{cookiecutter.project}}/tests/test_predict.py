"""The predict command: a CSV row per image whose class and probability are the checkpoint's model's own, the inputs
prepared here by hand (Pillow: resize, centre crop, normalise) as the checkpoint says."""
import csv

import numpy as np
import pytest
import torch
from PIL import Image

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.tools.predict import predict

from helpers.colours import CLASSES, PREPROCESSING, ColourScores, colour_checkpoint, colour_photo
from helpers.images import encoded, photo
from helpers.runs import hydra_run


def by_hand(path) -> torch.Tensor:
    """The model's input for one file, made with Pillow alone: the shorter side resized, the centre cut, normalised."""
    with Image.open(path) as image:
        image = image.convert("RGB")
        scale = PREPROCESSING.resize / min(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
        left, top = (image.width - PREPROCESSING.crop_size) // 2, (image.height - PREPROCESSING.crop_size) // 2
        image = image.crop((left, top, left + PREPROCESSING.crop_size, top + PREPROCESSING.crop_size))
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / 255
    return (pixels - torch.tensor(PREPROCESSING.mean)[:, None, None]) / torch.tensor(PREPROCESSING.std)[:, None, None]


@pytest.fixture
def predicted(tmp_path):
    """predicted(images, *overrides) -> (CSV rows, files left out), run in this process on the CPU."""
    checkpoint = colour_checkpoint(tmp_path / "best.pt")

    def run(images: str, *overrides: str):
        with hydra_run("predict", [f"checkpoint={checkpoint}", f"images={images}", "num_workers=0", "batch_size=3",
                                   *overrides], tmp_path / "run") as cfg:
            out, _, left_out = predict(cfg, tmp_path / "run")
        with out.open(newline="") as file:
            return list(csv.DictReader(file)), left_out

    return run


def test_each_row_is_the_models_own_argmax_and_probability(predicted, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    photos = tmp_path / "photos"
    (photos / "holiday").mkdir(parents=True)
    for index, colour in enumerate(CLASSES):
        (photos / ("holiday" if index % 2 else "") / f"{colour}.jpg").write_bytes(colour_photo(colour, seed=index))
    (photos / "ramp.png").write_bytes(encoded(photo(90, 60), "PNG"))  # a photo of no one colour
    (photos / "notes.txt").write_text("not an image, and not named as one: never read")
    (photos / "broken.jpg").write_text("not an image, though named as one")
    rows, left_out = predicted(str(photos))
    files = sorted(path for path in photos.rglob("*") if path.suffix in (".jpg", ".png") and path.name != "broken.jpg")
    assert [row["file"] for row in rows] == [str(path) for path in files] and left_out == 1
    model = ColourScores()
    for row in rows:
        probabilities = model(by_hand(row["file"])[None]).softmax(dim=1)[0]
        assert row["class"] == CLASSES[int(probabilities.argmax())], row
        assert float(row["probability"]) == pytest.approx(float(probabilities.max()), abs=0.02), row
    assert {row["class"] for row in rows if "ramp" not in row["file"]} == set(CLASSES)  # each photo its own colour


def test_a_glob_names_the_files(predicted, tmp_path):
    (tmp_path / "a").mkdir()
    for colour in ("red", "blue"):
        (tmp_path / "a" / f"{colour}.jpeg").write_bytes(colour_photo(colour))
    rows, _ = predicted(str(tmp_path / "a" / "r*.jpeg"))
    assert [(row["file"], row["class"]) for row in rows] == [(str(tmp_path / "a/red.jpeg"), "red")]


def test_a_folder_with_no_images_is_refused_in_one_line(predicted, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/readme.txt").write_text("no photos here")
    with pytest.raises(ConfigError, match=r"^images=.*empty names no image: pass a folder of .jpeg, .jpg or .png"):
        predicted(str(tmp_path / "empty"))
