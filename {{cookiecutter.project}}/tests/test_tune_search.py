"""tune's plan and search driven by scripted trial results: what it tries first, what it never tries on a
machine, how soon it stops a slower trial, and what it says it left out. No training runs here."""
import json
from pathlib import Path

import pytest

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.diagnosis.summary import Summary
from {{ cookiecutter.package }}.diagnosis.verdict import Settings, diagnose
from {{ cookiecutter.package }}.loop.clock import Window
from {{ cookiecutter.package }}.tools.trials import Progress, Trial, first_timed
from {{ cookiecutter.package }}.tools.tune.plan import moves
from {{ cookiecutter.package }}.tools.tune.outputs import write_outputs
from {{ cookiecutter.package }}.tools.tune.search import search
from {{ cookiecutter.package }}.tools.tune.statistics import Config, slower_than

from helpers.machines import AVX2, AVX512_BF16, SM70, SM90
from helpers.runs import a_summary

CHOICES = {"format": "folder", "decoder": "pil", "prefetcher": "none", "staging": "none"}


def scripted_summary(hardware, settings: dict[str, str], rate: float, data_frac: float,
                     cpu_util: float = 50.0) -> Summary:
    """A trial's summary.json as train writes it, its verdict from diagnose itself."""
    choices = {**CHOICES, **{key: value for key, value in settings.items() if "." not in key}}
    total = Window(steps=10, images=int(rate * 10), wall_s=10.0, data_s=10 * data_frac)
    diagnosis = diagnose(total, {"sys/cpu_util": cpu_util}, hardware, Settings(
        num_workers=int(settings.get("loader.num_workers", 0)), prefetch_factor=4, pin_memory=True,
        persistent_workers=True, precision=settings.get("precision", "fp32"), choices=choices))
    return a_summary(images_per_s=rate, data_frac=data_frac, data_cost=diagnosis.data_cost, host_frac=0.0,
                     bound=diagnosis.bound, data_ms=1.0, host_ms=0.0, compute_ms=1.0, choices=choices,
                     env={"device": hardware.device}, hardware=hardware.record(),
                     suggestions=[suggestion.record() for suggestion in diagnosis.suggestions],
                     withheld=[suggestion.record() for suggestion in diagnosis.withheld])


class ScriptedProgress:
    """What a running trial's logger=jsonl file would show: its set-up, then windows at `rate`."""

    def __init__(self, rate: float, setup_s: float = 2.0):
        window = {"throughput/images_per_s": rate, "time/data_frac": 0.1, "time/host_frac": 0.0,
                  "time/data_ms": 1.0, "time/host_ms": 0.0, "time/compute_ms": 1.0}
        self.setup_s, self.windows = setup_s, [window, window, window]


class ScriptedTrials:
    """Trials whose outcome `speed(settings) -> (images/s, data share)` decides, `budget` of them at most."""

    def __init__(self, hardware, speed, budget: int = 30):
        self.hardware, self.speed, self.budget = hardware, speed, budget
        self.done, self.longest, self.judged = [], 10.0, []

    def time_left(self, extra_s: float = 0.0) -> bool:
        return len(self.done) < self.budget

    def seconds_left(self) -> float:
        return 600.0

    def record(self, trial: Trial) -> Trial:
        self.done.append(trial)
        return trial

    def run(self, settings: dict[str, str], judge=None) -> Trial:
        rate, data_frac = self.speed(settings)
        trial = Trial(str(len(self.done)), settings, seconds=10.0, setup_s=2.0)
        progress = ScriptedProgress(rate)
        reason = judge(progress, elapsed=4.0) if judge else None
        if reason:
            self.judged.append(settings)
            trial.note, trial.window = f"stopped: {reason}", first_timed(progress)
        else:
            trial.summary = scripted_summary(self.hardware, settings, rate, data_frac)
        return self.record(trial)


def changes(groups) -> list[dict[str, str]]:
    return [change for group in groups for change in group]


def test_on_a_data_bound_run_workers_and_decoders_come_before_compute_and_emulated_bf16_never(compose_tiny_tune):
    cfg = compose_tiny_tune()
    groups, left_out = moves(scripted_summary(AVX2, {}, 50.0, 0.5), cfg, None)
    order = changes(groups)
    first_compute = next(index for index, change in enumerate(order) if {"precision", "model.channels_last"} & set(change))
    assert next(index for index, change in enumerate(order) if "loader.num_workers" in change) < first_compute
    assert next(index for index, change in enumerate(order) if "decoder" in change) < first_compute
    assert {"precision": "bf16"} not in order
    assert any(change == {"precision": "bf16"} and "emulated" in why for change, why in left_out)


@pytest.mark.parametrize("cpu_util", [50.0, 97.0], ids=["cores to spare", "cores saturated: the verdict names them"])
def test_on_a_gpu_the_options_whose_tests_have_not_passed_there_are_never_tried(compose_tiny_tune, cpu_util):
    untested = {(group, name) for group in options.options_groups() for name in options.options(group)
                if not options.facts(group, name).passed("cuda")}
    if not untested:
        pytest.skip("every option's tests have passed on a GPU: nothing to hold back")
    summary = scripted_summary(SM90, {}, 50.0, 0.5, cpu_util)
    groups, left_out = moves(summary, compose_tiny_tune(), None)
    assert not untested & {item for change in changes(groups) for item in change.items()}
    withheld = {(held["key"], held["value"]) for held in summary.withheld}
    assert withheld & untested <= {item for change, _ in left_out for item in change.items()}
    if cpu_util > 90:  # the verdict names the GPU decoders, and withholds those not passed there
        assert {("decoder", name) for name in options.gpu_options("decoder")} & untested <= withheld


def test_on_native_bf16_a_compute_bound_run_tries_bf16_first_and_leaves_out_the_data_side(compose_tiny_tune):
    cfg = compose_tiny_tune()
    groups, left_out = moves(scripted_summary(AVX512_BF16, {"loader.num_workers": "8"}, 50.0, 0.02), cfg, None)
    assert groups[0] == [{"precision": "bf16"}]
    assert not any("loader.num_workers" in change for change in changes(groups))
    assert any("loader.num_workers" in change and "gains at most x1.02" in why for change, why in left_out)


def test_before_ampere_the_compute_side_tries_fp16_not_bf16(compose_tiny_tune):
    groups, _ = moves(scripted_summary(SM70, {"loader.num_workers": "8"}, 50.0, 0.02), compose_tiny_tune(), None)
    precisions = [change["precision"] for change in changes(groups) if "precision" in change]
    assert precisions and set(precisions) == {"fp16"}


def test_search_keeps_more_workers_stops_slower_candidates_early_and_says_what_it_left_out(compose_tiny_tune):
    cfg = compose_tiny_tune("tune.repeats=2", "tune.min_gain=0.05")

    def speed(settings):  # workers double the rate and end the data wait; any decoder change halves it
        workers = int(settings.get("loader.num_workers", 0))
        rate, data = (100.0, 0.05) if workers >= 2 else (50.0, 0.5)
        return (rate / 2, data) if "decoder" in settings else (rate, data)

    trials = ScriptedTrials(AVX2, speed)
    result = search(cfg, trials, lambda summary: None)
    assert result["best"].settings.get("loader.num_workers") in ("2", "4")
    assert result["best"].rate == pytest.approx(100.0)
    stopped = [trial for trial in result["trials"] if trial.note.startswith("stopped")]
    assert any("decoder" in trial.change for trial in stopped)
    assert all(trial.window["images_per_s"] <= 50 for trial in stopped), "only the clearly slower ones"
    assert all(not trial.summary for trial in stopped) and not any(trial.kept for trial in stopped)
    assert not any(trial.change.get("precision") == "bf16" for trial in result["trials"])
    assert any(change == {"precision": "bf16"} for change, _ in result["left_out"])


def test_each_change_is_offered_once_and_none_that_sets_a_key_to_the_value_it_has(compose_tiny_tune):
    """Compute-bound on native bf16: the verdict and tune's own neighbours both name precision=bf16, and the data
    side, left out, holds loader.persistent_workers=true, which is on already."""
    cfg = compose_tiny_tune("tune.repeats=2")
    assert cfg.loader.persistent_workers is True
    result = search(cfg, ScriptedTrials(AVX512_BF16, lambda settings: (50.0, 0.02), budget=2), lambda summary: None)
    offered = [" ".join(f"{key}={value}" for key, value in change.items()) for change, _ in result["left_out"]]
    assert offered.count("precision=bf16") == 1 and len(offered) == len(set(offered)), offered
    assert "loader.persistent_workers=true" not in offered and "loader.prefetch_factor=4" not in offered, offered


def test_search_says_what_the_budget_did_not_reach(compose_tiny_tune):
    cfg = compose_tiny_tune("tune.repeats=2")
    trials = ScriptedTrials(AVX2, lambda settings: (50.0, 0.5), budget=3)
    result = search(cfg, trials, lambda summary: None)
    assert len(result["trials"]) == 3
    assert any(why == "not reached: the budget ran out first" for _, why in result["left_out"])


def test_a_change_far_ahead_in_its_one_trial_is_named_when_the_budget_ends_before_a_second(compose_tiny_tune,
                                                                                           tmp_path):
    """As on a slow disk, where each trial takes minutes: the first candidate wins big once, and the budget ends."""
    cfg = compose_tiny_tune("tune.repeats=2")
    trials = ScriptedTrials(AVX2, lambda settings: (300.0, 0.02) if settings else (50.0, 0.8), budget=3)
    result = search(cfg, trials, lambda summary: None)
    assert result["best"].settings == {} and len(result["trials"]) == 3
    first = result["trials"][2].change
    assert [(settings, round(gain)) for settings, gain in result["unconfirmed"]] == [(first, 6)]
    before_after, _, _ = write_outputs(result, tmp_path, [])
    overrides = " ".join(f"{key}={value}" for key, value in first.items())
    assert f"{overrides} ran x6.00 that in its one trial" in before_after and "raise tune.budget_min" in before_after


def test_a_change_confirmed_by_the_trial_the_budget_ends_on_is_kept(compose_tiny_tune, tmp_path):
    """tune from a starved start on a loaded machine: two noisy starts, then two trials of more workers far ahead, the second
    the budget's last. It used to say "nothing beat the start" with the change at x3.20 where x1.80 was needed."""
    cfg = compose_tiny_tune("tune.repeats=2")
    starts = iter([(21.0, 0.3), (48.8, 0.6)])
    trials = ScriptedTrials(AVX2, lambda settings: (111.5, 0.02) if settings else next(starts), budget=4)
    result = search(cfg, trials, lambda summary: None)
    first = result["trials"][2].change
    assert len(result["trials"]) == 4 and result["trials"][3].change == first
    assert result["best"].settings == first and all(trial.kept for trial in result["trials"][2:])
    before_after, command, _ = write_outputs(result, tmp_path, [])
    assert before_after.startswith("before: 34.9 images/s") and command is not None


def test_when_nothing_beats_the_start_it_says_so_with_the_closest_gain_and_writes_no_command(compose_tiny_tune,
                                                                                            tmp_path):
    """One change runs 3% faster every time: no noise, so the margin is tune.min_gain, 5%. Nothing to train with."""
    cfg = compose_tiny_tune("tune.repeats=2", "tune.min_gain=0.05")
    faster = {"loader.num_workers": "2"}
    result = search(cfg, ScriptedTrials(AVX2, lambda settings: (51.5 if settings == faster else 50.0, 0.5), budget=8),
                    lambda summary: None)
    closest, _ = result["closest"]
    assert result["best"] is result["start"] and closest.settings == faster and len(closest.measured) == 1
    before_after, command, _ = write_outputs(result, tmp_path, ["decoder=pil"])
    assert before_after == (
        "nothing beat the start: the fastest change, loader.num_workers=2, ran x1.03 the start (its one trial), where "
        "a change had to run x1.05: 2 standard errors of the 0.0% noise between trials of one configuration, and "
        "tune.min_gain at least; keep this configuration: 50.0 images/s, data-bound")
    assert command is None and not (tmp_path / "experiment").exists() and not (tmp_path / "command.txt").exists()
    assert before_after in (tmp_path / "tune.md").read_text() and "Train with it" not in (tmp_path / "tune.md").read_text()


def test_a_change_just_short_of_the_margin_is_told_apart_from_it_with_more_decimals(compose_tiny_tune, tmp_path):
    cfg = compose_tiny_tune("tune.repeats=2", "tune.min_gain=0.05")
    faster = {"loader.num_workers": "2"}
    result = search(cfg, ScriptedTrials(AVX2, lambda settings: (52.49 if settings == faster else 50.0, 0.5), budget=8),
                    lambda summary: None)
    before_after, command, _ = write_outputs(result, tmp_path, [])
    assert "ran x1.0498 the start (its one trial), where a change had to run x1.0500" in before_after
    assert command is None


def written_progress(tmp_path, setup_s: float, *rates: float) -> Progress:
    lines = [{"step": 0, "time/setup_s": setup_s}, *({"step": 5 * (index + 1), "throughput/images_per_s": rate,
                                                      "time/data_frac": 0.1, "time/host_frac": 0.0, "time/data_ms": 1,
                                                      "time/host_ms": 0, "time/compute_ms": 9}
                                                     for index, rate in enumerate(rates))]
    (tmp_path / "scalars.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 2')
    return Progress(tmp_path)


def test_a_trial_is_stopped_once_its_first_timed_window_is_clearly_slower_or_its_training_twice_as_long(
        tmp_path, compose_tiny_tune):
    settings = compose_tiny_tune("tune.steps=20", "tune.log_every=5", "tune.min_gain=0.05").tune
    start = Config({}, [Trial("0", {}, summary=a_summary(images_per_s=100.0), seconds=30.0, setup_s=5.0)])
    judge = slower_than(start, start, sigma=0.01, settings=settings)  # floor: 100 x (1 - max(0.1, 0.035)) = 90
    assert judge(written_progress(tmp_path, 5.0, 300.0, 80.0), elapsed=12.0).startswith(
        "its first timed window ran at 80.0 images/s, below 90.0")
    assert judge(written_progress(tmp_path, 5.0, 300.0, 95.0), elapsed=12.0) is None
    assert judge(written_progress(tmp_path, 5.0, 300.0), elapsed=12.0) is None, "no timed window yet"
    assert judge(written_progress(tmp_path, 5.0), elapsed=5.0 + 2 * 25.0 + 1).startswith(
        "its training took longer than 50 s, twice the start's")
    long_setup = written_progress(tmp_path, 60.0)  # a set-up of its own (compiling, say) is not held against it
    assert judge(long_setup, elapsed=60.0 + 2 * 25.0 - 1) is None
    noisy = slower_than(start, start, sigma=0.1, settings=settings)  # 100 x (1 - 2 x 0.1 x sqrt(3)) = 65.4
    assert noisy(written_progress(tmp_path, 5.0, 300.0, 80.0), elapsed=12.0) is None


class ScriptedOffer:
    """Decoding once, as tune offers it: built on demand, then trialled like any change."""
    change = {"format": "tensor", "decoder": "none", "format.path": "/packs/set-tensor-262"}
    command = "python -m pkg.pack ..."
    ready = False

    def build(self, seconds: float) -> str | None:
        self.ready = True
        return None


def test_a_decode_bound_run_builds_the_pack_when_allowed_and_keeps_it_when_it_wins(compose_tiny_tune):
    cfg = compose_tiny_tune("tune.allow_pack=true")
    offer = ScriptedOffer()

    def speed(settings):  # more workers barely help a saturated CPU; decoding once does
        if settings.get("format") == "tensor":
            return 150.0, 0.02
        return (60.0 if "loader.num_workers" in settings else 50.0), 0.5

    result = search(cfg, ScriptedTrials(AVX2, speed), lambda summary: offer)
    assert offer.ready and result["best"].settings["format"] == "tensor"
    assert result["best"].rate == pytest.approx(150.0)


def test_tune_says_what_it_will_measure_before_its_first_trial(compose_tiny_tune, tmp_path, monkeypatch, caplog):
    """The start's trials take a minute or more: the first line comes at once."""
    import logging

    from {{ cookiecutter.package }}.tools import tune
    from {{ cookiecutter.package }}.tools.trials import Ranks

    def first_trial(*args):
        raise RuntimeError("the first trial")

    monkeypatch.setattr(tune.search, "search", first_trial)
    cfg = compose_tiny_tune("tune.repeats=2", "tune.steps=20", "tune.log_every=5", "tune.budget_min=3")
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="the first trial"):
        tune.tune(cfg, tmp_path, ["decoder=pil", "loader.num_workers=0"], Ranks(timeout_s=60))
    assert caplog.messages == [
        "tune: the start (decoder=pil loader.num_workers=0) 2 times, to measure the noise, then the speed switches its "
        "verdict names; 20 steps a trial, within 3.0 minutes (tune.budget_min); a line per trial as it ends"]


def test_a_trial_keeps_its_summary_and_no_checkpoint(tmp_path, monkeypatch):
    """A trial trains like any run, and writes last.pt and best.pt: tune reads only its summary."""
    from {{ cookiecutter.package }}.tools import trials
    from {{ cookiecutter.package }}.tools.trials import Ranks, Trials

    def trained(job, ranks, judge=None):
        folder = Path(job["folder"])
        folder.mkdir(parents=True)
        a_summary(images_per_s=50.0).write(folder / "summary.json")
        for checkpoint in ("last.pt", "best.pt"):
            (folder / checkpoint).write_bytes(b"weights")
        return 0, ""

    monkeypatch.setattr(trials, "run_rank", trained)
    trial = Trials([], tmp_path, steps=9, log_every=3, budget_s=60, ranks=Ranks(timeout_s=60)).run({})
    assert trial.rate == 50.0 and sorted(path.name for path in (tmp_path / "trials/00").iterdir()) == ["summary.json"]
