"""The optimizers' own promise, beyond what every optim option is checked for (tests/test_config.py): AdamW's
decay is decoupled from the gradient and spares norms and biases, and what the model itself names; optim.fused
computes what the default kernels do, and keeps its kernel through a resume, with the state where that kernel
keeps it."""
import pytest
import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from {{ cookiecutter.package }}.loop.optim import adamw, sgd

OPTIMIZERS = {"sgd": lambda model, fused: sgd(model, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                              fused=fused),
              "adamw": lambda model, fused: adamw(model, lr=0.01, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.05,
                                                  fused=fused)}
FUSED_ON_CPU = pytest.mark.skipif("cpu" not in _get_fused_kernels_supported_devices(),
                                  reason=f"torch {torch.__version__} has no fused optimizer kernels for the CPU")


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))


def trained(make, fused: bool, steps: int = 5) -> torch.nn.Module:
    model = small_model()
    optimizer = make(model, fused)
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 6, generator=data)).square().mean().backward()
        optimizer.step()
    return model


@FUSED_ON_CPU
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_fused_kernel_takes_the_steps_the_default_one_does(name):
    fused, default = trained(OPTIMIZERS[name], True), trained(OPTIMIZERS[name], False)
    moved = [(after - before).abs().max() for after, before in zip(default.parameters(), small_model().parameters())]
    assert min(moved) > 1e-3  # five steps moved every parameter ...
    for ours, theirs in zip(fused.parameters(), default.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)  # ... and both kernels alike


@FUSED_ON_CPU
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_run_resumed_with_fused_steps_with_the_fused_kernel(name):
    saved = OPTIMIZERS[name](small_model(), False)
    resumed = OPTIMIZERS[name](small_model(), True)
    resumed.load_state_dict(saved.state_dict())
    assert all(group["fused"] and not group["foreach"] for group in resumed.param_groups)


def stepped(optimizer: torch.optim.Optimizer, model: torch.nn.Module, device: str) -> torch.optim.Optimizer:
    optimizer.zero_grad()
    model(torch.randn(4, 6, device=device)).square().mean().backward()
    optimizer.step()
    return optimizer


def placement(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The device and dtype of every state tensor, parameter by parameter."""
    return [{key: (value.device, value.dtype) for key, value in optimizer.state[param].items()}
            for group in optimizer.param_groups for param in group["params"]]


def resumed_and_fresh(fused_before: bool, device: str) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """An AdamW saved after one step with optim.fused=fused_before, resumed with the other setting and stepped once,
    beside a fresh AdamW of the other setting stepped once. AdamW, because SGD keeps no `step` in its state."""
    saving_model = small_model().to(device)
    saved = stepped(OPTIMIZERS["adamw"](saving_model, fused_before), saving_model, device).state_dict()
    model, fresh_model = small_model().to(device), small_model().to(device)
    resumed = OPTIMIZERS["adamw"](model, not fused_before)
    resumed.load_state_dict(saved)
    return (stepped(resumed, model, device),
            stepped(OPTIMIZERS["adamw"](fresh_model, not fused_before), fresh_model, device))


@pytest.fixture
def float64_by_default():
    """torch gives a foreach kernel's `step` the default dtype and a fused kernel's float32, so under float64 a CPU
    shows whether a resume moved `step`. Its device, the other half, only a GPU can show (the test on CUDA below)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


@FUSED_ON_CPU
@pytest.mark.parametrize("fused_before", [True, False], ids=["fused-to-foreach", "foreach-to-fused"])
def test_a_resume_that_changes_optim_fused_keeps_the_state_where_a_fresh_optimizer_would(fused_before,
                                                                                         float64_by_default):
    resumed, fresh = resumed_and_fresh(fused_before, "cpu")
    assert placement(resumed) == placement(fresh)
    assert {state["step"].item() for state in resumed.state.values()} == {2.0}  # the saved step carried on


@pytest.mark.gpu
@pytest.mark.parametrize("fused_before", [True, False], ids=["fused-to-foreach", "foreach-to-fused"])
def test_a_resume_that_changes_optim_fused_steps_on_cuda_with_the_state_where_a_fresh_optimizer_keeps_it(
        fused_before):
    resumed, fresh = resumed_and_fresh(fused_before, "cuda")  # foreach-to-fused failed this step on `step`'s device
    assert placement(resumed) == placement(fresh)
    assert {state["step"].item() for state in resumed.state.values()} == {2.0}


def test_adamw_shrinks_conv_and_linear_weights_by_lr_times_decay_and_leaves_norms_and_biases():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4, 2))
    optimizer = adamw(model, lr=0.1, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.5, fused=False)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    for param in model.parameters():
        param.grad = torch.zeros_like(param)  # Adam's own step is zero: what moves is the decay alone
    optimizer.step()
    for name, param in model.named_parameters():
        expected = before[name] * (1 - 0.1 * 0.5) if param.ndim > 1 else before[name]
        assert torch.allclose(param, expected), name
    assert sum(param.ndim > 1 for param in model.parameters()) == 2


class WithPositions(torch.nn.Module):
    """A vision transformer's shape of the problem: a 3-dimensional position embedding that timm's models name in
    no_weight_decay(), beside a linear layer."""

    def __init__(self):
        super().__init__()
        self.pos_embed = torch.nn.Parameter(torch.ones(1, 4, 2))
        self.head = torch.nn.Linear(2, 2)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}


def test_adamw_spares_what_the_model_names_in_no_weight_decay():
    model = WithPositions()
    optimizer = adamw(model, lr=0.1, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.5, fused=False)
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    assert torch.equal(model.pos_embed, torch.ones(1, 4, 2))
    decayed = [group for group in optimizer.param_groups if group["weight_decay"]]
    assert [param.shape for param in decayed[0]["params"]] == [model.head.weight.shape]


class WithEncodedPositions(torch.nn.Module):
    """XCiT's shape of the problem: the position encoding is a module, whose 2-dimensional projection weight a
    model names in no_weight_decay() through the module's name or a pattern."""

    def __init__(self, spared: set[str]):
        super().__init__()
        self.pos_embed = torch.nn.Linear(2, 2)
        self.head = torch.nn.Linear(2, 2)
        self.spared = spared

    def no_weight_decay(self) -> set[str]:
        return self.spared


def decayed(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> set[str]:
    """The names of the parameters `optimizer` decays."""
    ids = {id(param) for group in optimizer.param_groups if group["weight_decay"] for param in group["params"]}
    return {name for name, param in model.named_parameters() if id(param) in ids}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("spared", ["pos_embed", "pos_embed.*", "pos_*.weight"])
def test_the_parameters_of_a_module_the_model_names_or_matches_are_not_decayed(name, spared):
    model = WithEncodedPositions({spared})
    assert decayed(OPTIMIZERS[name](model, False), model) == {"head.weight"}


def test_adamw_spares_what_timms_xcit_names_in_no_weight_decay():
    timm = pytest.importorskip("timm", reason="timm's models need the timm extra: pip install -e '.[timm]'")
    model = timm.create_model("xcit_nano_12_p16_224", pretrained=False, num_classes=2)
    optimizer = adamw(model, lr=0.1, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.5, fused=False)
    named = {name for name, param in model.named_parameters()
             if name.startswith(("pos_embed.", "cls_token")) and param.ndim > 1}
    assert "pos_embed.token_projection.weight" in named  # what only no_weight_decay() keeps from decay ...
    assert not named & decayed(optimizer, model)  # ... is kept from it
