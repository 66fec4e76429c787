"""Launching: one run folder for all ranks, a log per rank, scripts/launch.sh, and the Slurm launcher's config."""
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import zlib

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.utils import configure_log
from omegaconf import open_dict

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.resolvers import rank_suffix, run_name
from {{ cookiecutter.package }}.core.distributed import World, restart_store
from {{ cookiecutter.package }}.core.failures import explain
from {{ cookiecutter.package }}.core.forensics import Forensics

from helpers.machines import TWO_PROCESSES
from helpers.paths import CONF, PACKAGE, PROJECT
from helpers.processes import CPU_ONLY, QUIET, cli_command, finish, start_cli, training_images_script, wait_for
from helpers.runs import LONGER, logged_windows, summary, tiny


def test_every_rank_resolves_the_same_run_folder(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "3f2a")
    assert run_name() == "torchrun-3f2a"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's value when no id was given
    assert run_name().count("/") == 1
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert run_name().count("-") == 4  # <date>/<time>
    monkeypatch.setenv("RANK", "3")
    assert rank_suffix() == "-rank3"
    monkeypatch.setenv("RANK", "0")
    assert rank_suffix() == ""


def test_a_task_of_the_slurm_launcher_names_its_log_by_its_task_number_until_rank_is_set(monkeypatch):
    """Hydra names the log file before `setup` sets RANK from submitit's environment."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert rank_suffix() == "-rank1"
    monkeypatch.setenv("RANK", "0")
    assert rank_suffix() == ""


def test_sync_bn_on_cpu_processes_is_refused_before_the_model_is_wrapped():
    """SyncBatchNorm gathers its statistics over NCCL: DDP on CPU processes refuses it with a traceback."""
    with pytest.raises(ConfigError, match="distributed.sync_bn=true .* run on the cpu: pass distributed.sync_bn=false"):
        World(0, 0, 2, torch.device("cpu")).wrap(torch.nn.BatchNorm2d(3), sync_bn=True)


@pytest.mark.parametrize(("rank", "all_ranks", "console"), [
    ("0", "false", ["[tests.rank][INFO] - an info line", "[tests.rank][WARNING] - a warning line"]),
    ("1", "false", ["[tests.rank][WARNING][rank 1] - a warning line"]),  # a slow disk only rank 1 has still shows
    ("1", "true", ["[tests.rank][INFO][rank 1] - an info line", "[tests.rank][WARNING][rank 1] - a warning line"])])
def test_the_console_has_rank_0s_lines_and_the_others_warnings_unless_asked_for_all(rank, all_ranks, console, tmp_path,
                                                                                   monkeypatch, capsys):
    """train.yaml's logging config, as Hydra applies it in each process torchrun starts; each rank's file keeps all."""
    monkeypatch.setenv("RANK", rank)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", [f"distributed.log_all_ranks={all_ranks}"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path)  # what hydra.main sets as the run starts
    root = logging.getLogger()
    kept = root.handlers[:], root.level
    try:
        configure_log(cfg.hydra.job_logging)
        logging.getLogger("tests.rank").info("an info line")
        logging.getLogger("tests.rank").warning("a warning line")
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], _ = kept
        root.setLevel(kept[1])
    assert [line.partition("]")[2] for line in capsys.readouterr().out.splitlines()] == console
    log_file = tmp_path / f"train{rank_suffix()}.log"
    assert [line.partition("]")[2] for line in log_file.read_text().splitlines()] == [
        f"[tests.rank][INFO]{'[rank 1]' if rank == '1' else ''} - an info line",
        f"[tests.rank][WARNING]{'[rank 1]' if rank == '1' else ''} - a warning line"]


def test_each_elastic_restart_joins_through_keys_of_its_own(monkeypatch):
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=10)
    assert restart_store(timeout) is None  # not under torchrun: env:// as usual
    agent_store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timeout)  # what torchrun's agent hosts
    for name, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(agent_store.port), "GROUP_WORLD_SIZE": "1",
                        "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    failed_group = restart_store(timeout)
    failed_group.set("rank1/address", "the dead worker's port")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted_group = restart_store(timeout)
    assert not restarted_group.check(["rank1/address"])  # the restarted group cannot read the failed group's keys
    restarted_group.set("rank1/address", "the new worker's port")
    assert failed_group.get("rank1/address") == b"the dead worker's port"

    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")  # several nodes count restarts apart: refused
    with pytest.raises(ConfigError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        restart_store(timeout)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert restart_store(timeout) is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # torchrun made a store for this restart
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert restart_store(timeout) is None


def launch_env(devices: dict[str, str], **settings: str) -> dict[str, str]:
    """The environment for scripts/launch.sh: this interpreter and this project's source, on `devices`."""
    return {**os.environ, **devices, **settings,
            "PYTHONPATH": os.pathsep.join([str(PROJECT / "src"), os.environ.get("PYTHONPATH", "")]),
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


def test_launch_script_on_several_nodes_asks_for_the_runs_own_id(tmp_path):
    """An id by default would name the same folder for every run, and the next job would take up the last one's."""
    env = {key: value for key, value in launch_env(CPU_ONLY, NNODES="2", MASTER="127.0.0.1:29500").items()
           if key != "RDZV_ID"}
    result = subprocess.run(["bash", str(PROJECT / "scripts/launch.sh")], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.strip() == (
        "launch.sh: NNODES=2 needs RDZV_ID, the same on every node and one per run (it names "
        "outputs/torchrun-<RDZV_ID>)")


@pytest.mark.full
def test_launch_script_runs_torchrun_into_one_folder(tmp_path, cache_dir, tiny_root, packs):
    result = subprocess.run(["bash", str(PROJECT / "scripts/launch.sh"), *tiny(("train.epochs=1",), cache_dir,
                                                                                 tiny_root)],
                            cwd=tmp_path, env=launch_env(TWO_PROCESSES, NPROC="2"), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs").iterdir()
    assert run_dir.name.startswith("torchrun-")
    assert {"summary.json", "last.pt", "train.log", "train-rank1.log"} <= {p.name for p in run_dir.iterdir()}
    assert len(list((run_dir / "tb").glob("events.*"))) == 1


STOP_AND_RESUME = """
saved = os.path.join(out, "stopped.pt")
resumed = os.environ["PHASE"] == "resume"  # not the file's presence: rank 0 may save it before rank 1 looks
skip = 0
if resumed:  # as train.py resumes: the loader's state, then the epoch with the images all processes trained on
    state = torch.load(saved, weights_only=False)
    loaders.train.load_state(state["loader"])
    skip = state["images"]
loaders.train.set_epoch(2, skip)
seen = []
for batch, _ in loaders.train.loader:
    seen += [int(crc) for crc in batch]
    if len(seen) == int(os.environ["STOP_AFTER"]):
        break
if not resumed and world.is_main:
    images = len(seen) * world.size
    torch.save({"images": images, "loader": loaders.train.state(2, images)}, saved)
with open(os.path.join(out, "%s-rank%d.json" % ("resumed" if resumed else "stopped", world.rank)), "w") as file:
    json.dump(seen, file)
end_workers()
"""


@pytest.mark.full
@pytest.mark.parametrize("format", ["format=folder", "format=litdata"])  # our sampler; a loader of the format's own
def test_a_resume_with_another_number_of_processes_trains_each_image_left_once(format, tmp_path, cache_dir,
                                                                                 tiny_root, packs):
    """2 processes with 2 workers each stop after 2 batches of 3; 1 process with 1 worker reads the rest."""
    if format == "format=litdata":
        pytest.importorskip("litdata", reason="pip install -e '.[litdata]'")
    script = training_images_script(tmp_path / "reshard.py", STOP_AND_RESUME)
    overrides = tiny(("data=folder", format, "train.batch_size=3"), cache_dir, tiny_root)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")
    for launcher, phase, stop_after, workers in ((torchrun, "stop", 6, 2), ((sys.executable,), "resume", 0, 1)):
        result = subprocess.run([*launcher, str(script), str(CONF), str(tmp_path), *overrides,
                                 f"loader.num_workers={workers}"], cwd=PROJECT, capture_output=True, text=True,
                                timeout=300, env={**os.environ, **QUIET, **TWO_PROCESSES, "PHASE": phase,
                                     "STOP_AFTER": str(stop_after)})
        assert result.returncode == 0, result.stderr[-3000:]
    stopped = [json.loads((tmp_path / f"stopped-rank{rank}.json").read_text()) for rank in (0, 1)]
    resumed = json.loads((tmp_path / "resumed-rank0.json").read_text())
    assert [len(part) for part in (*stopped, resumed)] == [6, 6, 12]
    every_image = sorted(zlib.crc32(path.read_bytes()) for path in (tiny_root / "train").rglob("*.JPEG"))
    assert sorted(stopped[0] + stopped[1] + resumed) == every_image


@pytest.mark.full
def test_a_resume_on_another_number_of_processes_goes_on_along_the_same_learning_rate_curve(tmp_path, train_cli):
    """2 processes stop after 2 steps of 8 images (16 of the epoch's 24); one process trains the rest in steps of 4,
    each at the learning rate the one-process run had at the same image of the run."""
    plan = ("train.epochs=2", "logger=jsonl", "train.log_every=1")
    train_cli(tmp_path / "whole", *plan)
    whole = [window["train/lr"] for window in logged_windows(tmp_path / "whole")]  # a step at every 4th image
    assert len(whole) == 12
    train_cli(tmp_path / "cut", *plan, "train.max_steps=2",
              launcher=(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"),
              env=TWO_PROCESSES)
    train_cli(tmp_path / "cut", *plan, "resume=auto")
    expected = [whole[images // 4] for images in (0, 8, 16, 20, 24, 28, 32, 36, 40, 44)]
    assert [window["train/lr"] for window in logged_windows(tmp_path / "cut")] == pytest.approx(expected, abs=1e-9)


@pytest.mark.full
def test_a_second_torchrun_job_with_the_same_id_and_other_overrides_is_refused_and_the_first_run_kept(
        tmp_path, cache_dir, tiny_root):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=exp1",
                "-m", f"{PACKAGE}.train", *tiny(("train.epochs=1",), cache_dir, tiny_root)]
    env = {**os.environ, **QUIET, **CPU_ONLY}
    first = subprocess.run(torchrun, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "outputs/torchrun-exp1"
    kept = {path: path.read_bytes() for path in (folder / ".hydra/overrides.yaml", folder / "summary.json")}
    second = subprocess.run([*torchrun, "optim.lr=0.01"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=env)
    assert second.returncode != 0  # the worker's one line, then torchrun's own report of a failed worker
    assert any(line.startswith("error: outputs/torchrun-exp1 holds another run of rendezvous id exp1, started with ")
               for line in second.stderr.splitlines()), second.stderr[-3000:]
    assert {path: path.read_bytes() for path in kept} == kept


STEPS_WITH_TWO_PROCESSES = 3 * 15  # LONGER: 120 images over 2 processes, batch 4, 3 epochs
RESUMED = re.compile(r"resumed from .*last\.pt at epoch [1-3]")


@pytest.mark.full
def test_elastic_restart_resumes_from_the_checkpoint(tmp_path, cache_dir, tiny_root):
    import psutil

    run_dir = tmp_path / "run"
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                "--max-restarts=2")
    process = start_cli(run_dir, LONGER, cache_dir, tiny_root, launcher=launcher, env=TWO_PROCESSES)
    wait_for(lambda: (run_dir / "last.pt").exists(), process)
    workers = psutil.Process(process.pid).children()
    assert len(workers) == 2
    workers[1].kill()  # one worker dies mid-run, as on a failed GPU
    stderr = finish(process, timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    assert RESUMED.search((run_dir / "train.log").read_text())
    assert summary(run_dir).steps == STEPS_WITH_TWO_PROCESSES


def two_processes_past_a_checkpoint(run_dir, overrides, max_restarts, cache_dir, tiny_root):
    """A 2-process torchrun job, once its first checkpoint is written: (torchrun, its processes by RANK)."""
    import psutil

    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                f"--max-restarts={max_restarts}")
    process = start_cli(run_dir, (*LONGER, *overrides), cache_dir, tiny_root, launcher=launcher, env=TWO_PROCESSES)
    ranks = {}
    wait_for(lambda: (run_dir / "last.pt").exists() and ranks.update(
        (rank.environ()["RANK"], rank) for rank in psutil.Process(process.pid).children()) or len(ranks) == 2,
             process)
    return process, ranks


@pytest.mark.full
def test_a_loader_worker_killed_in_one_process_lets_torchrun_restart_the_group(tmp_path, cache_dir, tiny_root):
    """The failing process ends with its one line, the other one does not hang in a collective, and
    torchrun's one restart resumes from the checkpoint and finishes."""
    run_dir = tmp_path / "run"
    process, ranks = two_processes_past_a_checkpoint(run_dir, ("loader.num_workers=1",), 1, cache_dir, tiny_root)
    loader_worker = ranks["1"].children()[0]
    loader_worker.kill()
    stderr = finish(process, timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    assert re.search(rf"error: a loader worker \(pid {loader_worker.pid}\) (died|was killed by a signal)", stderr)
    assert "Traceback" not in stderr
    # The healthy process's next collective fails (on the closed connection, as a rule), or, where torchrun's
    # SIGTERM reaches it first, it stops at its window's end: either way in one line, and it does not hang.
    assert re.search(r"error: a collective across the processes failed \(", stderr) or re.search(
        r"stopped by ", (run_dir / "train.log").read_text()), stderr[-3000:]
    assert RESUMED.search((run_dir / "train.log").read_text())
    assert summary(run_dir).steps == STEPS_WITH_TWO_PROCESSES


@pytest.mark.full  # it waits, by design, for the collective's timeout and torchrun's grace
def test_a_process_that_stops_answering_fails_the_collective_and_the_healthy_one_tells_where_it_waited(
        tmp_path, cache_dir, tiny_root):
    run_dir = tmp_path / "run"
    process, ranks = two_processes_past_a_checkpoint(
        run_dir, ("distributed.timeout_min=0.3", "distributed.stall_min=0.1"), 0, cache_dir, tiny_root)
    ranks["1"].suspend()  # alive but silent, as a process stuck in a driver call would be
    suspended = time.monotonic()
    # 18 s (long enough for a checkpoint on a busy machine) for the collective, then torchrun's 30 s grace
    stderr = finish(process, timeout=150)
    assert time.monotonic() - suspended < 18 + 30 + 15  # a few seconds for the processes to end
    assert process.returncode == 1, stderr[-3000:]
    stacks = run_dir / "stacks-rank0.txt"
    # gloo names the timeout, or, when the op that timed out was DDP's own, the link that timeout closed
    assert re.search(r"error: a collective across the processes failed \((Timed out waiting 18000ms|Application "
                     r"timeout caused pair closure).*; resume=auto continues from step \d+; where every thread "
                     rf"stood: {re.escape(str(stacks))}$", stderr, re.MULTILINE), stderr[-3000:]
    stall, failure = stacks.read_text().split("\n==== ")[:2]
    # After 6 s without a step (distributed.stall_min) the watchdog found the main thread inside a collective ...
    assert "no progress for" in stall and WAITING_CALL.search(stall.split("--- thread MainThread ---")[1])
    # ... and the failure's own section has the call that timed out.
    assert "a collective across the processes failed" in failure and WAITING_CALL.search(failure)


# A frame of torch's collectives: our window's all-reduce, DDP's buffer broadcast, or its all-reduce in backward.
WAITING_CALL = re.compile(r'File "[^"]*torch/(distributed|nn/parallel|autograd)/[^"]*", line \d+, in \w+\n')


@pytest.mark.parametrize("reported", ["[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting "
                                      "18000ms for recv operation to complete", "Application timeout caused pair closure"])
def test_both_of_gloos_wordings_of_a_timeout_are_a_collective_failure(reported):
    err = RuntimeError(reported)
    err.resume_step = 12
    line = explain(err)
    assert line.startswith(f"a collective across the processes failed ({reported.split('] ')[-1]}): another process")
    assert line.endswith("; resume=auto continues from step 12")
    assert explain(RuntimeError("Application error of our own")) is None  # a bug keeps its traceback


def in_a_collective(timeout: str) -> None:
    raise RuntimeError(f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] {timeout}")


def test_a_failed_collective_leaves_the_failing_call_and_every_thread_and_its_line_names_the_file(tmp_path):
    forensics = Forensics(tmp_path, stall_min=10.0, stall_exit=False)
    with pytest.raises(RuntimeError) as raised:
        in_a_collective("Timed out waiting 18000ms for recv operation to complete")
    forensics.record(raised.value)
    stacks = tmp_path / "stacks-rank0.txt"
    assert explain(raised.value).endswith(f"; where every thread stood: {stacks}")
    text = stacks.read_text()
    assert text.startswith("==== rank 0, pid ") and ": a collective across the processes failed ====" in text
    assert text.index("--- the failing call ---") < text.index("in in_a_collective") < text.index("--- thread ")
    forensics.record(raised.value)  # a second failure adds its own section to the same file
    assert stacks.read_text().count("==== rank 0") == 2
    bug = ValueError("ours")
    forensics.record(bug)  # a bug is not a collective's failure: no stacks, its traceback says enough
    assert not hasattr(bug, "stacks_file") and stacks.read_text().count("==== rank 0") == 2


class StopAskedLongAgo:
    """torchrun's SIGTERM, 20 s ago, and the logging window's end, where the run would stop, still to come."""

    def __init__(self):
        self.signal, self.since = "SIGTERM", time.monotonic() - 20


def test_a_stop_request_not_honoured_in_time_leaves_the_stacks_and_the_run_goes_on(tmp_path, caplog):
    forensics = Forensics(tmp_path, stall_min=10.0, stall_exit=False)
    with forensics.watching(StopAskedLongAgo()):
        wait_for(lambda: (tmp_path / "stacks-rank0.txt").exists(), timeout=5)
    text = (tmp_path / "stacks-rank0.txt").read_text()
    assert re.search(r": asked to stop \(SIGTERM\) 2\d s ago and still short of its logging window's end", text)
    assert text.count("==== rank 0") == 1  # once, not at every check
    assert "wait_for" in text.split("--- thread MainThread ---")[1]  # where the main thread stood
    assert any("every thread's stack is in" in record.getMessage() for record in caplog.records)


@pytest.mark.full
def test_launch_script_on_two_nodes_resumes_after_a_worker_dies(tmp_path, cache_dir, tiny_root):
    import psutil

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Both agents run on this machine, so both workers have local rank 0: on GPUs they would share one.
    env = launch_env(CPU_ONLY, NNODES="2", NPROC="1", MASTER=f"127.0.0.1:{port}", RDZV_ID="two-nodes", MAX_RESTARTS="2")
    command = ["bash", str(PROJECT / "scripts/launch.sh"), *tiny(LONGER, cache_dir, tiny_root)]
    logs = [tmp_path / f"node{index}.txt" for index in range(2)]
    nodes = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
             for log in logs]  # two agents on this machine stand for two nodes
    run_dir = tmp_path / "outputs/torchrun-two-nodes"
    wait_for(lambda: (run_dir / "last.pt").exists(), *nodes)
    (worker,) = psutil.Process(nodes[1].pid).children()  # launch.sh execs torchrun, whose one worker this is
    worker.kill()
    for node, log in zip(nodes, logs):
        finish(node, timeout=400)
        assert node.returncode == 0, log.read_text()[-3000:]
    assert RESUMED.search((run_dir / "train.log").read_text())
    assert summary(run_dir).steps == STEPS_WITH_TWO_PROCESSES


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", ["hydra/launcher=slurm", "hydra.launcher.nodes=2"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.nodes == 2 and launcher.tasks_per_node == launcher.gpus_per_node == 8


@pytest.mark.full
def test_submitit_launcher_trains(tmp_path, cache_dir, tiny_root, packs):
    """submitit's local executor pickles the task function and runs it in a job of its own, as Slurm's does."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    sweep = tmp_path / "sweep"
    python, dash_m, module, *overrides = cli_command(tmp_path / "unused", ("train.max_steps=3",), cache_dir, tiny_root)
    result = subprocess.run([python, dash_m, module, "--multirun", "hydra/launcher=submitit_local",
                             f"hydra.sweep.dir={sweep}", *overrides], cwd=PROJECT, capture_output=True,
                            text=True, timeout=600, env={**os.environ, **CPU_ONLY})
    assert result.returncode == 0, result.stderr[-4000:]
    assert summary(sweep / "0").steps == 3
    job_logs = list((sweep / ".submitit").glob("*/*_0_log.out"))
    assert job_logs and "==== where the time went ====" in job_logs[0].read_text(), "the report came from the job"


@pytest.mark.full
@pytest.mark.gpu
def test_nccl_group_of_one_process_all_reduces_and_wraps_a_model(tmp_path):
    script = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
value = torch.full((3,), 2.0, device=device)
dist.all_reduce(value)
model = DistributedDataParallel(torch.nn.Linear(4, 2).to(device), device_ids=[device])
model(torch.randn(8, 4, device=device)).sum().backward()
print("backend", dist.get_backend(), "sum", value.tolist(), "grad", model.module.weight.grad.abs().sum().item() > 0)
dist.destroy_process_group()
"""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "PORT": str(port)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "backend nccl sum [2.0, 2.0, 2.0] grad True" in result.stdout


TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")


@pytest.mark.full
@pytest.mark.serial  # the ranks' data shares are compared: another test's load would skew the one it lands on
@pytest.mark.parametrize("fault", [(), ("faults.rank=1", "faults.read_delay_ms=40")],
                         ids=["no fault", "rank 1 reads slowly"])
def test_the_report_names_the_one_rank_that_holds_the_others_back(fault, tmp_path, train_cli):
    """2 processes of 6 steps, 3 logging windows each; with the fault, each of rank 1's images takes 40 ms more."""
    run_dir = tmp_path / "run"
    train_cli(run_dir, "data.train_per_class=16", "logger=jsonl", *fault, launcher=TORCHRUN, env=TWO_PROCESSES)
    result = summary(run_dir)
    assert [(times["rank"], times["host"]) for times in result.ranks] == [(0, socket.gethostname())] * 1 + [
        (1, socket.gethostname())]
    slow, fast = result.ranks[1]["data_frac"], result.ranks[0]["data_frac"]
    if fault:
        assert result.verdict.startswith(f"Rank 1 on host {socket.gethostname()} holds the others back: it waited "
                                            f"for data {100 * slow:.0f}% of the time; the other {100 * fast:.0f}%.")
        assert [suggestion["key"] for suggestion in result.suggestions] == ["data.root"]
    else:
        assert not result.verdict.startswith("Rank"), result.verdict
    windows = [json.loads(line) for line in (run_dir / "scalars.jsonl").read_text().splitlines()]
    spreads = [window for window in windows if "ranks/slowest" in window]
    assert len(spreads) == 3 and all(window["ranks/data_frac_max"] >= window["ranks/data_frac_min"]
                                     for window in spreads)
    if fault:
        assert [window["ranks/slowest"] for window in spreads] == [1.0] * 3


@pytest.mark.full
@pytest.mark.gpu
def test_the_nccl_flight_recorder_keeps_the_collectives_and_names_the_run_folder(tmp_path):
    """What a timeout would dump: the recorder that distributed.setup turns on holds each collective."""
    script = """
import os, pickle, sys, torch, torch.distributed as dist
from pathlib import Path
from {{ cookiecutter.package }}.core.distributed import record_flight
record_flight(Path(sys.argv[1]))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
dist.all_reduce(torch.ones(3, device=device))
torch.cuda.synchronize()
trace = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())
print("dump", os.environ["TORCH_FR_DUMP_TEMP_FILE"], sorted({entry["profiling_name"] for entry in trace["entries"]}))
dist.destroy_process_group()
"""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            timeout=180, env={**environment, "PORT": str(port)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"dump {tmp_path / 'nccl_trace_rank_'} " in result.stdout and "nccl:all_reduce" in result.stdout


@pytest.mark.full
def test_a_process_whose_nvml_fails_midway_still_gathers_the_report_with_the_others(tmp_path, train_cli):
    """faults.nvml_fails_after=1 on rank 1: NVML answers for one window there, then fails (on the CPU a stand-in reads
    0% until then), while rank 0 never had the figure. Their report's gather must match, not wait out a timeout."""
    run_dir = tmp_path / "run"
    train_cli(run_dir, "data.train_per_class=16", "faults.rank=1", "faults.nvml_fails_after=1",
              "distributed.timeout_min=1", launcher=TORCHRUN, env=TWO_PROCESSES)
    assert ("sys/gpu_util is not recorded: NVML cannot give this GPU's utilisation (RuntimeError: Failed to initialize "
            "NVML: Unknown Error (faults.nvml_fails_after))") in (run_dir / "train-rank1.log").read_text()
    result = summary(run_dir)
    assert "sys/gpu_util" not in result.system and result.processes == 2 and result.coverage[0]["checked"]
