"""cuDNN and determinism: `cudnn=default|benchmark|deterministic`.

- `benchmark`: cuDNN times several convolution algorithms per input shape and keeps the fastest; pick it
  when shapes do not change (fixed crops, drop_last), as in training here.
- `deterministic`: the same seed gives the same weights, run after run. It costs speed: no autotuning,
  deterministic (often slower) kernels, and an error from any op that has no deterministic version.
"""
import logging
import os

import torch

from ..core.errors import ConfigError

log = logging.getLogger(__name__)
MODES = ("default", "benchmark", "deterministic")


def configure(mode: str) -> None:
    """Set the process-wide switches; call before the first CUDA matmul, which reads cuBLAS's setting."""
    if mode not in MODES:
        raise ConfigError(f"cudnn={mode}: pick one of {', '.join(MODES)}")
    torch.backends.cudnn.benchmark = mode == "benchmark"
    torch.backends.cudnn.deterministic = mode == "deterministic"
    torch.use_deterministic_algorithms(mode == "deterministic")
    if mode == "deterministic":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS is deterministic only with this
        log.info("cudnn=deterministic: reproducible weights for a fixed seed, at a cost in speed (no cuDNN "
                 "autotuning, deterministic kernels); ops with no deterministic version will raise")
