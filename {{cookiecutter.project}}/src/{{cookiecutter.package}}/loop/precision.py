"""Mixed precision: `precision=fp32|fp16|bf16`, and the guard against a loss that stops being finite.

- `bf16`: autocast to bfloat16; its range is fp32's, so no loss scaling. Native on Ampere GPUs and on CPUs with
  AVX-512-BF16 or AMX; elsewhere it is emulated, many times slower, and the run says so at start.
- `fp16`: autocast to float16 with a GradScaler (its state is checkpointed); GPU only.
- `fp32`: autocast and scaler disabled: the same lines run, doing nothing.
"""
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.amp import GradScaler

from ..core.errors import ClearError, ConfigError
from ..core.hardware import Hardware, bf16_slowdown

log = logging.getLogger(__name__)

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class NonFiniteLoss(ClearError):
    """The loss became inf or NaN on a step the loss scaler did not skip."""


class Precision:
    def __init__(self, name: str, device: torch.device, native_bf16: bool = True):
        if name not in DTYPES:
            raise ConfigError(f"precision={name}: pick one of {', '.join(DTYPES)}")
        if name == "fp16" and device.type != "cuda":
            raise ConfigError("precision=fp16 needs a GPU for its loss scaling: use precision=bf16 on the CPU")
        self.name, self.dtype, self.device_type = name, DTYPES[name], device.type
        self.native_bf16 = native_bf16
        self.scaler = GradScaler(device.type, enabled=name == "fp16")
        # Device-side counters, read once per logging window: no sync per step.
        self.skipped = torch.zeros((), dtype=torch.long, device=device)  # fp16 steps the scaler skipped
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=device)

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def clip(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        """Scale the gradients down to a total norm of `max_norm` at most (0: leave them), measured on the real
        gradients: under fp16 they are unscaled first, and the scaler's step then knows not to unscale again."""
        if max_norm > 0:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_([param for group in optimizer.param_groups for param in group["params"]],
                                           max_norm)

    @contextmanager
    def stepping(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer, step: int) -> Iterator[GradScaler]:
        """Around the optimizer's step through the loss scaler, `scaler.step(optimizer)` (train.py: step), after
        `backward`: on the way out, the step counted as skipped where fp16's gradients overflowed, a non-finite loss
        it did not skip noted, and the scale updated, once a step and after the step, as GradScaler requires."""
        yield self.scaler
        skipped = torch.zeros((), dtype=torch.long, device=loss.device)
        if self.scaler.is_enabled():
            # Whether this step's gradients overflowed, and so were not applied: GradScaler keeps it as a tensor on
            # the device, in a private dict that update() clears, so it is read here, before update(). Its public
            # trace, the scale halved, would take a sync each step to read; this adds to a device counter instead.
            for found_inf in self.scaler._found_inf_per_device(optimizer).values():
                skipped = skipped + found_inf.to(torch.long)
            self.skipped += skipped.clamp(max=1)
        self.scaler.update()
        bad = ~torch.isfinite(loss.detach()) & (skipped == 0)
        self.first_bad_step.copy_(torch.where(bad & (self.first_bad_step < 0), step, self.first_bad_step))

    def check(self) -> None:
        """Stop the run if a step applied a non-finite loss (one sync, at the end of a logging window)."""
        step = int(self.first_bad_step.item())
        if step >= 0:
            raise NonFiniteLoss(
                f"the training loss became inf or NaN at step {step}: lower optim.lr or raise "
                f"schedule.warmup_epochs{'; or try precision=bf16' if self.name == 'fp16' and self.native_bf16 else ''}. "
                "resume=auto restarts from the last checkpoint, written before it")

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.scaler.load_state_dict(state)


def make_precision(name: str, device: torch.device, hardware: Hardware) -> Precision:
    """The precision `name`; bf16 where this machine emulates it goes on, after one warning with the measured cost."""
    precision = Precision(name, device, hardware.native_bf16)
    if name == "bf16" and not hardware.native_bf16:
        log.warning("precision=bf16 is emulated here, and slow: %s; a 3x3 convolution took %.0fx as long under bf16 "
                    "autocast as in fp32, measured now. precision=%s computes faster; going on with bf16",
                    hardware.bf16_fact, bf16_slowdown(device), "fp16" if hardware.tensor_cores else "fp32")
    return precision
