"""A fine-tune's frozen warm-up: in its epochs only the head trains, the backbone's weights and BatchNorm statistics
unchanged; after them, everything trains."""
import pytest
import torch
import torchvision

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.loop.freeze import FrozenBackbone
from {{ cookiecutter.package }}.loop.optim import sgd

from helpers.runs import SMALL_MODEL


def changed(before: dict[str, torch.Tensor], model: torch.nn.Module) -> set[str]:
    """The tensors of `model`'s state, buffers included, that differ from `before`."""
    return {name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])}


def test_the_backbone_stays_as_it_was_while_frozen_and_trains_after():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3)
    freeze = FrozenBackbone(model, epochs=1, outputs=3, name="resnet18", pretrained=True)
    optimizer = sgd(model, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, fused=False)  # decay would move frozen weights

    def train_steps(epoch: int, steps: int = 1) -> None:
        model.train()
        freeze.set_epoch(epoch)
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.tensor([0, 1, 2, 0]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    train_steps(epoch=0)
    assert changed(before, model) == {"fc.weight", "fc.bias"}  # BatchNorm's running statistics included
    train_steps(epoch=1)
    assert {"conv1.weight", "layer4.1.bn2.weight", "bn1.running_mean"} <= changed(before, model)


def test_without_freeze_epochs_nothing_is_frozen():
    model = torchvision.models.resnet18(num_classes=3)
    model.train()
    FrozenBackbone(model, epochs=0, outputs=3, name="resnet18", pretrained=False).set_epoch(0)
    assert all(parameter.requires_grad for parameter in model.parameters()) and all(
        module.training for module in model.modules())


def test_freezing_random_weights_is_refused():
    with pytest.raises(ConfigError, match="train.freeze_epochs=2 freezes all but the head, and model.weights=null"):
        FrozenBackbone(torchvision.models.resnet18(num_classes=3), epochs=2, outputs=3, name="resnet18",
                       pretrained=False)


def test_a_fine_tune_run_trains_only_the_head_in_its_frozen_epoch(train_in_process, tmp_path):
    """Through the real loop: one epoch, frozen, from a file of another class count."""
    weights = torchvision.models.get_model(SMALL_MODEL, num_classes=10).state_dict()
    torch.save(weights, tmp_path / "weights.pt")
    summary = train_in_process(f"model.weights={tmp_path / 'weights.pt'}", "train.freeze_epochs=1")
    assert summary.steps == 6
    trained = torch.load(train_in_process.run_dir / "last.pt")["model"]
    assert trained["fc.weight"].shape == (3, weights["fc.weight"].shape[1])
    assert [name for name in weights if not name.startswith("fc.") and not torch.equal(trained[name], weights[name])] \
        == []


def test_the_frozen_layers_are_those_the_wrapped_model_runs(train_in_process, tmp_path, monkeypatch):
    """distributed.sync_bn swaps every BatchNorm layer for a SyncBatchNorm as the model is wrapped: a freeze built on
    the layers before the swap would leave the running ones training, their statistics overwritten. The swap is
    done here in one process (a SyncBatchNorm outside a process group normalises as a BatchNorm does)."""
    from {{ cookiecutter.package }}.core.distributed import World

    monkeypatch.setattr(World, "wrap", lambda self, model, sync_bn, partly_frozen=False:
                        torch.nn.SyncBatchNorm.convert_sync_batchnorm(model))
    weights = torchvision.models.get_model(SMALL_MODEL, num_classes=10).state_dict()
    torch.save(weights, tmp_path / "weights.pt")
    train_in_process(f"model.weights={tmp_path / 'weights.pt'}", "train.freeze_epochs=1")
    trained = torch.load(train_in_process.run_dir / "last.pt")["model"]
    statistics = [name for name in weights if name.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert statistics and [name for name in statistics if not torch.equal(trained[name], weights[name])] == []
