"""Compute switches: precision, the non-finite-loss guard, cudnn modes, channels_last and compile."""
import os
import re

import pytest
import torch

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import unwrap
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.data.device import ToDevice
from {{ cookiecutter.package }}.loop import cudnn
from {{ cookiecutter.package }}.loop.compile import check_mode, compiled
from {{ cookiecutter.package }}.loop.precision import NonFiniteLoss, Precision, make_precision

CPU = torch.device("cpu")


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))


def one_step(precision: Precision, model: torch.nn.Module, step: int, scale_loss: float = 1.0) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad(set_to_none=True)
    with precision.autocast():
        loss = model(torch.randn(2, 3, 8, 8)).float().sum() * scale_loss
    precision.backward(loss)
    with precision.stepping(loss, optimizer, step) as scaler:
        scaler.step(optimizer)


def test_bf16_autocasts_on_the_cpu_and_fp32_does_not():
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        with Precision(name, CPU).autocast():
            assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == dtype


def test_bf16_where_it_is_emulated_warns_once_at_start_with_the_measured_cost_and_goes_on(caplog):
    import logging

    from helpers.machines import AVX2, AVX512_BF16

    with caplog.at_level(logging.WARNING):
        precision = make_precision("bf16", CPU, AVX2)
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1 and precision.dtype == torch.bfloat16
    assert warned[0].startswith("precision=bf16 is emulated here, and slow: AMD EPYC has no native bf16 (no avx512_bf16")
    assert re.search(r"a 3x3 convolution took \d+x as long under bf16 autocast as in fp32, measured now\. "
                     r"precision=fp32 computes faster; going on with bf16$", warned[0]), warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        make_precision("bf16", CPU, AVX512_BF16)
        make_precision("fp32", CPU, AVX2)
    assert not caplog.records


def test_fp16_without_a_gpu_and_unknown_names_are_refused():
    with pytest.raises(ConfigError, match="precision=fp16 needs a GPU .* precision=bf16"):
        Precision("fp16", CPU)
    with pytest.raises(ConfigError, match="precision=fp8: pick one of fp32, fp16, bf16"):
        Precision("fp8", CPU)


def test_a_non_finite_loss_stops_the_run_with_its_step():
    precision, model = Precision("fp32", CPU), tiny_model()
    one_step(precision, model, step=6)
    precision.check()  # finite so far
    one_step(precision, model, step=7, scale_loss=float("nan"))
    one_step(precision, model, step=8, scale_loss=float("inf"))
    with pytest.raises(NonFiniteLoss, match="at step 7: lower optim.lr"):
        precision.check()


def test_steps_the_loss_scaler_skips_are_counted_not_failed():
    """fp16's mechanism, run with the CPU's GradScaler: an overflow skips the step and is counted."""
    precision, model = Precision("fp32", CPU), tiny_model()
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    before = [p.detach().clone() for p in model.parameters()]
    one_step(precision, model, step=1, scale_loss=float("inf"))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # not applied
    one_step(precision, model, step=2)
    assert int(precision.skipped) == 1 and precision.scaler.get_scale() == 2.0 ** 15
    precision.check()  # a skipped step is no failure
    restored = Precision("fp32", CPU)
    restored.scaler = torch.amp.GradScaler("cpu")
    restored.load_state_dict(precision.state_dict())
    assert restored.scaler.get_scale() == 2.0 ** 15


def test_a_step_whose_gradients_overflow_is_skipped_counted_and_halves_the_scale_on_any_device():
    """fp16 needs a GPU, and GradScaler's bookkeeping does not: an enabled scaler on the CPU goes through `stepping`
    as fp16's does, so its count of skipped steps and its update are checked on every machine."""
    model, precision = tiny_model(), Precision("fp32", CPU)
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = [param.detach().clone() for param in model.parameters()]
    one_step(precision, model, 1, scale_loss=float("inf"))
    assert all(torch.equal(old, new) for old, new in zip(before, model.parameters())), "the overflowing step applied"
    assert int(precision.skipped) == 1 and precision.scaler.get_scale() == 512.0
    precision.check()  # a loss the scaler skipped stops nothing
    one_step(precision, model, 2)
    assert int(precision.skipped) == 1 and precision.scaler.get_scale() == 512.0
    assert not all(torch.equal(old, new) for old, new in zip(before, model.parameters()))


def gradients(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([param.grad.flatten() for param in model.parameters()])


def test_clipping_scales_the_gradients_down_to_the_limit_and_leaves_smaller_ones():
    model, precision = tiny_model(), Precision("fp32", CPU)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision.backward(model(torch.randn(4, 3, 8, 8)).sum() * 1000)
    raw = gradients(model).clone()
    assert raw.norm() > 1.0
    precision.clip(optimizer, 0.0)
    assert torch.equal(gradients(model), raw), "0: no clipping"
    precision.clip(optimizer, 1.0)
    clipped = gradients(model)
    assert clipped.norm() <= 1.0 + 1e-5 and torch.allclose(clipped, raw / raw.norm(), atol=1e-6)  # same direction
    precision.clip(optimizer, 10.0)
    assert torch.equal(gradients(model), clipped), "already within the limit: left as they are"


def test_cudnn_modes_set_the_switches_they_name(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        cudnn.configure("deterministic")
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        cudnn.configure("benchmark")
        assert torch.backends.cudnn.benchmark and not torch.are_deterministic_algorithms_enabled()
    finally:
        cudnn.configure("default")
    assert not torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
    with pytest.raises(ConfigError, match="cudnn=fast"):
        cudnn.configure("fast")


def test_channels_last_converts_the_inputs():
    images = torch.zeros((2, 8, 8, 3), dtype=torch.uint8)
    moved, _ = ToDevice(PilDecoder(), CPU, False, torch.channels_last)((images, torch.tensor([0, 1])))
    assert moved.shape == (2, 3, 8, 8) and moved.is_contiguous(memory_format=torch.channels_last)
    plain, _ = ToDevice(PilDecoder(), CPU, False)((images, torch.tensor([0, 1])))
    assert plain.is_contiguous()


@pytest.mark.full
def test_compile_is_done_before_training_and_leaves_no_trace(caplog):
    torch.manual_seed(0)
    model, images = tiny_model(), torch.randn(4, 3, 8, 8)
    statistics = {name: buffer.clone() for name, buffer in model.named_buffers()}
    caplog.set_level("INFO")
    fast = compiled(model, True, images.shape, Precision("fp32", CPU))
    assert "compiled in" in caplog.text and unwrap(fast) is model
    assert all(torch.equal(buffer, statistics[name]) for name, buffer in model.named_buffers())
    assert all(p.grad is None for p in model.parameters())
    model.eval()
    assert torch.allclose(fast(images), model(images), atol=1e-5)
    assert compiled(model, False, images.shape, Precision("fp32", CPU)) is model


@pytest.mark.full  # torch.compile builds its kernels, 4 s
@pytest.mark.parametrize("val_side", [8, 12], ids=["same-side", "validated-larger"])
def test_compile_warm_up_covers_the_first_step_and_validation_in_channels_last(val_side):
    """Compiled for other strides, with gradients only or at the training side only (data.train_crop_size), the
    first step or validation would compile again."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = tiny_model().to(memory_format=torch.channels_last)
    images = torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    fast = compiled(model, True, images.shape, Precision("fp32", CPU), torch.channels_last, val_side=val_side)
    graphs = counters["stats"]["unique_graphs"]
    fast.train()
    fast(images).sum().backward()
    fast.eval()
    with torch.no_grad():
        fast(torch.randn(4, 3, val_side, val_side).contiguous(memory_format=torch.channels_last))
    assert graphs >= 2 and counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize(("enabled", "mode", "accumulate", "crop_sizes", "refused"), [
    (True, "fastest", 1, 1, "model.compile_mode=fastest is not one of torch.compile's modes: default, "),
    (False, "reduce-overhead", 1, 1, "and model.compile=false: pass model.compile=true too"),
    (True, "reduce-overhead", 2, 1, "train.accumulate=2 alternates steps that hold their gradients"),
    (True, "max-autotune", 1, 3, "progressive resizing trains at 3 crop sizes"),
    (True, "max-autotune-no-cudagraphs", 2, 3, None),  # no graphs: nothing to replay
    (True, "reduce-overhead", 1, 1, None)])
def test_compile_modes_are_torchs_own_and_cuda_graphs_refuse_steps_they_cannot_replay(
        enabled, mode, accumulate, crop_sizes, refused):
    if refused is None:
        check_mode(enabled, mode, accumulate, crop_sizes)
        return
    with pytest.raises(ConfigError, match=re.escape(refused)):
        check_mode(enabled, mode, accumulate, crop_sizes)


@pytest.mark.full  # torch.compile builds its kernels, 4 s
def test_cuda_graph_mode_trains_on_the_cpu_without_graphs_and_says_so(caplog, monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    torch.manual_seed(0)
    model, images = tiny_model(), torch.randn(4, 3, 8, 8)
    caplog.set_level("INFO")
    fast = compiled(model, True, images.shape, Precision("fp32", CPU), mode="reduce-overhead")
    assert "CUDA graphs need a CUDA device; compiling for cpu without them" in caplog.text
    before = model[-1].weight.detach().clone()
    one_step(Precision("fp32", CPU), fast, 0)
    assert not torch.equal(model[-1].weight, before) and marks == []  # trained; no graph step to mark


@pytest.mark.gpu
def test_cuda_graphs_train_as_the_eager_model_does_with_no_step_skipping_its_graph():
    from torch._dynamo.utils import counters

    gpu = torch.device("cuda")
    torch.manual_seed(0)
    model, eager = tiny_model().to(gpu), tiny_model().to(gpu)
    eager.load_state_dict(model.state_dict())
    fast = compiled(model, True, (4, 3, 8, 8), Precision("fp32", gpu), mode="reduce-overhead")
    pairs = [(fast, torch.optim.SGD(model.parameters(), lr=0.1)), (eager, torch.optim.SGD(eager.parameters(), lr=0.1))]
    for _ in range(4):  # past the warm-up's recording: these steps replay
        images = torch.randn(4, 3, 8, 8, device=gpu)
        losses = []
        for net, optimizer in pairs:
            net.train()
            optimizer.zero_grad(set_to_none=True)
            loss = net(images).float().square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())  # read before the next call, as the loop reads a step's outputs
        assert losses[0] == pytest.approx(losses[1], rel=1e-3)
    assert counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.gpu
def test_fp16_on_the_gpu_scales_the_loss_and_counts_a_skipped_step():
    gpu = torch.device("cuda")
    precision, model = Precision("fp16", gpu), tiny_model().to(gpu)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    images = torch.randn(2, 3, 8, 8, device=gpu)

    def step(number: int, scale_loss: float) -> None:
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            output = model(images)
            assert output.dtype == torch.float16
            loss = output.float().mean() * scale_loss
        precision.backward(loss)
        with precision.stepping(loss, optimizer, number) as scaler:
            scaler.step(optimizer)

    scale = precision.scaler.get_scale()
    before = [p.detach().clone() for p in model.parameters()]
    step(1, float("inf"))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the overflowing step was skipped
    assert int(precision.skipped) == 1 and precision.scaler.get_scale() == scale / 2
    step(2, 1e-3)  # small enough that its gradients, times the halved scale, stay finite in float16
    assert int(precision.skipped) == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    precision.check()
