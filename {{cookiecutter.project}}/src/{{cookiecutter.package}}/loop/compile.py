"""torch.compile (`model.compile=true`) and its mode (`model.compile_mode`): `default` fuses kernels;
`reduce-overhead` also records each step as CUDA graphs, replayed with one launch instead of hundreds, for models
whose step is bound by the host's launches (small images, small models); `max-autotune` also searches kernel
configurations, at minutes of compile time. The modes are torch's own (torch._inductor.list_mode_options()).

The compilation is done by a timed warm-up before training, so its minutes never count as step time. CUDA graphs
replay a recorded step on the same shapes and addresses: a run whose shapes change from step to step (progressive
resizing) or whose steps alternate two backward passes (gradient accumulation, DDP's no_sync) is refused with the
reason. Each call marks a new graph step (torch.compiler.cudagraph_mark_step_begin), so that the outputs a loop
still holds from the last call are never overwritten under it; validation's last, shorter batch records its own.
"""
import logging
import time

import torch

from ..core.errors import ConfigError

log = logging.getLogger(__name__)

GRAPH_WARM_UP = 3  # cudagraph trees run a call eagerly, record the next, and replay from the third
DEFAULT = "default"  # torch.compile's mode without options of its own: no CUDA graphs
# The devices on which CUDA graphs have passed their training test (tests/test_precision.py, in the `gpu` tier that
# pytest -m gpu runs); the verdict and tune offer them there alone. On torch 2.11 and an H200 the test fails: the warm-up's
# backward reads a graph output already overwritten (docs/benchmarks.md). Add "cuda" once it passes.
GRAPHS_PASSED_ON: tuple[str, ...] = ()


def mode_options(mode: str | None = None) -> dict:
    """torch._inductor.list_mode_options, imported only where a run asks for a mode of its own: the import pulls in
    TorchDynamo and costs some 2.5 s of every start."""
    import torch._inductor
    return torch._inductor.list_mode_options(mode)


def uses_graphs(mode: str) -> bool:
    """Whether torch.compile's `mode` records CUDA graphs (on a CUDA device)."""
    return mode != DEFAULT and bool(mode_options(mode).get("triton.cudagraphs"))


def graphs_refused(mode: str, accumulate: int, crop_sizes: int) -> str | None:
    """Why this run cannot replay CUDA graphs, in one line; None where it can, or where `mode` records none."""
    if not uses_graphs(mode):
        return None
    if accumulate > 1:
        return (f"model.compile_mode={mode} replays one recorded step as CUDA graphs, and train.accumulate="
                f"{accumulate} alternates steps that hold their gradients with one that all-reduces them: pass "
                "train.accumulate=1, or model.compile_mode=default")
    if crop_sizes > 1:
        return (f"model.compile_mode={mode} replays CUDA graphs recorded for one input shape, and progressive "
                f"resizing trains at {crop_sizes} crop sizes, each recorded again into its own memory: pass "
                "data.start_crop_size=null, or model.compile_mode=default")
    return None


def check_mode(enabled: bool, mode: str, accumulate: int, crop_sizes: int) -> None:
    """Refuse, in one line, a mode torch does not know, a mode without model.compile=true, and CUDA graphs where
    the run's steps cannot replay them."""
    if mode == DEFAULT:
        return
    modes = list(mode_options())
    if mode not in modes:
        raise ConfigError(f"model.compile_mode={mode} is not one of torch.compile's modes: {', '.join(modes)}")
    if not enabled:
        raise ConfigError(f"model.compile_mode={mode} sets how torch.compile compiles, and model.compile=false: "
                          "pass model.compile=true too")
    if why := graphs_refused(mode, accumulate, crop_sizes):
        raise ConfigError(why)


def mark_step(module: torch.nn.Module, args: tuple) -> None:
    torch.compiler.cudagraph_mark_step_begin()


def compiled(model: torch.nn.Module, enabled: bool, batch_shape: tuple[int, ...], precision,
             memory_format: torch.memory_format = torch.contiguous_format, mode: str = "default",
             val_side: int | None = None) -> torch.nn.Module:
    """torch.compile(model, mode=mode), compiled now on batches of zeros, which leave no trace: a training pass
    (forward and backward) at `batch_shape` and a validation one (forward without gradients) at `val_side` pixels
    (None: the training side), each a graph of its own; with CUDA graphs, each pass until its graph replays.

    The zeros have the inputs' memory format: compiled for other strides, the first real step would compile
    again. The training pass updates the normalisation layers' running statistics, which are put back after it.
    """
    if not enabled:
        return model
    images = torch.zeros(batch_shape, device=next(model.parameters()).device).contiguous(
        memory_format=memory_format)  # only a compiled run needs it
    val_images = images if val_side is None else torch.zeros(
        (*batch_shape[:2], val_side, val_side), device=images.device).contiguous(memory_format=memory_format)
    graphs = uses_graphs(mode) and images.device.type == "cuda"
    if uses_graphs(mode) and not graphs:
        log.info("model.compile_mode=%s: CUDA graphs need a CUDA device; compiling for %s without them", mode,
                 images.device)
    model = torch.compile(model, mode=mode)
    if graphs:
        model.register_forward_pre_hook(mark_step)
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    start = time.perf_counter()
    for _ in range(GRAPH_WARM_UP if graphs else 1):
        model.train()
        with precision.autocast():
            output = model(images)
        output.float().sum().backward()
        model.eval()
        with torch.no_grad(), precision.autocast():
            model(val_images)
    if images.device.type == "cuda":
        torch.cuda.synchronize(images.device)
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    log.info("model.compile=true (mode %s): compiled in %.1f s, before training; not counted in step times", mode,
             seconds)
    return model
