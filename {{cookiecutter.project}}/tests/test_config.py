"""Every option of every config group composes and builds; the list comes from globbing conf/."""
import json
import sys

import pytest
import torch
from conftest import CONF

from {{ cookiecutter.package }}.config import build
from {{ cookiecutter.package }}.data import Splits

OPTIONS = sorted((path.parent.name, path.stem) for path in CONF.glob("*/*.yaml"))


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                               torch.nn.LazyLinear(3))


# What the training script passes each group at build time, and what the built object must do.
def check_data(splits, cfg, tmp_path, option):
    assert isinstance(splits, Splits) and len(splits.classes) == 3
    image, label = splits.train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, cfg.data.crop_size, cfg.data.crop_size)
    assert 0 <= label < 3 and len(splits.val) == 12


def check_model(model, cfg, tmp_path, option):
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def check_optim(optimizer, cfg, tmp_path, option):
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == cfg.optim.weight_decay and plain["weight_decay"] == 0.0
    assert all(p.ndim <= 1 for p in plain["params"]) and all(p.ndim > 1 for p in decayed["params"])


def check_schedule(scheduler, cfg, tmp_path, option):
    peak = cfg.optim.lr
    lrs = []
    for _ in range(20):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(peak * cfg.schedule.warmup_start)
    assert max(lrs) == pytest.approx(peak, rel=0.05) and lrs.index(max(lrs)) <= 5
    assert lrs[-1] < 0.05 * peak


def check_logger(logger, cfg, tmp_path, option):
    logger.scalars({"train/loss": 1.5}, 1)
    logger.close()
    assert any((tmp_path / "tb").glob("events.*")) == (option == "tensorboard")


def check_profiler(profiler, cfg, tmp_path, option):
    with profiler:
        for _ in range(4):
            torch.ones(64, 64) @ torch.ones(64, 64)
            profiler.step()
    written = {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file()}
    expected = {"none": set(), "torch": {"profile/trace.json"}, "cprofile": {"profile.prof"}}
    assert written == expected[option]
    if "profile/trace.json" in written:
        assert json.loads((tmp_path / "profile/trace.json").read_text())["traceEvents"]


def schedule_args(tmp_path):
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.2)
    return {"optimizer": optimizer, "total_steps": 20, "steps_per_epoch": 5}


RUNTIME = {
    "data": (lambda tmp_path: {}, check_data),
    "model": (lambda tmp_path: {"data_classes": 3}, check_model),
    "optim": (lambda tmp_path: {"model": tiny_model()}, check_optim),
    "schedule": (schedule_args, check_schedule),
    "logger": (lambda tmp_path: {"run_dir": tmp_path}, check_logger),
    "profiler": (lambda tmp_path: {"run_dir": tmp_path}, check_profiler),
}


def test_every_group_has_a_check():
    assert {group for group, _ in OPTIONS} == set(RUNTIME), "a new config group needs its entry in RUNTIME"


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_builds(group, option, compose_tiny, tmp_path):
    cfg = compose_tiny(f"{group}={option}")
    runtime, check = RUNTIME[group]
    if group == "schedule":  # the schedule's peak is the optimizer's lr
        cfg.optim.lr = 0.2
    built = build(cfg[group], **runtime(tmp_path))
    check(built, cfg, tmp_path, option)


def test_missing_optional_backend_is_refused_in_one_line_naming_its_extra(monkeypatch, tmp_path):
    from {{ cookiecutter.package }}.config import ConfigError
    from {{ cookiecutter.package }}.logger import tensorboard

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an absent package looks like to import
    with pytest.raises(ConfigError, match=r"tensorboard is not installed .*: pip install -e '\.\[tensorboard\]'"):
        tensorboard(tmp_path)
