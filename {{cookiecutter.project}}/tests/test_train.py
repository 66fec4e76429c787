"""Training end to end: a run resumes from its checkpoint, every data option trains, the report tells a starved
pipeline from the compute ceiling; and through the real command line, where it is the subject: bad input fails in
one line, SIGTERM stops a run that then resumes, torchrun shares one run folder, two fresh interpreters agree."""
import logging
import re
import shutil
import signal
import sys
import time

import pytest

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.failures import explain
from {{ cookiecutter.package }}.loop.precision import NonFiniteLoss

from helpers.machines import CUDA, TWO_PROCESSES, on_this_machine
from helpers.paths import CONF
from helpers.processes import CPU_ONLY, finish, start_cli, wait_for
from helpers.runs import BAD_INPUT, LONGER, SMALL_MODEL, summary

HYDRA_OWN = {".hydra", "train.log"}
STEPS_PER_EPOCH = 6  # 3 classes x 8 images, batch 4


@pytest.mark.full
def test_resume_continues_counting_from_the_checkpoint(train_in_process, caplog):
    caplog.set_level(logging.INFO)
    run_dir = train_in_process.run_dir
    assert train_in_process("train.max_steps=4", "train.epochs=2").steps == 4
    first_weights = (run_dir / "last.pt").read_bytes()

    resumed = train_in_process("resume=auto", "train.epochs=2")
    assert re.search(r"resumed from .*last\.pt at epoch 0, step 4 \(16 images of the epoch trained\)", caplog.text)
    # The cut epoch carries on from its fifth batch, then the second epoch: as if never stopped.
    assert resumed.steps == summary(run_dir).steps == 2 * STEPS_PER_EPOCH
    assert (run_dir / "last.pt").read_bytes() != first_weights

    # Nothing left to do: it reports, and trains no step.
    assert train_in_process("resume=auto", "train.epochs=2").steps == 2 * STEPS_PER_EPOCH


@pytest.mark.full
def test_unreadable_images_are_counted_in_the_summary(tmp_path, tiny_root, train_in_process, caplog):
    root = shutil.copytree(tiny_root, tmp_path / "data")
    (root / "train/class_000/empty.JPEG").write_bytes(b"")
    (root / "val/class_001/text.JPEG").write_text("not an image")
    result = train_in_process("data=folder", f"data.root={root}", "train.batch_size=5")  # 25 images: none dropped
    assert result.skipped_files == 2
    assert "skipping unreadable image" in caplog.text and "empty.JPEG" in caplog.text and "text.JPEG" in caplog.text


@pytest.mark.full
def test_a_few_unreadable_files_get_the_same_decision_in_every_epoch_and_after_a_resume(tmp_path, tree_with_bad_files,
                                                                                       train_in_process):
    """3 unreadable of 11: each epoch reads them all again (batches of 11), and the run trains on past the fourth."""
    data = ("data=folder", f"data.root={tree_with_bad_files}", "train.batch_size=11")
    straight = train_in_process(*data, "train.epochs=5", run_dir=tmp_path / "straight")
    assert straight.steps == 5 and straight.skipped_files == 3
    cut = tmp_path / "cut"
    train_in_process(*data, "train.epochs=2", run_dir=cut)
    resumed = train_in_process(*data, "train.epochs=5", "resume=auto", run_dir=cut)
    assert resumed.steps == 5 and resumed.skipped_files == 3
    import torch

    held = torch.load(cut / "last.pt", map_location="cpu")["unreadable"]
    assert len(held["train"]) == 3 and held["val"] == []


@pytest.mark.parametrize(("option", "written", "absent"), [
    ("profiler=torch", "profile/trace.json", "profile.prof"),
    ("profiler=cprofile", "profile.prof", "profile"),
    ("logger=none", "summary.json", "tb"),
])
@pytest.mark.full
def test_options_take_effect_through_the_loop(option, written, absent, train_in_process):
    train_in_process(option)
    run_dir = train_in_process.run_dir
    assert (run_dir / written).stat().st_size > 0
    assert not (run_dir / absent).exists()


DATA_GROUPS = ("decoder", "format", "staging", "prefetcher")
DATA_OPTIONS = sorted((path.parent.name, path.stem) for group in DATA_GROUPS for path in (CONF / group).glob("*.yaml"))


@pytest.mark.full
@pytest.mark.parametrize(("group", "option"), DATA_OPTIONS, ids=[f"{g}={o}" for g, o in DATA_OPTIONS])
def test_every_data_option_trains_with_a_loader_worker(group, option, train_in_process):
    choice, facts = f"{group}={option}", options.facts(group, option)
    if facts.gpu and not facts.without_gpu and not CUDA:
        pytest.skip(f"{choice} {facts.gpu} and this machine has no GPU")
    if facts.missing():
        pytest.skip(f"{choice}: {facts.missing()}")
    result = train_in_process(choice, *on_this_machine(choice), "loader.num_workers=1")
    assert result.choices[group] == option and result.steps == STEPS_PER_EPOCH
    assert result.images_per_s > 0 and 0 <= result.val_top1 <= 100


# Every bad input is refused in-process (test_train_in_process.py); through the command line, one of each way a
# refusal reaches the user: a value the checks refuse (the fast tier), a path they refuse, a config Hydra cannot
# compose, and a refusal once the data is built, in make_run.
CLI_BAD_INPUT = {"optim.lr=abc": (), "absent data.root": (pytest.mark.full,), "data=nosuch": (pytest.mark.full,),
                 "train.batch_size above the training set": (pytest.mark.full,)}


@pytest.mark.parametrize("overrides", [pytest.param(BAD_INPUT[name], id=name, marks=marks)
                                       for name, marks in CLI_BAD_INPUT.items()])
def test_bad_input_fails_with_one_clear_line(overrides, tmp_path, train_cli):
    run_dir = tmp_path / "run"
    result = train_cli(run_dir, *overrides, check=False, env=CPU_ONLY)  # some are refusals of a GPU-less machine
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    key = overrides[-1].split("=")[0]
    assert key in result.stderr or overrides[-1].split("=")[1] in result.stderr, result.stderr[-2000:]
    written = {path.name for path in run_dir.iterdir()} if run_dir.exists() else set()
    assert written <= HYDRA_OWN


STARVED_OR_NOT = ("model.name=resnet18", "precision=fp32", "data.crop_size=64", "data.val_resize=73", "data.train_per_class=64",
                  "train.batch_size=32", "train.epochs=4", "train.max_steps=24", "train.log_every=6",
                  "train.limit_val_batches=1")


@pytest.mark.full
@pytest.mark.parametrize(("overrides", "bound"), [(("loader.num_workers=0", "decoder=pil", "faults.read_delay_ms=10"),
                                                   "data"),
                                                  (("prefetcher=resident",), "compute")], ids=["starved", "resident"])
def test_the_report_tells_a_starved_pipeline_from_the_compute_ceiling(overrides, bound, train_in_process):
    """ResNet-18 at 64 pixels in fp32: reading and decoding in the training process waits for data; the resident batch
    never. The decode of these small crops alone is 9% of a step on one 2-core CPU and 20% on another, either side
    of the verdict's threshold: a read of 10 ms an image, as from a slow disk, starves the step on any CPU."""
    result = train_in_process(*STARVED_OR_NOT, *overrides)
    assert result.bound == bound, result.verdict
    assert result.verdict.startswith("Data loading is not") == (bound == "compute")
    assert (result.data_frac < 0.02) == (bound == "compute")


def consistent(result, batch_size: int) -> bool:
    """Throughput and the three per-step times come from the same windows: images/s = batch / step time."""
    step_ms = result.data_ms + result.host_ms + result.compute_ms
    return result.images_per_s == pytest.approx(1000 * batch_size / step_ms, rel=1e-6)


@pytest.mark.full
def test_torchrun_two_processes_share_one_run_folder(tmp_path, train_cli):
    run_dir = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    train_cli(run_dir, "train.epochs=2", "staging=tmpfs", f"staging.dir={tmp_path / 'shm'}", launcher=launcher,
              env=TWO_PROCESSES)
    # 24 training images, 2 processes, batch 4 each: 3 steps per epoch per process.
    assert summary(run_dir).steps == 2 * 3
    assert summary(run_dir).processes == 2 and summary(run_dir).timing_rank in (0, 1)
    assert consistent(summary(run_dir), batch_size=4)  # every timing figure from one process
    assert (run_dir / "train-rank1.log").exists() and "(2 processes)" in (run_dir / "train-rank1.log").read_text()
    # The same checkpoint evaluated by one process gives the same top-1: no image counted twice or missed.
    single = tmp_path / "single"
    train_cli(single, f"resume={run_dir / 'last.pt'}", "train.epochs=2")
    assert summary(single).val_top1 == summary(run_dir).val_top1
    assert len(list((run_dir / "tb").glob("events.*"))) == 1
    assert sorted(p.name for p in run_dir.glob("*.pt")) == ["best.pt", "last.pt"]
    log = (run_dir / "train.log").read_text()
    assert "(2 processes)" in log and "12 val images" in log
    assert log.count("staging=tmpfs: copying") == 1  # the first local process copied; the other waited
    assert len(list((tmp_path / "shm").iterdir())) == 1


@pytest.mark.full
def test_compute_switches_train_on_the_cpu(train_in_process):
    result = train_in_process("precision=bf16", "model.channels_last=true", "cudnn=benchmark")
    assert result.steps == STEPS_PER_EPOCH and result.skipped_steps == 0 and result.images_per_s > 0


@pytest.mark.full
@pytest.mark.gpu
def test_bf16_channels_last_and_compile_train_on_the_gpu(tmp_path, train_cli):
    run_dir = tmp_path / "run"
    train_cli(run_dir, "precision=bf16", "model.channels_last=true", "model.compile=true", "cudnn=benchmark")
    result = summary(run_dir)
    assert result.env["device"].startswith("cuda") and result.steps == STEPS_PER_EPOCH
    assert result.skipped_steps == 0 and result.images_per_s > 0
    assert "model.compile=true (mode default): compiled in" in (run_dir / "train.log").read_text()


@pytest.mark.full
@pytest.mark.gpu
def test_a_slow_host_on_the_gpu_reads_as_host_overhead(tmp_path, train_cli):
    """faults.host_delay_ms sleeps before each forward pass: the report must charge it to the host, not to data."""
    results = {}
    for delay in (0, 50):
        train_cli(tmp_path / f"delay{delay}", f"faults.host_delay_ms={delay}", "loader.num_workers=2")
        results[delay] = summary(tmp_path / f"delay{delay}")
    slow = results[50]
    assert slow.bound == "host" and slow.verdict.startswith("The host is the bottleneck"), slow.verdict
    assert slow.host_ms - results[0].host_ms == pytest.approx(50, rel=0.3)
    assert slow.data_frac < 0.1


@pytest.mark.full
def test_deterministic_runs_give_the_same_weights(tmp_path, train_cli):
    import torch

    weights = []
    for name in ("first", "second"):
        train_cli(tmp_path / name, "cudnn=deterministic", "loader.num_workers=2")
        weights.append(torch.load(tmp_path / name / "last.pt", map_location="cpu", weights_only=False)["model"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


@pytest.mark.full
def test_a_diverging_run_stops_with_the_step_and_a_hint(train_in_process):
    with pytest.raises(NonFiniteLoss) as raised:
        train_in_process("optim.lr=1e30")
    assert explain(raised.value).startswith("the training loss became inf or NaN at step ")




@pytest.mark.full
def test_sigterm_mid_epoch_saves_the_position_and_resume_finishes_the_run(tmp_path, cache_dir, tiny_root,
                                                                          train_cli):
    run_dir = tmp_path / "run"
    process = start_cli(run_dir, LONGER, cache_dir, tiny_root)
    log_file = run_dir / "train.log"
    wait_for(lambda: any((run_dir / "tb").glob("events.*")) and log_file.exists()
             and f"{SMALL_MODEL} on cpu" in log_file.read_text(), process)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    stderr = finish(process, timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    stopped = re.search(r"stopped by SIGTERM at step (\d+) \(epoch (\d+), (\d+) images into it\)", log_file.read_text())
    assert stopped, stderr[-3000:]
    step = int(stopped[1])
    assert 0 < step < 90 and not (run_dir / "summary.json").exists()

    train_cli(run_dir, *LONGER, "resume=auto")
    log = (run_dir / "train.log").read_text()
    assert f"at epoch {stopped[2]}, step {step} ({stopped[3]} images of the epoch trained)" in log
    assert summary(run_dir).steps == 90  # the step count carried on to the planned end
    import torch

    windows = torch.load(run_dir / "last.pt", weights_only=False)["windows"]["windows"]
    assert sum(window["steps"] for window, _ in windows) == 90  # the summary's windows span the whole run

