"""The optimizers' own promise, beyond what every optim option is checked for (tests/test_config.py): AdamW's
decay is decoupled from the gradient and spares norms and biases, and what the model itself names."""
import torch

from {{ cookiecutter.package }}.loop.optim import adamw


def test_adamw_shrinks_conv_and_linear_weights_by_lr_times_decay_and_leaves_norms_and_biases():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4, 2))
    optimizer = adamw(model, lr=0.1, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.5)
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
    optimizer = adamw(model, lr=0.1, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.5)
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    assert torch.equal(model.pos_embed, torch.ones(1, 4, 2))
    decayed = [group for group in optimizer.param_groups if group["weight_decay"]]
    assert [param.shape for param in decayed[0]["params"]] == [model.head.weight.shape]
