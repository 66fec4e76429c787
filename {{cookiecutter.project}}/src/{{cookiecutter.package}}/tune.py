"""From the bottleneck to a faster configuration, measured: short trials of the switches a run's verdict names.

    python -m {{ cookiecutter.package }}.tune model.name=resnet18 data.crop_size=64 loader.num_workers=0 decoder=pil
    torchrun --standalone --nproc-per-node=8 -m {{ cookiecutter.package }}.tune experiment=gpu_fast data=folder data.root=...

It takes the overrides you train with. Each trial is the training command with them, a candidate change and
`tune.steps` steps; only switches of speed are tried, never what is learned. The run folder gets tune.md,
tune.csv, tune.png and, where a change beat the start, experiment/tuned.yaml and command.txt, the command that
trains with the result. How it plans, decides and stops: tools/tune/.
"""
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .core import failures
from .tools import tune


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="tune")
def main(cfg: DictConfig) -> None:
    overrides = HydraConfig.get().overrides.task
    given = [override for override in overrides if not override.startswith(("tune.", "hydra."))]
    failures.one_line(lambda: tune.run(cfg, Path(HydraConfig.get().runtime.output_dir), given))


if __name__ == "__main__":
    main()
