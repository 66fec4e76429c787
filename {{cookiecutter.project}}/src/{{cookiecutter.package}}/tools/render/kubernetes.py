"""A Kubeflow Trainer v2 TrainJob on the `torch-distributed` runtime, which runs torchrun on each node with the
PET_* variables set (nodes, processes per node, node rank, the first node's address).

The run's identity is the uid of the JobSet that the TrainJob owns, which JobSet puts on every pod as a label: a
JobSet that restarts its jobs keeps it, so the run carries on from its checkpoint; a new TrainJob, even of the
same name, is a new run. The data volume is mounted read-only; the runs volume must be one every node writes
(ReadWriteMany)."""
import argparse

from ...options import PACKAGE
from . import add_common_arguments, run_folder, train_arguments

HELP = "a Kubeflow Trainer v2 TrainJob (kubectl apply -f -)"
RUN_ID = "JOB_UID"  # the variable that holds the JobSet's uid in the trainer's container
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
GPU = "nvidia.com/gpu"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--image", required=True, help="the container image, with this project installed")
    parser.add_argument("--gpus-per-node", type=int, default=0, help=f"{GPU} on each node (default: 0)")
    parser.add_argument("--runs-claim", required=True,
                        help="the PersistentVolumeClaim (ReadWriteMany) for the run folders, at --runs-path")
    parser.add_argument("--data-claim", help="the PersistentVolumeClaim of the data, mounted read-only at --data-path")
    parser.add_argument("--runtime", default="torch-distributed", help="the ClusterTrainingRuntime (default: %(default)s)")


def render(args: argparse.Namespace, overrides: list[str]) -> list[dict]:
    # Kubernetes expands $(NAME) in a command from the container's variables; $$ keeps a user's $( as it is.
    escaped = [override.replace("$(", "$$(") for override in overrides]
    command = ["torchrun", f"--rdzv-id=$({RUN_ID})",
               *train_arguments(f"{run_folder(args.runs_path)}$({RUN_ID})", escaped)]
    volumes = [{"name": "runs", "persistentVolumeClaim": {"claimName": args.runs_claim}}]
    mounts = [{"name": "runs", "mountPath": args.runs_path}]
    if args.data_claim:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": args.data_claim, "readOnly": True}})
        mounts.append({"name": "data", "mountPath": args.data_path, "readOnly": True})
    trainer = {
        "image": args.image,
        "numNodes": args.nodes,
        "numProcPerNode": args.processes_per_node or args.gpus_per_node or 1,
        "env": [{"name": RUN_ID, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOBSET_UID_LABEL}']"}}}],
        "command": command,
    }
    if args.gpus_per_node:
        trainer["resourcesPerNode"] = {"limits": {GPU: str(args.gpus_per_node)}}
    pod = {"spec": {"volumes": volumes, "containers": [{"name": "node", "volumeMounts": mounts}]}}
    patch = {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod}}}]}
    return [{
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": args.name},
        "spec": {
            "runtimeRef": {"name": args.runtime},
            "trainer": trainer,
            "runtimePatches": [{"manager": f"{PACKAGE}.render", "trainingRuntimeSpec": {"template": {"spec": patch}}}],
        },
    }]
