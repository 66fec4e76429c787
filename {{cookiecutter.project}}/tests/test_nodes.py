"""Jobs as users run them: two nodes joined by a network (two network namespaces on this machine, each with a host
name of its own), and several processes on one node. The full tier runs two nodes of one process and four processes
on a node, the same paths at a scale two cores carry; the slow tier (make test-slow) two nodes of two and eight
processes, the scale itself. The namespaces need root."""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.nodes import kill_node
from helpers.packs import packed_tree
from helpers.paths import PACKAGE, PROJECT
from helpers.processes import CPU_ONLY, finish, stop_one_rank, torchrun, wait_for
from helpers.runs import SMALL_MODEL, TINY_SYNTHETIC, logged_windows, summary, tiny

pytestmark = pytest.mark.full


def readme_line(nodes: int, processes: int) -> list[str]:
    """docs/distributed.md's command for several nodes, with this interpreter's torchrun and `processes` per node: every
    argument up to `-m <package>.train`, the environment it sets first included."""
    text = (PROJECT / "docs/distributed.md").read_text()
    start = text.index("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=")
    line = text[start:text.index(f"-m {PACKAGE}.train", start)].replace("\\\n", " ")
    words = shlex.split(line)
    words = [f"--nnodes={nodes}" if word.startswith("--nnodes=") else
             f"--nproc-per-node={processes}" if word.startswith("--nproc-per-node=") else word for word in words]
    launcher = words.index("torchrun")
    return ["env", *words[:launcher], sys.executable, "-m", "torch.distributed.run", *words[launcher + 1:],
            "-m", f"{PACKAGE}.train"]


def ranks_on(agent: subprocess.Popen) -> set[str]:
    return {child.environ().get("RANK") for child in psutil.Process(agent.pid).children()}


@pytest.fixture(scope="module")
def blocks_pack(tmp_path_factory):
    """400 training images of 4 classes in an HDF5 pack: 25 steps of 4 images an epoch for each of 4 processes."""
    return packed_tree(tmp_path_factory.mktemp("nodes"), num_classes=4, train_per_class=100)


def measured_workers(cache: Path) -> int:
    """The worker count loader.num_workers=auto measured and kept in a node's cache folder."""
    (count,) = {count for path in cache.rglob("num_workers.json") for count in json.loads(path.read_text()).values()}
    return count


IMAGES, BATCH, LOG_EVERY = 400, 4, 5
SLOW = pytest.mark.slow  # the scale itself: make test-slow


@pytest.mark.parametrize(("per_node", "epochs"), [(1, 4), pytest.param(2, 8, marks=SLOW)],
                         ids=["two nodes of one", "two nodes of two"])
def test_two_nodes_train_in_blocks_and_a_node_that_dies_is_replaced_with_every_image_once(per_node, epochs, nodes,
                                                                                          tmp_path, blocks_pack):
    """The line of docs/distributed.md on two nodes, gloo across the link, order=blocks with loader.num_workers=auto
    measured by each node for itself. Mid-epoch node1 dies; its replacement, whose cache says one worker more than
    node1's did, joins, torchrun restarts the job, it resumes from node0's checkpoint of its last step, and every
    epoch's coverage check holds, the resumed one against what was trained before the failure."""
    processes = 2 * per_node
    steps_per_epoch = IMAGES // (BATCH * processes)
    pack, tree = blocks_pack
    command = [*readme_line(nodes=2, processes=per_node), "debug=tiny", f"model.name={SMALL_MODEL}", "data=folder",
               f"data.root={tree}", "format=hdf5",
               f"format.path={pack}", "order=blocks", "order.block=8", "order.window=2", "loader.num_workers=auto",
               f"train.epochs={epochs}", f"train.log_every={LOG_EVERY}", "logger=jsonl"]
    caches = [tmp_path / f"cache-node{node}" for node in range(2)]
    environments = [{**os.environ, **CPU_ONLY, "XDG_CACHE_HOME": str(cache)} for cache in caches]
    logs = [tmp_path / f"node{node}.txt" for node in range(2)]
    agents = [nodes.start(node, command, tmp_path, logs[node], environments[node]) for node in range(2)]
    run_dir = tmp_path / "outputs/torchrun-exp1"  # docs/distributed.md's --rdzv-id

    # Into the second epoch, right after a window: the failure lands mid-epoch, before the next window.
    wait_for(lambda: any(window["step"] >= steps_per_epoch + LOG_EVERY for window in logged_windows(run_dir)), *agents,
             timeout=600)
    assert ranks_on(agents[0]) == {str(rank) for rank in range(per_node)}, "the rendezvous ranks node0 first"
    last_window = max(window["step"] for window in logged_windows(run_dir))
    kill_node(agents[1])
    measured = [measured_workers(cache) for cache in caches]  # each node's own sweep, which noise may tell apart
    replacement = measured[1] + 1  # the replacement measured another count for itself
    for cache in caches[1].rglob("num_workers.json"):
        cache.write_text(json.dumps({key: replacement for key in json.loads(cache.read_text())}))
    agents[1] = nodes.start(1, command, tmp_path, logs[1], environments[1])

    for agent, log in zip(agents, logs):
        finish(agent, timeout=900)
        assert agent.returncode == 0, log.read_text()[-4000:]
    resumed = re.search(r"resumed from .*last\.pt at epoch (\d+), step (\d+)", (run_dir / "train.log").read_text())
    assert resumed and int(resumed[2]) >= last_window, "lost more than one logging window"
    assert int(resumed[1]) == 1 and int(resumed[2]) % steps_per_epoch, "resumed mid-epoch"
    result = summary(run_dir)
    assert result.steps == steps_per_epoch * epochs and result.processes == processes
    assert {times["host"] for times in result.ranks} == {"node0", "node1"}
    covered = result.coverage
    assert [(entry["epoch"], entry["checked"], entry["trained"] + entry["trained_before_resume"], entry["left_out"])
            for entry in covered] == [(epoch, True, IMAGES, 0) for epoch in range(epochs)]
    assert covered[1]["trained_before_resume"] == int(resumed[2]) % steps_per_epoch * BATCH * processes
    assert covered[0]["workers"] == [measured[0]] * per_node + [measured[1]] * per_node
    assert covered[-1]["workers"] == [measured[0]] * per_node + [replacement] * per_node


def test_nodes_that_do_not_share_the_run_folder_stop_at_start_in_one_line_naming_them(nodes, tmp_path, cache_dir):
    """node1 sees outputs/ as a disk of its own: each node would write its own run folder, keep checkpoints the other
    cannot resume from, and a restart would resume from neither. The job stops before its first step, its line naming
    the folder and node1."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    words = [word.replace("--max-restarts=3", "--max-restarts=0") for word in readme_line(nodes=2, processes=1)]
    command = [*words, "debug=tiny", f"model.name={SMALL_MODEL}", f"data.cache_dir={cache_dir}", *TINY_SYNTHETIC]
    logs = [tmp_path / f"node{node}.txt" for node in range(2)]
    env = {**os.environ, **CPU_ONLY}
    agents = [nodes.start(node, command, tmp_path, logs[node], env, own_folder=outputs if node else None)
              for node in range(2)]
    for agent in agents:
        finish(agent, timeout=300)
    said = logs[0].read_text()
    assert [agent.returncode != 0 for agent in agents] == [True, True], said[-3000:]
    run_dir = outputs / "torchrun-exp1"
    lines = [line for line in said.splitlines() if line.startswith("error: the run folder")]
    assert lines and f"the run folder {run_dir} is not one folder for every node" in lines[0], said[-3000:]
    assert "rank 0 (host node0) does not see what rank 1 (host node1) wrote there" in lines[0]
    assert not (run_dir / "last.pt").exists() and not list(run_dir.glob(".processes/*")), "no step was trained"


ON_A_NODE = [pytest.param(4, id="four processes"), pytest.param(8, id="eight processes", marks=SLOW)]


def start_on_a_node(processes: int, run_dir: Path, cache_dir: Path, tiny_root: Path,
                    *overrides: str) -> subprocess.Popen:
    """`processes` processes of debug=tiny on the synthetic set (3 classes), on this machine, in the background."""
    command = [*torchrun(processes), "-m", f"{PACKAGE}.train", f"hydra.run.dir={run_dir}",
               *tiny(("logger=jsonl", *overrides), cache_dir, tiny_root)]
    return subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **CPU_ONLY})


@pytest.mark.parametrize("processes", ON_A_NODE)
def test_processes_on_a_node_name_their_straggler_and_check_every_epoch(processes, tmp_path, cache_dir, tiny_root):
    """The third rank from last reading 60 ms slower per image: its data share stands out in every window and in the
    verdict, and both epochs train each of the 144 images once (a process's share in whole batches of 4)."""
    run_dir, straggler = tmp_path / "run", processes - 3
    job = start_on_a_node(processes, run_dir, cache_dir, tiny_root, "data.train_per_class=48", "train.epochs=2",
                          f"faults.rank={straggler}", "faults.read_delay_ms=60")
    stderr = finish(job, timeout=900)
    assert job.returncode == 0, stderr[-4000:]
    result = summary(run_dir)
    assert result.processes == processes and [times["rank"] for times in result.ranks] == list(range(processes))
    assert result.verdict.startswith(f"Rank {straggler} on host {os.uname().nodename} holds the others back: it "
                                        "waited for data"), result.verdict
    spreads = [window for window in logged_windows(run_dir) if "ranks/slowest" in window]
    assert spreads and all(window["ranks/slowest"] == straggler for window in spreads)
    trained = 144 // processes // BATCH * BATCH * processes  # 8 processes: 18 images each, 4 batches, 2 left out
    assert [(entry["checked"], entry["trained"], entry["left_out"], entry["processes"]) for entry in result.coverage
            ] == [(True, trained, 144 - trained, processes)] * 2


@pytest.mark.parametrize("processes", ON_A_NODE)
def test_processes_stop_together_and_resume_on_half_as_many_with_every_image_once(processes, tmp_path, cache_dir,
                                                                                    tiny_root):
    """SIGTERM to rank 3 alone: every process stops at that window's end, rank 0 saves the step. Resumed with half as
    many processes, the rest of the epoch is spread over them and the epoch's check holds across the change. 480
    images: 15 steps an epoch for each of eight processes, so that the stop lands part-way through the first."""
    run_dir, sizes = tmp_path / "run", ("data.train_per_class=160", "train.epochs=2")
    stopped = stop_one_rank(start_on_a_node(processes, run_dir, cache_dir, tiny_root, *sizes), run_dir, "3")
    resumed = subprocess.run([*torchrun(processes // 2), "-m", f"{PACKAGE}.train", f"hydra.run.dir={run_dir}",
                              "resume=auto",
                              *tiny(("logger=jsonl", *sizes), cache_dir, tiny_root)],
                             cwd=PROJECT, capture_output=True, text=True, timeout=900, env={**os.environ, **CPU_ONLY})
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    epochs = summary(run_dir).coverage
    assert epochs[0]["trained_before_resume"] == int(stopped[2]) and epochs[0]["processes"] == processes // 2
    assert all(entry["checked"] and entry["trained"] + entry["trained_before_resume"] + entry["left_out"] == 480
               for entry in epochs)


@pytest.mark.parametrize("processes", ON_A_NODE)
def test_processes_one_of_which_stops_answering_leave_their_stacks_and_end(processes, tmp_path, cache_dir, tiny_root):
    """The second rank from last suspended, alive but silent: the others find no step for 6 s, write where every
    thread stood, and end in their collective's timeout with one line each."""
    run_dir, silent = tmp_path / "run", processes - 2
    job = start_on_a_node(processes, run_dir, cache_dir, tiny_root, "data.train_per_class=160", "train.epochs=2",
                          "distributed.timeout_min=0.3", "distributed.stall_min=0.1")
    wait_for(lambda: (run_dir / "last.pt").exists(), job, timeout=600)
    ranks = {process.environ()["RANK"]: process for process in psutil.Process(job.pid).children()}
    ranks[str(silent)].suspend()
    suspended = time.monotonic()
    stderr = finish(job, timeout=300)
    assert time.monotonic() - suspended < 18 + 30 + 60  # the collective's timeout, torchrun's grace, start-up slack
    assert job.returncode == 1
    healthy = [rank for rank in range(processes) if rank != silent]
    assert sorted(path.name for path in run_dir.glob("stacks-rank*.txt")) == sorted(
        f"stacks-rank{rank}.txt" for rank in healthy)
    for rank in healthy:
        text = (run_dir / f"stacks-rank{rank}.txt").read_text()
        assert "no progress for" in text and "--- thread MainThread ---" in text, text[:2000]
    assert re.search(r"^error: a collective across the processes failed", stderr, re.MULTILINE), stderr[-3000:]
