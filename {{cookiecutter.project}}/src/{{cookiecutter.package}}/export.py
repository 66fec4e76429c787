"""Write a trained checkpoint's model as a file to serve: TorchScript, ONNX or an ExportedProgram, with model.json
beside it (class names, preprocessing), its outputs checked against the checkpoint's.

    python -m {{ cookiecutter.package }}.export checkpoint=outputs/2026-11-21/10-00-00/best.pt target=onnx
    python -m {{ cookiecutter.package }}.export checkpoint=... target=torchscript out=/srv/models/mine.ts

Its config is conf/export/, a folder of its own, where target= names the file format to write (conf/export/target/).
"""
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .core import failures
from .tools.export import TOLERANCE, export

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=str(options.CONF / "export"), config_name="export")
def main(cfg: DictConfig) -> None:
    written = failures.one_line(lambda: export(cfg, Path(HydraConfig.get().runtime.output_dir)))
    checked = ("its outputs not checked" if written["difference"] is None else
               f"its outputs differ from the checkpoint's by {written['difference']:.1g} of their largest, "
               f"{TOLERANCE:g} allowed")
    log.info("written: %s and %s; %s", written["path"], written["card"], checked)


if __name__ == "__main__":
    main()
