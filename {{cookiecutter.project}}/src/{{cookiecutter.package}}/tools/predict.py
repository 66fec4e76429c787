"""Predicting the class of each image in a folder or a glob, behind `python -m <package>.predict`: each file
decoded and centre-cropped as validation does, normalised as the checkpoint says, and written as a CSV row."""
import csv
import glob
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from .. import options
from ..core.config import build
from ..core.errors import ConfigError
from ..core.files import write_atomic
from ..data.crops import CenterCrop
from ..data.decoder import Unreadable
from ..data.device import ToDevice
from ..data.format.folder import IMAGE_SUFFIXES
from ..data.fit import usable_decoder
from ..loop.checkpoint import load_trained
from ..loop.model import trained_model

log = logging.getLogger(__name__)

COLUMNS = ("file", "class", "probability")


def image_files(images: str) -> list[Path]:
    """The files `images` names: a folder's images (.jpeg, .jpg, .png, in its subfolders too), or a glob's files."""
    folder = Path(images).expanduser()
    if folder.is_dir():
        found = sorted(path for path in folder.rglob("*") if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file())
    else:
        found = sorted(Path(path) for path in glob.glob(str(folder), recursive=True) if Path(path).is_file())
    if not found:
        raise ConfigError(f"images={images} names no image: pass a folder of .jpeg, .jpg or .png files, or a glob such "
                          "as 'photos/**/*.jpg' (quoted, so that the shell leaves it to predict)")
    return found


class Readable(Dataset):
    """Each file through the decoder's worker transform, with its position; an unreadable one is logged and left out."""

    def __init__(self, files: list[Path], transform):
        self.files, self.transform = files, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        try:
            return self.transform(self.files[index].read_bytes()), index
        except (Unreadable, OSError) as err:
            log.warning("left out %s, which does not read as an image: %s", self.files[index], err)
            return None


class Present:
    """The decoder's collate over the samples that read; None for a batch of which none did."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples: list):
        read = [sample for sample in samples if sample is not None]
        return self.collate(read) if read else None


@torch.no_grad()
def predict(cfg: DictConfig, run_dir: Path) -> tuple[Path, list[tuple[str, str, float]], int]:
    """Write `cfg.out` (predictions.csv in the run folder): a row per readable image of `cfg.images`. Returns the
    path, the rows and how many files were left out as unreadable."""
    options.check(cfg)
    # The checkpoint first, as evaluate and export read it: a missing one is refused before a large folder is walked.
    state, inference = load_trained(cfg.checkpoint, torch.device("cpu"))
    files = image_files(cfg.images)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = trained_model(state, inference).to(device)
    usable_decoder(cfg.decoder)
    if options.facts_of(cfg.decoder).takes_pixels:
        raise ConfigError(f"decoder={options.name_of('decoder', cfg.decoder)} takes decoded pixels, and images= names "
                          "files: pick a decoder of files, such as the default")
    decoder = build(cfg.decoder)
    decoder.check_device(device)
    held = inference.preprocessing
    loader = DataLoader(Readable(files, decoder.transform(CenterCrop(held.crop_size, held.resize))),
                        batch_size=cfg.batch_size, num_workers=cfg.num_workers, collate_fn=Present(decoder.collate))
    to_device = ToDevice(decoder, device, non_blocking=False, mean=held.mean, std=held.std)
    rows = []
    for images, positions in to_device.stream(batch for batch in loader if batch is not None):
        probabilities = model(images)[:, :len(inference.classes)].float().softmax(dim=1)
        best, predicted = probabilities.max(dim=1)
        rows += [(str(files[position]), inference.classes[label], probability)
                 for position, label, probability in zip(positions.tolist(), predicted.tolist(), best.tolist())]
    out = Path(cfg.out).expanduser() if cfg.out else run_dir / "predictions.csv"

    def write(path: Path) -> None:
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(COLUMNS)
            writer.writerows((name, label, f"{probability:.4f}") for name, label, probability in rows)

    write_atomic(out, write)
    return out, rows, len(files) - len(rows)
