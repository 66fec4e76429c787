"""Jobs rendered for Kubernetes (a Kubeflow Trainer v2 TrainJob) and SkyPilot (a task): each checked with that
project's own models or loader, then run on two nodes (tests/helpers/nodes.py) as its scheduler runs it, under the
variables the scheduler sets, the job's id naming the run."""
import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from {{ cookiecutter.package }} import render
from {{ cookiecutter.package }}.tools.render.kubernetes import JOBSET_UID_LABEL

from helpers.pages import commands
from helpers.paths import PACKAGE, PROJECT
from helpers.processes import CPU_ONLY, finish, wait_for
from helpers.runs import LONGER, logged_windows, summary, tiny

IMAGES = 120  # LONGER's: 15 steps of 4 images an epoch for each of two processes
GPU_JOB = ("--nodes", "2", "--gpus-per-node", "8", "--image", "registry.example.com/train:1", "--runs-claim", "runs",
           "--data-claim", "imagenet", "--", "data=folder", "data.root=/data/imagenet")
# What torch.go of Kubeflow Trainer's torch plugin adds to the trainer's container: torchrun reads each PET_X_Y as
# its --x-y. The node's rank is its Job's completion index, and the first node's pod answers to the name below.
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
TRAINER_PORT = 29400


def rendered(*argv: str) -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        render.main(list(argv))
    return list(yaml.safe_load_all(out.getvalue()))


def first_node(job: dict) -> str:
    name = job["metadata"]["name"]
    return f"{name}-node-0-0.{name}"


def trainer_pod(job: dict, uid: str) -> dict:
    """The pod of the first node as the torch-distributed runtime makes it from `job`, whose JobSet has `uid`."""
    trainer = job["spec"]["trainer"]
    (patch,) = job["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    environment = [*trainer["env"], {"name": "PET_NNODES", "value": str(trainer["numNodes"])},
                   {"name": "PET_NPROC_PER_NODE", "value": str(trainer["numProcPerNode"])},
                   {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
                   {"name": "PET_MASTER_ADDR", "value": first_node(job)},
                   {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)}]
    container = {"name": "node", "image": trainer["image"], "command": trainer["command"], "env": environment,
                 "resources": trainer.get("resourcesPerNode", {}), "ports": [{"containerPort": TRAINER_PORT}],
                 "volumeMounts": pod["containers"][0]["volumeMounts"]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job['metadata']['name']}-node-0-0", "labels": {JOBSET_UID_LABEL: uid},
                         "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
            "spec": {"containers": [container], "volumes": pod["volumes"], "restartPolicy": "OnFailure"}}


def node_process(pod: dict, node: int) -> tuple[list[str], dict[str, str]]:
    """The command and the variables of node `node`'s container, as the kubelet runs it: each valueFrom read from the
    pod (the node's index its own), then $(NAME) in the command expanded from them, $$ kept as one $."""
    fields = {f"metadata.labels['{key}']": value for key, value in pod["metadata"]["labels"].items()}
    fields[COMPLETION_INDEX] = str(node)
    (container,) = pod["spec"]["containers"]
    variables = {entry["name"]: entry["value"] if "value" in entry else fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
                 for entry in container["env"]}
    expanded = [re.sub(r"\$\$|\$\((\w+)\)", lambda found: variables[found[1]] if found[1] else "$", word)
                for word in container["command"]]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # the image's torchrun: this interpreter's
    return [*torchrun, *expanded[1:]] if expanded[0] == "torchrun" else expanded, variables


def test_each_render_command_of_the_pages_writes_a_job():
    """docs/distributed.md's lines, as written, up to the pipe or the file they write to."""
    documented = commands((PROJECT / "docs/distributed.md").read_text(), f"{PACKAGE}.render")
    assert {command.split()[3] for _, command in documented} == {"kubernetes", "skypilot"}
    for _, command in documented:
        words = shlex.split(re.split(r" [|>] ", command)[0])
        assert rendered(*words[words.index(f"{PACKAGE}.render") + 1:]), command


def test_a_trainjob_is_one_kubeflows_api_models_read_whole_and_its_pod_one_kubernetes_accepts():
    models = pytest.importorskip("kubeflow_trainer_api.models", reason="pip install -e '.[kubernetes]'")
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[kubernetes]'")
    (job,) = rendered("kubernetes", *GPU_JOB)
    parsed = models.TrainerV1alpha1TrainJob.from_dict(job)
    assert parsed.to_dict() == job, "a field Kubeflow's models do not know was dropped"
    trainer = parsed.spec.trainer
    gpus = trainer.resources_per_node.limits["nvidia.com/gpu"].actual_instance
    assert (trainer.num_nodes, trainer.num_proc_per_node, gpus) == (2, 8, "8")
    kubernetes_validate.validate(trainer_pod(job, "uid"), "1.33", strict=True)
    assert {volume["persistentVolumeClaim"]["claimName"] for volume in trainer_pod(job, "uid")["spec"]["volumes"]} == {
        "runs", "imagenet"}


def test_a_skypilot_task_is_one_skypilots_own_loader_reads(tmp_path):
    sky = pytest.importorskip("sky", reason="pip install -e '.[skypilot]'")
    (task,) = rendered("skypilot", "--nodes", "2", "--accelerators", "H100:8", "--runs", "s3://bucket/runs", "--data",
                       "s3://bucket/imagenet", "--", "data=folder", "data.root=/data/imagenet")
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(task))
    loaded = sky.Task.from_yaml(str(tmp_path / "train.yaml"))  # as `sky jobs launch train.yaml` reads it
    assert loaded.num_nodes == 2 and loaded.run == task["run"]
    assert [resources.accelerators for resources in loaded.resources] == [{"H100": 8}]
    assert {path: storage.source for path, storage in loaded.storage_mounts.items()} == {
        "/runs": "s3://bucket/runs", "/data": "s3://bucket/imagenet"}


@pytest.mark.full
def test_a_trainjob_trains_on_two_nodes_and_its_restarted_jobset_resumes_its_run(nodes, tmp_path, cache_dir,
                                                                                  tiny_root):
    """Both nodes killed mid-run and started again, as JobSet restarts every job of the set when one fails: the same
    JobSet uid, the same run, resumed from its checkpoint with every image once an epoch."""
    (job,) = rendered("kubernetes", "--nodes", "2", "--image", "unused", "--runs-claim", "runs", "--runs-path",
                      str(tmp_path / "runs"), "--", *tiny(("logger=jsonl", *LONGER), cache_dir, tiny_root))
    nodes.also_name(0, first_node(job))
    uid = "5c1f0e9a-8d1b-4f7e-9a3c-2b6d1e0f4a77"
    run_dir = tmp_path / "runs" / f"torchrun-{uid}"
    logs = [tmp_path / f"node{node}.txt" for node in range(2)]

    def start_both() -> list:
        processes = [node_process(trainer_pod(job, uid), node) for node in range(2)]
        return [nodes.start(node, command, tmp_path, logs[node], {**os.environ, **CPU_ONLY, **variables})
                for node, (command, variables) in enumerate(processes)]

    agents = start_both()
    wait_for(lambda: logged_windows(run_dir) and (run_dir / "last.pt").exists(), *agents, timeout=600)
    for agent in agents:
        agent.kill()
        agent.wait()
    agents = start_both()
    for agent, log in zip(agents, logs):
        finish(agent, timeout=600)
        assert agent.returncode == 0, log.read_text()[-4000:]
    assert re.search(r"resumed from .*last\.pt at epoch \d+, step [1-9]", (run_dir / "train.log").read_text())
    result = summary(run_dir)
    assert result.processes == 2 and {times["host"] for times in result.ranks} == {"node0", "node1"}
    assert all(entry["checked"] and entry["trained"] + entry["trained_before_resume"] + entry["left_out"] == IMAGES
               for entry in result.coverage), result.coverage


@pytest.mark.full
def test_a_skypilot_tasks_run_section_trains_on_two_nodes_under_skypilots_variables(nodes, tmp_path, cache_dir,
                                                                                     tiny_root):
    (task,) = rendered("skypilot", "--nodes", "2", "--runs", "s3://unused", "--runs-path", str(tmp_path / "runs"), "--",
                       *tiny(("train.epochs=1",), cache_dir, tiny_root))
    task_id = "sky-managed-2026-12-02-10-00-00-000000_train_1-0"
    node_bin = tmp_path / "bin"  # the node's torchrun: this interpreter's, whichever environment holds torch
    node_bin.mkdir()
    (node_bin / "torchrun").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m torch.distributed.run "$@"\n')
    (node_bin / "torchrun").chmod(0o755)
    path = os.pathsep.join([str(node_bin), os.environ["PATH"]])
    logs = [tmp_path / f"node{node}.txt" for node in range(2)]
    agents = [nodes.start(node, ["bash", "-c", task["run"]], tmp_path, logs[node],
                          {**os.environ, **CPU_ONLY, "PATH": path, "SKYPILOT_NODE_RANK": str(node),
                           "SKYPILOT_NODE_IPS": "\n".join(nodes.addresses), "SKYPILOT_NUM_NODES": "2",
                           "SKYPILOT_NUM_GPUS_PER_NODE": "0", "SKYPILOT_TASK_ID": task_id})
              for node in range(2)]
    for agent, log in zip(agents, logs):
        finish(agent, timeout=600)
        assert agent.returncode == 0, log.read_text()[-4000:]
    result = summary(Path(tmp_path / "runs" / f"torchrun-{task_id}"))
    assert result.processes == 2 and {times["host"] for times in result.ranks} == {"node0", "node1"}
