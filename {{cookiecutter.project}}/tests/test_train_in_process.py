"""train() called as a function on debug=tiny: the whole loop in seconds, and every bad command line refused in one
line before anything is written. The fast tier's run; the command-line runs are in test_train.py."""
import json
import logging
import re
from dataclasses import asdict

import pytest
import torch
from hydra.errors import HydraException

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.packages import not_installed
from {{ cookiecutter.package }}.core.failures import explain
from {{ cookiecutter.package }}.core.hardware import Hardware, probe
from {{ cookiecutter.package }}.diagnosis.verdict import EPOCH_START_SHARE
from {{ cookiecutter.package }}.loop.clock import Window
from {{ cookiecutter.package }}.loop.precision import Precision

from helpers.runs import BAD_INPUT, logged_windows


def test_one_tiny_run_trains_validates_checkpoints_and_reports_from_facts(train_in_process):
    summary = train_in_process()
    assert summary.steps == 6 and summary.skipped_files == 0  # 3 classes x 8 images, batch 4
    assert json.loads(json.dumps(asdict(summary))) == json.loads((train_in_process.run_dir / "summary.json").read_text())
    assert (train_in_process.run_dir / "last.pt").is_file() and any((train_in_process.run_dir / "tb").iterdir())
    best = torch.load(train_in_process.run_dir / "best.pt")  # what evaluate, predict and export read
    assert best["best_top1"] == summary.val_top1
    assert best["inference"]["classes"] == ["class_000", "class_001", "class_002"]
    assert summary.bound in ("data", "compute") and summary.images_per_s > 0
    assert {"loader/read_share", "loader/upload_share"} <= set(summary.system)  # the workers' and the uploads'
    assert Hardware.from_record(summary.hardware) == probe(torch.device(summary.hardware["device"]))
    assert [suggestion["key"] for suggestion in summary.suggestions] and len(summary.suggestions) == len(
        summary.advice)
    assert all(line.endswith(f"({suggestion['fact']}).")
               for line, suggestion in zip(summary.advice, summary.suggestions))
    setup = summary.setup  # before the first step, by stage, and the first batch after it
    assert 0 < setup["data_s"] + setup["workers_s"] <= setup["total_s"] and setup["first_batch_s"] > 0


def test_a_class_folder_tree_trains_and_the_run_ends_with_the_report(train_in_process, caplog):
    """A user's own photos, as the README's first screen trains on them: data=folder on a train/ and val/ tree."""
    caplog.set_level(logging.INFO)
    assert train_in_process("data=folder").choices["data"] == "folder"
    assert "==== where the time went ====" in caplog.text


def test_training_top1_is_logged_per_window_and_the_epochs_is_reported_beside_validations_chance(train_in_process,
                                                                                                  caplog):
    """3 classes: the validation line gives the chance level, 33.33%, and no top-5, which every image would hit.
    Validation's top-1 against the run's seconds is logged at its step, the seconds beside it."""
    caplog.set_level(logging.INFO)
    summary = train_in_process("logger=jsonl")
    windows = [json.loads(line) for line in (train_in_process.run_dir / "scalars.jsonl").read_text().splitlines()]
    (by_time,) = [window for window in windows if "val/top1_by_second" in window]
    assert by_time == {"step": 6, "val/top1_by_second": summary.val_top1, "time/elapsed_s": summary.best_top1["at_s"]}
    top1s = [window["train/top1"] for window in windows if "train/top1" in window]
    assert len(top1s) == 3  # 6 steps, a window every 2 steps of 4 images
    assert summary.train_top1 == pytest.approx(sum(top1s) / 3) and (summary.classes, summary.val_top5) == (
        3, None)
    assert not any("val/top5" in window for window in windows)
    (line,) = [record.getMessage() for record in caplog.records if "val top-1" in record.getMessage()]
    assert line == (f"epoch 1 step 6: val top-1 {summary.val_top1:.2f}% (chance 33.33%); train top-1 "
                    f"{summary.train_top1:.2f}% on the epoch's batches")
    run_dir = train_in_process.run_dir  # the report's last line says where to read it again
    assert caplog.records[-1].getMessage().endswith(
        f"this report is kept in {run_dir / 'train.log'}, its figures in {run_dir / 'summary.json'}")


def test_a_run_in_blocks_trains_every_step_and_keeps_the_layout_its_epoch_was_drawn_for(train_in_process):
    summary = train_in_process("format=hdf5", "order=blocks", "order.block=4", "order.window=2",
                               "loader.num_workers=2")
    assert summary.steps == 6 and summary.skipped_files == 0
    saved = torch.load(train_in_process.run_dir / "last.pt", weights_only=False)
    assert saved["loader"] == {"layout": {"processes": 1, "workers": (2,), "batch_size": 4}}
    assert [(entry["trained"], entry["left_out"]) for entry in summary.coverage] == [(24, 0)]


@pytest.mark.full  # starts loader workers six times over two runs, 4-6 s
def test_workers_started_again_at_every_epoch_show_in_its_start_and_get_named(train_in_process):
    """3 epochs of one step with 2 workers: without persistent workers each epoch starts them again, a good share of
    so short an epoch."""
    shrunk = ("data.train_per_class=2", "loader.num_workers=2", "train.epochs=3")
    restarting = train_in_process(*shrunk, "loader.persistent_workers=false")
    windows = [Window(**window) for window, _ in torch.load(train_in_process.run_dir / "last.pt",
                                                            weights_only=False)["windows"]["windows"]]
    kept = train_in_process(*shrunk, "loader.persistent_workers=true")
    assert len(restarting.epoch_start_ms) == len(kept.epoch_start_ms) == 3
    assert sum(restarting.epoch_start_ms[1:]) > sum(kept.epoch_start_ms[1:])
    # Named where, after the first window, the starts cost the share the rule asks for (7-20% measured here).
    after_the_first = sum(windows[1:], Window())
    costly = after_the_first.epoch_start_s >= EPOCH_START_SHARE * after_the_first.wall_s
    named = [suggestion for suggestion in restarting.suggestions if suggestion["key"] == "loader.persistent_workers"]
    assert len(named) == costly and all(keep["value"] == "true" and "ms for its first batch" in keep["fact"]
                                        for keep in named)
    assert "loader.persistent_workers" not in {suggestion["key"] for suggestion in kept.suggestions}


def test_a_step_that_does_not_come_leaves_every_threads_stack_and_the_run_goes_on(train_in_process, caplog):
    """Each forward pass sleeps 1.5 s (faults.host_delay_ms): four times the 0.36 s distributed.stall_min allows."""
    summary = train_in_process("faults.host_delay_ms=1500", "distributed.stall_min=0.006", "train.max_steps=1",
                               "train.limit_val_batches=1")
    assert summary.steps == 1
    stacks = (train_in_process.run_dir / "stacks-rank0.txt").read_text()
    assert re.search(r"^==== rank 0, pid \d+, .*: no progress for \d+ s \(distributed.stall_min=0.006\) ====$",
                     stacks, re.MULTILINE)
    main = stacks.split("--- thread MainThread ---", 1)[1].split("--- thread ", 1)[0]
    assert "time.sleep(host_delay_ms / 1000)" in main  # where the main thread stood: the injected sleep
    assert "--- thread stall-watchdog (this one) ---" in stacks
    assert any("every thread's stack is in" in record.getMessage() and record.levelname == "WARNING"
               for record in caplog.records)


@pytest.mark.parametrize("choice", [f"{group}={name}" for group in options.options_groups()
                                    for name in options.options(group) if options.facts(group, name).module])
def test_an_option_whose_package_is_missing_stops_the_run_before_anything_is_written(choice, train_in_process,
                                                                                     monkeypatch):
    """Not deep inside the run, after the data is listed, and not without the option's name: the line names both, and
    for a CPU decoder the fastest one installed instead."""
    group, _, name = choice.partition("=")
    facts, importable = options.facts(group, name), options.importable
    monkeypatch.setattr(options, "importable", lambda module: module != facts.module and importable(module))
    instead = (f"; or pick decoder={options.fastest_cpu_decoder()}, the fastest CPU decoder installed here"
               if facts.decode_us else "")
    with pytest.raises(ConfigError) as refused:
        train_in_process(choice)
    assert str(refused.value) == f"{choice}: {not_installed(facts.module, facts.extra)}{instead}"
    assert list(train_in_process.run_dir.iterdir()) == []


@pytest.mark.parametrize("overrides", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_refused_in_one_line_before_anything_is_written(overrides, train_in_process):
    with pytest.raises(BaseException) as raised:
        train_in_process(*overrides)
    line = str(raised.value) if isinstance(raised.value, HydraException) else explain(raised.value)
    assert line is not None, f"{raised.value!r} would print a traceback"
    key, _, value = overrides[-1].partition("=")
    assert key in line or value in line, line
    assert list(train_in_process.run_dir.iterdir()) == []


def test_train_clip_grad_norm_reaches_every_step(train_in_process, monkeypatch):
    limits = []
    clip = Precision.clip
    monkeypatch.setattr(Precision, "clip", lambda self, optimizer, max_norm: (limits.append(max_norm),
                                                                               clip(self, optimizer, max_norm)))
    summary = train_in_process("train.clip_grad_norm=0.5")
    assert len(limits) == summary.steps > 0 and set(limits) == {0.5}


def test_train_ema_decay_validates_and_saves_the_average_that_evaluate_uses(train_in_process, monkeypatch):
    from {{ cookiecutter.package }} import train as train_module
    from {{ cookiecutter.package }}.loop.checkpoint import load_trained
    from {{ cookiecutter.package }}.loop.model import trained_model

    scored = []  # the weights each validation scored, beside the live ones
    score = train_module.score

    def recording(model, *args, **kwargs):
        scored.append({name: tensor.clone() for name, tensor in model.state_dict().items()})
        return score(model, *args, **kwargs)

    monkeypatch.setattr(train_module, "score", recording)
    summary = train_in_process("train.ema_decay=0.9", "train.epochs=2")
    last, inference = load_trained(str(train_in_process.run_dir / "last.pt"), torch.device("cpu"))
    assert len(scored) == 2 and last["ema"]["updates"] == summary.steps
    for name, tensor in last["ema"]["weights"].items():
        assert torch.equal(tensor, scored[-1][name]), name  # the last validation scored the saved average
    assert not torch.equal(last["ema"]["weights"]["fc.weight"], last["model"]["fc.weight"])  # not the live weights
    used = trained_model(last, inference).state_dict()  # what evaluate, predict and export load
    assert all(torch.equal(used[name], tensor) for name, tensor in last["ema"]["weights"].items())


def test_train_mixup_and_cutmix_reach_every_step_with_soft_targets(train_in_process, monkeypatch):
    targets = []
    criterion = torch.nn.CrossEntropyLoss.forward
    monkeypatch.setattr(torch.nn.CrossEntropyLoss, "forward",
                        lambda self, output, target: (targets.append(target), criterion(self, output, target))[1])
    summary = train_in_process("train.mixup_alpha=0.2", "train.cutmix_alpha=1.0")
    assert len(targets) == summary.steps > 0  # validation scores without the loss
    assert all(target.shape == (4, 3) and torch.allclose(target.sum(dim=1), torch.ones(4)) for target in targets)


@pytest.mark.parametrize("step", ["train.accumulate=4", "train.global_batch=16"])
def test_train_accumulate_steps_once_per_group_and_trains_every_image(train_in_process, caplog, step):
    """Four batches of 4 a step, asked for as such or as a global batch of 16 images on one process."""
    caplog.set_level(logging.INFO)
    summary = train_in_process(step, "train.epochs=2")
    assert summary.steps == 4  # 6 batches an epoch: a step of 4, then one of the last 2
    assert len(re.findall(r"epoch \d trained each of its 24 images once", caplog.text)) == 2, caplog.text


def test_a_resume_with_another_accumulation_goes_on_along_the_same_learning_rate_curve(train_in_process, tmp_path):
    """The schedule's place is the run's position in epochs, not its count of steps, which changes with the number
    of processes as with train.accumulate. Cut after 3 steps of one batch (12 of the epoch's 24 images), the run
    resumes in steps of two batches, and each trains at the rate the uninterrupted run had at the same image."""
    plan = ("train.epochs=2", "logger=jsonl", "train.log_every=1")
    train_in_process(*plan, run_dir=tmp_path / "whole")
    whole = [window["train/lr"] for window in logged_windows(tmp_path / "whole")]  # a step at every 4th image
    assert len(whole) == 12 and whole[0] < max(whole) and whole[-1] < 0.1 * max(whole)
    train_in_process(*plan, "train.max_steps=3", run_dir=tmp_path / "cut")
    train_in_process(*plan, "train.accumulate=2", "resume=auto", run_dir=tmp_path / "cut")
    # Its steps start at the run's images 12 and 20 (the epoch's last batch alone), then every 8th image.
    expected = [whole[images // 4] for images in (0, 4, 8, 12, 20, 24, 32, 40)]
    assert [window["train/lr"] for window in logged_windows(tmp_path / "cut")] == pytest.approx(expected, abs=1e-9)


def test_a_run_cut_and_resumed_with_mixup_cutmix_and_dropout_ends_with_the_uninterrupted_runs_weights(
        train_in_process, tmp_path):
    """The step's draws are seeded per batch, not once per start: a resume draws the mixes and dropout masks the
    uninterrupted run drew (mobilenet_v3_small drops 20% of its classifier's inputs), to the bit."""
    plan = ("model.name=mobilenet_v3_small", "train.mixup_alpha=0.2", "train.cutmix_alpha=1.0")  # 6 steps
    train_in_process(*plan, run_dir=tmp_path / "whole")
    train_in_process(*plan, "train.max_steps=3", run_dir=tmp_path / "cut")
    train_in_process(*plan, "resume=auto", run_dir=tmp_path / "cut")
    whole, resumed = (torch.load(tmp_path / name / "last.pt")["model"] for name in ("whole", "cut"))
    assert [name for name in whole if not torch.equal(whole[name], resumed[name])] == []


PROGRESSIVE = ("data.start_crop_size=16", "data.crop_ramp_epochs=[0,2]", "train.epochs=3")


@pytest.mark.parametrize(("overrides", "sizes"), [
    ((*PROGRESSIVE, "loader.num_workers=0"), [16] * 6 + [24] * 6 + [32] * 6),  # 6 batches an epoch
    ((*PROGRESSIVE, "loader.num_workers=2"), [16] * 6 + [24] * 6 + [32] * 6),
    # FixRes: trained at 16 (its ramp from 8 ending there), validated and served at data.crop_size, 32
    (("data.train_crop_size=16", "data.start_crop_size=8", "data.crop_ramp_epochs=[0,1]", "train.epochs=2",
      "loader.num_workers=2"), [8] * 6 + [16] * 6)], ids=["progressive-0", "progressive-2", "train_crop_size"])
def test_training_sizes_reach_the_workers_each_epoch_and_validation_keeps_the_crop_size(train_in_process,
                                                                                        monkeypatch, overrides, sizes):
    from {{ cookiecutter.package }} import train as train_module
    from {{ cookiecutter.package }}.loop.mix import BatchMix

    trained, validated = [], []
    mix = BatchMix.__call__
    monkeypatch.setattr(BatchMix, "__call__", lambda self, images, labels: (trained.append(images.shape[-2:]),
                                                                            mix(self, images, labels))[1])
    score = train_module.score

    def recording(model, loader, *args, **kwargs):
        return score(model, ((validated.append(images.shape[-2:]), (images, labels))[1] for images, labels in loader),
                        *args, **kwargs)

    monkeypatch.setattr(train_module, "score", recording)
    train_in_process(*overrides)
    assert [tuple(shape) for shape in trained] == [(size, size) for size in sizes]
    assert {tuple(shape) for shape in validated} == {(32, 32)}
    held = torch.load(train_in_process.run_dir / "last.pt", map_location="cpu", weights_only=False)
    assert held["inference"]["preprocessing"]["crop_size"] == 32  # what evaluate, predict and export cut
