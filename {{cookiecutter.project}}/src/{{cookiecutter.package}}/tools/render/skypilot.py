"""A SkyPilot task: `num_nodes` machines of the accelerators asked for, the project's folder synced to each and
installed there, the data and the runs buckets mounted, and a `run:` section that hands SkyPilot's variables to
torchrun (the nodes, this node's rank, the first node's address).

The run's identity is SKYPILOT_TASK_ID, which a managed job (`sky jobs launch`) keeps when it recovers from a
preemption on new machines: the run carries on from its checkpoint in the runs bucket; a new job is a new run.
The runs bucket is mounted MOUNT_CACHED: files are written on the node's disk and uploaded in the background, so a
checkpoint saved moments before a machine went away may not have reached it, and the run resumes from the one
before."""
import argparse
import shlex

from . import add_common_arguments, run_folder, train_arguments

HELP = "a SkyPilot task (sky jobs launch train.yaml)"
RENDEZVOUS_PORT = 29500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--accelerators", help="each node's accelerators, as SkyPilot names them (H100:8)")
    parser.add_argument("--runs", required=True, help="the bucket for the run folders (s3://bucket/runs), at --runs-path")
    parser.add_argument("--data", help="the bucket of the data (s3://bucket/imagenet), mounted at --data-path")
    parser.add_argument("--setup", default="pip install -e .", help="what each node runs once (default: %(default)s)")


def processes(args: argparse.Namespace) -> int:
    if args.processes_per_node:
        return args.processes_per_node
    return int(args.accelerators.rpartition(":")[2] or 1) if args.accelerators else 1


def render(args: argparse.Namespace, overrides: list[str]) -> list[dict]:
    torchrun = ["torchrun", '--nnodes="$SKYPILOT_NUM_NODES"', '--node-rank="$SKYPILOT_NODE_RANK"',
                f"--nproc-per-node={processes(args)}", '--master-addr="$first_node"',
                f"--master-port={RENDEZVOUS_PORT}", '--rdzv-id="$SKYPILOT_TASK_ID"']
    run_dir = shlex.quote(run_folder(args.runs_path)) + '"$SKYPILOT_TASK_ID"'
    training = [*train_arguments(run_dir, []), *map(shlex.quote, overrides)]  # the folder's id left to the shell
    run = "\n".join(["set -e", 'first_node=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)',
                     "exec " + " ".join([*torchrun, *training])]) + "\n"
    mounts = {args.runs_path: {"source": args.runs, "mode": "MOUNT_CACHED"}}
    if args.data:
        mounts[args.data_path] = {"source": args.data, "mode": "MOUNT"}
    task = {"name": args.name, "num_nodes": args.nodes, "workdir": ".", "file_mounts": mounts, "setup": args.setup,
            "run": run}
    if args.accelerators:
        task["resources"] = {"accelerators": args.accelerators}
    return [task]
