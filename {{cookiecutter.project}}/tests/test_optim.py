"""The optimizers' own promise, beyond what every optim option is checked for (tests/test_config.py): AdamW's
decay is decoupled from the gradient and spares norms and biases."""
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
