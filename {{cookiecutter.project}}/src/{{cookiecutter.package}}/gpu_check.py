"""The GPU benchmark: the compute ceiling, real pipelines beside it, precision x compile,
the cost of the three-way split, and the loader-only bench, written up as report.md and gpu_check.csv.

    python -m {{ cookiecutter.package }}.gpu_check                                 # on a machine with CUDA
    python -m {{ cookiecutter.package }}.gpu_check gpu_check.tests_xml=gpu-tests.xml  # with the gpu tests' results

Every run is `python -m {{ cookiecutter.package }}.train` with the overrides in conf/gpu_check.yaml, one after
another, so each figure comes from the same loop, clock and report as a user's run. A run that fails (an
option this machine cannot run, say DALI not installed) is recorded with its one-line reason; the others go on.
"""
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import options
from .core import failures
from .tools.gpu_check import gpu_check


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="gpu_check")
def main(cfg: DictConfig) -> None:
    def checked_run() -> Path:
        options.check(cfg)  # a key or value gpu_check does not know stops here, as it stops train
        return gpu_check(cfg, Path(HydraConfig.get().runtime.output_dir))

    report = failures.one_line(checked_run)
    print(report.read_text())
    print(f"written: {report}, {report.with_name('gpu_check.csv')}")


if __name__ == "__main__":
    main()
