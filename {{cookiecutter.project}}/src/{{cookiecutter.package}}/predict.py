"""Predict the class of each image in a folder or a glob with a trained checkpoint, into a CSV of file, class and
probability.

    python -m {{ cookiecutter.package }}.predict checkpoint=outputs/2026-11-21/10-00-00/best.pt images=photos/
    python -m {{ cookiecutter.package }}.predict checkpoint=... images='photos/**/*.jpg' out=predictions.csv

Each image is decoded and centre-cropped as validation does, and normalised as the checkpoint says; a file that does
not read as an image is logged and left out.
"""
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .core import failures
from .tools.predict import predict

log = logging.getLogger(__name__)

SHOWN_ROWS = 10  # rows printed; the CSV has them all


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="predict")
def main(cfg: DictConfig) -> None:
    out, rows, left_out = failures.one_line(lambda: predict(cfg, Path(HydraConfig.get().runtime.output_dir)))
    shown = [f"{name}: {label} ({probability:.2f})" for name, label, probability in rows[:SHOWN_ROWS]]
    log.info("%s%s\n%d images predicted%s: %s", "\n".join(shown), "\n..." if len(rows) > SHOWN_ROWS else "",
             len(rows), f", {left_out} left out as unreadable" if left_out else "", out)


if __name__ == "__main__":
    main()
