"""tune: a starved run gets faster, a good one is left alone, a failing candidate is skipped with its reason,
and tuned.yaml composes and trains."""
import csv
import os
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from {{ cookiecutter.package }}.core.hardware import probe
from {{ cookiecutter.package }}.data.crops import TrainCrop
from {{ cookiecutter.package }}.data.format.tensor import TensorImages
from {{ cookiecutter.package }}.diagnosis.verdict import Suggestion, faster_precision
from {{ cookiecutter.package }}.tools.trials import Ranks, Trials
from {{ cookiecutter.package }}.tools.tune.plan import PackOffer, moves

from helpers.machines import AVX2
from helpers.paths import CONF, PACKAGE, PROJECT
from helpers.processes import QUIET
from helpers.runs import a_summary, summary, tiny

SHORT = ("tune.repeats=2", "tune.steps=9", "tune.log_every=3", "train.batch_size=8")
FASTEST = faster_precision(probe(torch.device("cpu")))  # this machine's: bf16 only where it is native
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")


def run_tune(tmp_path, cache_dir, tiny_root, *overrides: str, budget_min: float = 3.0,
             launcher: tuple[str, ...] = (sys.executable,)) -> subprocess.CompletedProcess:
    command = [*launcher, "-m", f"{PACKAGE}.tune", *tiny((*SHORT, *overrides), cache_dir, tiny_root),
               f"tune.budget_min={budget_min}", f"tune.pack_dir={tmp_path / 'packs'}", f"hydra.run.dir={tmp_path / 'tune'}"]
    return subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=int(60 * budget_min) + 240,
                          env={**os.environ, **QUIET, "CUDA_VISIBLE_DEVICES": ""})


def trials(tmp_path) -> list[dict]:
    with open(tmp_path / "tune/tune.csv") as file:
        return list(csv.DictReader(file))


@pytest.mark.full
def test_a_starved_run_gets_faster_and_its_tuned_yaml_trains(tmp_path, cache_dir, tiny_root, packs, train_cli):
    result = run_tune(tmp_path, cache_dir, tiny_root, "faults.read_delay_ms=25", "decoder=pil", "data.train_per_class=40",
                      "tune.allow_pack=true")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = trials(tmp_path)
    assert {"trial", "overrides", "images_per_s", "data_frac", "bound", "vs_start"} <= set(rows[0])
    assert [row["overrides"] for row in rows[:2]] == ["(start)", "(start)"] and rows[0]["bound"] == "data"
    kept = [row for row in rows if row["kept"] == "yes"]
    assert kept and any("loader.num_workers" in row["overrides"] for row in kept)
    assert all(sum(row["overrides"] == other["overrides"] for other in kept) >= 2 for row in kept), "each confirmed"
    path = list(dict.fromkeys(row["overrides"] for row in kept))  # each kept configuration, in the order it became the best
    final = [float(row["vs_start"]) for row in kept if row["overrides"] == path[-1]]
    assert sum(final) / len(final) >= 1.5, rows
    out = result.stdout + result.stderr
    # The keys keep the order they entered the best configuration in, so the row is found by its settings.
    decoded_once = [row for row in rows if {"format=tensor", "decoder=none"} <= set(row["overrides"].split())]
    if decoded_once:  # allowed, and the data wait left after the workers still worth it: built and trialled
        assert float(decoded_once[0]["images_per_s"]) > 0 and len(list((tmp_path / "packs").glob("*/pack.json"))) == 1
    else:  # the workers took the wait away: what decoding once could still gain is said, not trialled
        assert "not tried: format=tensor decoder=none" in out and "less than tune.min_gain" in out
    if FASTEST != "bf16":
        assert not any("precision=bf16" in row["overrides"] for row in rows), "emulated bf16 is never trialled"
    assert "before: " in out and "after: " in out and "experiment=tuned" in out
    assert "batch size" in out  # it says what it never changes
    assert (tmp_path / "tune/tune.png").stat().st_size > 0 and (tmp_path / "tune/tune.md").is_file()

    tuned = dict(override.split("=") for override in path[-1].split())
    run_dir = tmp_path / "tuned"  # the command tune printed: its folder as a config dir, the overlay on top
    done = subprocess.run([sys.executable, "-m", f"{PACKAGE}.train", "--config-dir", str(tmp_path / "tune"),
                           "experiment=tuned", *tiny(("faults.read_delay_ms=25", "train.batch_size=8"), cache_dir,
                                                      tiny_root), f"hydra.run.dir={run_dir}"],
                          cwd=PROJECT, capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(run_dir).steps > 0
    composed = (run_dir / ".hydra/config.yaml").read_text()
    assert f"num_workers: {tuned['loader.num_workers']}" in composed


@pytest.mark.full
def test_a_good_run_is_left_alone_with_the_noise_said(tmp_path, cache_dir, tiny_root, packs):
    result = run_tune(tmp_path, cache_dir, tiny_root, "prefetcher=resident", f"precision={FASTEST}",
                      "model.channels_last=true", budget_min=1.5)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = trials(tmp_path)
    assert all(row["kept"] != "yes" for row in rows)
    assert f"precision={FASTEST}" not in [row["overrides"] for row in rows], "what is set already is not tried"
    out = result.stdout + result.stderr
    assert "nothing beat the start: " in out and "train with it" not in out
    assert not (tmp_path / "tune/experiment/tuned.yaml").exists() and not (tmp_path / "tune/command.txt").exists()


@pytest.mark.full
def test_a_candidate_that_fails_is_recorded_with_its_reason_and_tuning_goes_on(tmp_path, cache_dir, tiny_root, packs,
                                                                               monkeypatch):
    import {{ cookiecutter.package }}.tools.tune.search as tuning
    from {{ cookiecutter.package }}.tools.tune.plan import pack_offer

    given = tiny(("decoder=pil", "train.batch_size=8", "faults.read_delay_ms=25"), cache_dir, tiny_root)  # data-bound
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("tune", [*given, *SHORT, "tune.budget_min=3", f"tune.pack_dir={tmp_path / 'packs'}"])
    refused = Suggestion(key="loader.prefetch_factor", value="0", why="Try", fact="refused", side="data")
    starved = a_summary(bound="data", data_frac=0.5, data_cost=0.5, host_frac=0.0, env={"device": "cpu: x86_64"},
                        hardware=AVX2.record(), suggestions=[refused.record()], withheld=[],
                        choices={"format": "folder", "decoder": "pil", "prefetcher": "none", "staging": "none"})
    advised, _ = moves(starved, cfg, None)
    assert advised[0] == [{"loader.prefetch_factor": "0"}]  # what the advice names is tried first
    monkeypatch.setattr(tuning, "moves", lambda *args: ([advised[0], [{"loader.num_workers": "1"}]], []))
    ranks = Ranks(timeout_s=60)
    result = tuning.search(cfg, Trials(given, tmp_path, 9, 3, 180, ranks),
                           lambda summary: pack_offer(cfg, summary, ranks))
    by_change = {" ".join(f"{key}={value}" for key, value in trial.change.items()): trial for trial in result["trials"]}
    failed, after = by_change["loader.prefetch_factor=0"], by_change["loader.num_workers=1"]
    assert not failed.summary and failed.note == "error: loader.prefetch_factor=0 is out of range: it must be at least 1"
    assert (after.summary and after.summary.steps == 9) or after.window, \
        "tuning went on: the next candidate ran (or was stopped)"
    side = TrainCrop(32).full_detail_side()
    proposed = next(trial for change, trial in by_change.items() if change.startswith("format=tensor"))
    assert not proposed.summary and proposed.note.startswith("proposed, not built (or pass tune.allow_pack=true): ")
    assert f"format=tensor pack.short_side={side} pack.out=" in proposed.note
    assert not (tmp_path / "packs").exists(), "never packed without tune.allow_pack"


def test_the_pack_offer_keeps_every_pixel_the_crops_use(tiny_root, tmp_path):
    """At crop 224 the side is larger than the tiny set's images: they are stored as they are, not enlarged."""
    offer = PackOffer(tiny_root, 224, str(tmp_path), "raise")
    assert offer.side == TrainCrop(224).full_detail_side() and not offer.ready
    assert offer.build(seconds=600) is None and offer.ready
    stored = TensorImages(offer.path / "train.u8", {})
    stored.open()
    from PIL import Image

    originals = sorted((tiny_root / "train").rglob("*.JPEG"))
    sizes = sorted(Image.open(path).size[::-1] for path in originals)
    assert sorted(stored.payload(index).shape[:2] for index in range(len(stored))) == sizes
    assert offer.build(seconds=0.0).startswith("building its pack would take about")


@pytest.mark.full
def test_tuned_overlay_sets_groups_as_overrides_and_keys_as_values_on_top_of_the_recipe(tmp_path):
    from {{ cookiecutter.package }}.tools.tune.outputs import tuned_overlay

    (tmp_path / "experiment").mkdir()
    kept = {"decoder": "opencv", "precision": "bf16", "loader.num_workers": "3", "model.channels_last": "true"}
    (tmp_path / "experiment/tuned.yaml").write_text(tuned_overlay(kept, "cpu_quick", 10.0, 20.0, "cpu"))
    shown = subprocess.run([sys.executable, "-m", f"{PACKAGE}.train", "--config-dir", str(tmp_path), "experiment=tuned",
                            "--cfg", "all"], cwd=PROJECT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, **QUIET})
    assert shown.returncode == 0, shown.stderr[-2000:]
    import yaml

    cfg = yaml.safe_load(shown.stdout)
    assert cfg["hydra"]["runtime"]["choices"]["decoder"] == "opencv" and cfg["precision"] == "bf16"
    assert cfg["loader"]["num_workers"] == 3 and cfg["model"]["channels_last"] is True
    assert cfg["model"]["name"] == "resnet18" and cfg["data"]["crop_size"] == 64  # the recipe it was tuned from


@pytest.mark.full
def test_under_torchrun_every_rank_runs_each_trial_and_rank_0_writes(tmp_path, cache_dir, tiny_root, packs):
    result = run_tune(tmp_path, cache_dir, tiny_root, "prefetcher=resident", f"precision={FASTEST}", "model.channels_last=true",
                      "tune.repeats=1", budget_min=1.0, launcher=TORCHRUN)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = trials(tmp_path)
    assert rows and all(summary(tmp_path / f"tune/trials/{int(row['trial']):02d}").processes == 2 for row in rows)
    assert (tmp_path / "tune/tune-rank1.log").is_file() and (tmp_path / "tune/tune.md").is_file()


@pytest.mark.full
def test_a_trial_clearly_slower_than_the_best_is_stopped_within_seconds_and_leaves_no_process(tmp_path, cache_dir,
                                                                                             tiny_root):
    """A real trial, 300 ms per image: its 40 steps would take a minute; it stops after its first timed window."""
    import time

    import psutil
    from omegaconf import OmegaConf

    from {{ cookiecutter.package }}.tools.trials import Trial
    from {{ cookiecutter.package }}.tools.tune.statistics import Config, slower_than

    given = tiny(("train.batch_size=8", "loader.num_workers=2", "faults.read_delay_ms=300"), cache_dir, tiny_root)
    trials = Trials(given, tmp_path, steps=40, log_every=2, budget_s=300, ranks=Ranks(timeout_s=60))
    best = Config({}, [Trial("0", {}, summary=a_summary(images_per_s=1000.0), seconds=20.0, setup_s=2.0)])
    settings = OmegaConf.create({"steps": 40, "log_every": 2, "min_gain": 0.05})
    began = time.monotonic()
    trial = trials.run({}, slower_than(best, best, sigma=0.0, settings=settings))
    took = time.monotonic() - began
    assert trial.note.startswith("stopped after ") and "its first timed window ran at" in trial.note, trial.note
    assert not trial.summary and 0 < trial.window["images_per_s"] < 900 and took < 40
    alive = [process.pid for process in psutil.process_iter(["cmdline"])
             if any(str(tmp_path) in part for part in process.info["cmdline"] or [])]
    assert alive == [], "the trial's loader workers went with it"
