"""The real command line: a run resumes from its checkpoint, torchrun works, bad input fails in one line."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import CONF, LONGER, finish, start_cli, summary, wait_for

HYDRA_OWN = {".hydra", "train.log"}
STEPS_PER_EPOCH = 6  # 3 classes x 8 images, batch 4


def test_resume_continues_counting_from_the_checkpoint(tmp_path, train_cli):
    run_dir = tmp_path / "run"
    train_cli(run_dir, "train.max_steps=4", "train.epochs=2")
    assert summary(run_dir)["steps"] == 4
    first_weights = (run_dir / "last.pt").read_bytes()

    result = train_cli(run_dir, "resume=auto", "train.epochs=2")
    log = (run_dir / "train.log").read_text()
    assert re.search(r"resumed from .*last\.pt at epoch 0, step 4 \(batch 4 of the epoch\)", log), result.stderr[-2000:]
    # The cut epoch carries on from its fifth batch, then the second epoch: as if never stopped.
    assert summary(run_dir)["steps"] == 2 * STEPS_PER_EPOCH
    assert (run_dir / "last.pt").read_bytes() != first_weights

    train_cli(run_dir, "resume=auto", "train.epochs=2")  # nothing left to do: reports, trains no step
    assert summary(run_dir)["steps"] == 2 * STEPS_PER_EPOCH


def test_unreadable_images_are_counted_in_the_summary(tmp_path, tiny_root, train_cli):
    root = shutil.copytree(tiny_root, tmp_path / "data")
    (root / "train/class_000/empty.JPEG").write_bytes(b"")
    (root / "val/class_001/text.JPEG").write_text("not an image")
    run_dir = tmp_path / "run"
    train_cli(run_dir, "data=imagenet", f"data.root={root}", "train.batch_size=5")  # 25 images: none dropped
    assert summary(run_dir)["skipped_files"] == 2
    log = (run_dir / "train.log").read_text()
    assert "skipping unreadable image" in log and "empty.JPEG" in log and "text.JPEG" in log


@pytest.mark.parametrize(("option", "written", "absent"), [
    ("profiler=torch", "profile/trace.json", "profile.prof"),
    ("profiler=cprofile", "profile.prof", "profile"),
    ("logger=none", "summary.json", "tb"),
])
def test_options_take_effect_through_the_loop(option, written, absent, tmp_path, train_cli):
    run_dir = tmp_path / "run"
    train_cli(run_dir, option)
    assert (run_dir / written).stat().st_size > 0
    assert not (run_dir / absent).exists()


DATA_GROUPS = ("decoder", "format", "staging", "prefetcher")
DATA_OPTIONS = sorted((path.parent.name, path.stem) for group in DATA_GROUPS for path in (CONF / group).glob("*.yaml"))
ON_THE_CPU = {"decoder=nvjpeg": ["decoder.decode_device=cpu"], "decoder=dali": ["decoder.device=cpu"]}
GPU_ONLY = {"prefetcher=cuda_stream": "overlaps copies on a CUDA stream"}
OPTIONAL = {"decoder=turbojpeg": "simplejpeg", "decoder=dali": "nvidia.dali", "format=lmdb": "lmdb"}


@pytest.mark.parametrize(("group", "option"), DATA_OPTIONS, ids=[f"{g}={o}" for g, o in DATA_OPTIONS])
def test_every_data_option_trains_through_the_command_line(group, option, tmp_path, train_cli):
    choice = f"{group}={option}"
    if choice in GPU_ONLY:
        pytest.skip(f"{choice} {GPU_ONLY[choice]}; this run is CPU-only")
    if choice in OPTIONAL:
        pytest.importorskip(OPTIONAL[choice], reason=f"{choice} needs its extra")
    run_dir = tmp_path / "run"
    train_cli(run_dir, choice, *ON_THE_CPU.get(choice, []), "loader.num_workers=1")
    result = summary(run_dir)
    assert result["choices"][group] == option and result["steps"] == STEPS_PER_EPOCH
    assert result["images_per_s"] > 0 and 0 <= result["val_top1"] <= 100


BAD_INPUT = {
    "optim.lr=abc": ["optim.lr=abc"],
    "train.epochs=two": ["train.epochs=two"],
    "data=nosuch": ["data=nosuch"],
    "missing data.root": ["data=imagenet", "data.root=???"],
    "absent data.root": ["data=imagenet", "data.root=/no/such/imagenet"],
    "model.name=nosuchnet": ["model.name=nosuchnet"],
    "resume=missing": ["resume=/no/such/last.pt"],
    "decoder=nvjpeg without a GPU": ["decoder=nvjpeg"],
    "prefetcher=cuda_stream without a GPU": ["prefetcher=cuda_stream"],
    "format.path missing": ["format=hdf5", "format.path=???"],
    "format.path absent": ["format=lmdb", "format.path=/no/such/pack"],
    "loader.num_workers=lots": ["loader.num_workers=lots"],
    "precision=fp16 without a GPU": ["precision=fp16"],
    "cudnn=fast": ["cudnn=fast"],
}


@pytest.mark.parametrize("overrides", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_fails_with_one_clear_line(overrides, tmp_path, train_cli):
    run_dir = tmp_path / "run"
    result = train_cli(run_dir, *overrides, check=False)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    key = overrides[-1].split("=")[0]
    assert key in result.stderr or overrides[-1].split("=")[1] in result.stderr, result.stderr[-2000:]
    written = {path.name for path in run_dir.iterdir()} if run_dir.exists() else set()
    assert written <= HYDRA_OWN


def test_torchrun_two_processes_share_one_run_folder(tmp_path, train_cli):
    run_dir = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    train_cli(run_dir, "train.epochs=2", "staging=tmpfs", f"staging.dir={tmp_path / 'shm'}", launcher=launcher)
    # 24 training images, 2 processes, batch 4 each: 3 steps per epoch per process.
    assert summary(run_dir)["steps"] == 2 * 3
    assert (run_dir / "train-rank1.log").exists() and "(2 processes)" in (run_dir / "train-rank1.log").read_text()
    # The same checkpoint evaluated by one process gives the same top-1: no image counted twice or missed.
    single = tmp_path / "single"
    train_cli(single, f"resume={run_dir / 'last.pt'}", "train.epochs=2")
    assert summary(single)["val_top1"] == summary(run_dir)["val_top1"]
    assert len(list((run_dir / "tb").glob("events.*"))) == 1
    assert [p.name for p in run_dir.glob("*.pt")] == ["last.pt"]
    log = (run_dir / "train.log").read_text()
    assert "(2 processes)" in log and "12 val images" in log
    assert log.count("staging=tmpfs: copying") == 1  # the first local process copied; the other waited
    assert len(list((tmp_path / "shm").iterdir())) == 1


def test_compute_switches_train_on_the_cpu(tmp_path, train_cli):
    run_dir = tmp_path / "run"
    train_cli(run_dir, "precision=bf16", "model.channels_last=true", "cudnn=benchmark")
    result = summary(run_dir)
    assert result["steps"] == STEPS_PER_EPOCH and result["skipped_steps"] == 0 and result["images_per_s"] > 0


def test_deterministic_runs_give_the_same_weights(tmp_path, train_cli):
    import torch

    weights = []
    for name in ("first", "second"):
        train_cli(tmp_path / name, "cudnn=deterministic", "loader.num_workers=2")
        weights.append(torch.load(tmp_path / name / "last.pt", map_location="cpu", weights_only=False)["model"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def test_a_diverging_run_stops_with_the_step_and_a_hint(tmp_path, train_cli):
    result = train_cli(tmp_path / "run", "optim.lr=1e30", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: the training loss became inf or NaN at step ")




def test_sigterm_mid_epoch_saves_the_position_and_resume_finishes_the_run(tmp_path, cache_dir, tiny_root,
                                                                          train_cli):
    run_dir = tmp_path / "run"
    process = start_cli(run_dir, LONGER, cache_dir, tiny_root)
    log_file = run_dir / "train.log"
    wait_for(lambda: any((run_dir / "tb").glob("events.*")) and log_file.exists()
             and "resnet18 on cpu" in log_file.read_text(), process)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    stderr = finish(process, timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    stopped = re.search(r"stopped by SIGTERM at step (\d+) \(epoch (\d+), batch (\d+)\)", log_file.read_text())
    assert stopped, stderr[-3000:]
    step = int(stopped[1])
    assert 0 < step < 90 and not (run_dir / "summary.json").exists()

    train_cli(run_dir, *LONGER, "resume=auto")
    log = (run_dir / "train.log").read_text()
    assert f"at epoch {stopped[2]}, step {step} (batch {stopped[3]} of the epoch)" in log
    assert summary(run_dir)["steps"] == 90  # the step count carried on to the planned end
    import torch

    windows = torch.load(run_dir / "last.pt", weights_only=False)["windows"]
    assert sum(window["steps"] for window, _ in windows) == 90  # the summary's windows span the whole run

