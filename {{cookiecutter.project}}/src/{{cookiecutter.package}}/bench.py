"""Loader-only throughput for any set of decoder, format and worker-count choices, with three references.

    python -m {{ cookiecutter.package }}.bench data.train_per_class=200            # 2000 synthetic JPEGs
    python -m {{ cookiecutter.package }}.bench data=folder data.root=/data/imagenet-subset bench.num_workers=[4,8]

Rows measure training's own loader (loaders.training_loader) and the upload alone, no model: 224-pixel
random-resized-crop and flip, ending at uint8 batches on `bench.device` (the float conversion happens later,
on the device). For GPU decoders (nvjpeg, dali) the upload is where they decode. Timed over whole epochs
after a warm-up epoch.
Every decoder option is timed where this machine can run it; one it cannot (a GPU decoder without a GPU,
unless its facts say its CPU mode is worth timing; a missing extra) gets a row that says why.
The references, on the same files and worker count:
- ceiling: the fastest CPU decoder's single-process full-decode rate, times the cores in use, over passes timed
  before each row and after the last (tools/bench/ceilings.py says why);
- region ceiling: the same for decoding only what each training crop keeps (decoders whose facts say
  `region_decode`), at the DCT scale the crop allows: what a loader that decodes regions cannot pass;
- baseline: pytorch/examples' recipe, ImageFolder + PIL + RandomResizedCrop + ToTensor + Normalize in float32.
Writes bench.csv into the run folder as rows finish, so that a failure keeps every row measured before it,
and bench.png at the end.
"""
import logging
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .core import failures
from .tools.bench import bench
from .tools.bench.report import best_line, table

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="bench")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    data = [override for override in HydraConfig.get().overrides.task
            if override.lstrip("+~").split("=")[0].split(".")[0] == "data"]  # the data set, as training is given it

    rows = failures.one_line(lambda: bench(cfg, run_dir))
    written = [str(path) for path in (run_dir / "bench.csv", run_dir / "bench.png") if path.exists()]
    log.info("%s\npage cache: %s\nwritten: %s (%d cores)\n%s", table(rows), rows[0]["page_cache"],
             ", ".join(written), os.cpu_count(), best_line(rows, data))


if __name__ == "__main__":
    main()
