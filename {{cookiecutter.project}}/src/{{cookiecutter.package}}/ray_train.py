"""Train on a Ray cluster with Ray Train: a TorchTrainer whose workers each run the training command unchanged, in
the process group Ray starts them in.

    python -m {{ cookiecutter.package }}.ray_train --workers 16 --gpus --storage /shared/runs --name exp1 -- \\
        data=folder data.root=/data/imagenet

The run folder is Ray Train's own, <storage>/<name>, which every worker must see (a shared file system). The name
is the run's identity: a job given it again carries the run on from its checkpoint, and a new name starts a new
run. A worker that fails has the group restarted from the checkpoint, --max-failures times at most; a run stopped
from outside (the job cancelled, the cluster gone) resumes from its last saved checkpoint: the end of an epoch.
"""
import argparse
import sys
from pathlib import Path

from .core import failures
from .core.command_line import at_least_one, flags_and_overrides
from .core.packages import optional_import
from .options import PACKAGE


def train_worker(config: dict) -> None:
    """One Ray Train worker: training's own main, its command line `config["command_line"]`."""
    from . import train

    sys.argv = [f"{PACKAGE}.train", *config["command_line"]]
    train.main()


def fit(args: argparse.Namespace, overrides: list[str]) -> None:
    optional_import("ray.train.torch", "ray")  # Ray Train's extra, which ray alone lacks
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage = Path(args.storage).absolute()
    ray.init(address=args.address, log_to_driver=True)
    try:
        command_line = [*overrides, f"hydra.run.dir={storage / args.name}", "resume=auto"]
        TorchTrainer(train_worker, train_loop_config={"command_line": command_line},
                     scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=args.gpus),
                     run_config=RunConfig(storage_path=str(storage), name=args.name,
                                          failure_config=FailureConfig(max_failures=args.max_failures))).fit()
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    ours, overrides = flags_and_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.ray_train", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=at_least_one, required=True, help="training processes, one per GPU")
    parser.add_argument("--gpus", action="store_true", help="give each worker a GPU")
    parser.add_argument("--storage", required=True, help="a folder every worker sees, where the run folder goes")
    parser.add_argument("--name", required=True, help="the run's name: its folder, and what a later job resumes")
    parser.add_argument("--address", help="the Ray cluster (default: RAY_ADDRESS, or a cluster of this machine)")
    parser.add_argument("--max-failures", type=int, default=3, help="restarts after a worker fails (default: 3)")
    args = parser.parse_args(ours)
    failures.one_line(lambda: fit(args, overrides))


if __name__ == "__main__":
    main()
