"""Score a trained checkpoint on a validation split: top-1, top-5 (more than 5 classes), per-class accuracy and a
confusion matrix, with nothing but the checkpoint and the data.

    python -m {{ cookiecutter.package }}.evaluate checkpoint=outputs/2026-11-21/10-00-00/best.pt data.root=/data/mine
    python -m {{ cookiecutter.package }}.evaluate checkpoint=... format=hdf5 format.path=/data/mine-hdf5

The split is read through training's loader assembly, so any format, decoder and staging works, and prepared as the
checkpoint says (its crop sizes and normalisation). Writes evaluation.json and confusion.png into its run folder.
"""
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .core import distributed, failures
from .tools.evaluate import evaluate, report

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    result = failures.one_line(lambda: evaluate(cfg, run_dir), finish=distributed.teardown)
    log.info("%s", report(result, run_dir))


if __name__ == "__main__":
    main()
