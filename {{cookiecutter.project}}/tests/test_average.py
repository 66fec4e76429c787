"""train.ema_decay: a moving average of the weights, BatchNorm's statistics included, which validation scores and
evaluate, predict and export use."""
import pytest
import torch

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.loop.average import WeightAverage


def small_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))


def test_the_average_follows_the_formula_with_its_warm_up_and_keeps_batch_counts():
    torch.manual_seed(0)
    model, decay = small_model(), 0.5
    average = WeightAverage(model, decay)
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for update in range(4):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
        model(torch.randn(8, 3))  # training mode: BatchNorm's running statistics and batch count move too
        average.update()
        kept = 0.0 if update == 0 else min(decay, (1 + update) / (10 + update))  # the first update copies
        for name, tensor in model.state_dict().items():
            expected[name] = tensor.clone() if not tensor.is_floating_point() else \
                kept * expected[name] + (1 - kept) * tensor
    averaged = average.weights()
    assert averaged.keys() == model.state_dict().keys()
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, expected[name])
    assert averaged["1.num_batches_tracked"] == 4
    assert not torch.equal(averaged["0.weight"], model.state_dict()["0.weight"])
    assert average.model is average.average and average.model is not model


def test_the_average_resumes_where_it_was_and_zero_turns_it_off():
    model = small_model()
    average = WeightAverage(model, 0.9)
    for _ in range(3):
        with torch.no_grad():
            model[0].weight.add_(1.0)
        average.update()
    resumed = WeightAverage(small_model(), 0.9)
    resumed.load_state_dict(average.state_dict())
    assert resumed.updates == 3 and torch.equal(resumed.weights()["0.weight"], average.weights()["0.weight"])
    off = WeightAverage(model, 0.0)
    off.update()
    assert off.model is model and off.state_dict() == {} and off.weights() == {}


def test_a_decay_of_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^train.ema_decay=1.0: .* must be below 1; try 0.9998"):
        WeightAverage(small_model(), 1.0)


def test_an_update_moves_nothing_between_the_host_and_the_device(monkeypatch):
    """Nothing is copied to or from a device at an update: on a GPU, that would be a sync per step."""
    model = small_model()
    average = WeightAverage(model, 0.9)
    moved = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: (moved.append(args or kwargs),
                                                                           to(self, *args, **kwargs))[1])
    for _ in range(3):
        average.update()
    assert moved == [] and average.updates == 3


@pytest.mark.gpu
def test_an_update_on_the_gpu_never_syncs():
    model = small_model().cuda()
    average = WeightAverage(model, 0.9)
    average.update()  # the first: a copy
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            average.update()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert average.updates == 4
