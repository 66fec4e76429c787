"""Jobs for a cluster's scheduler, behind `python -m {{ cookiecutter.package }}.render`: one module per scheduler,
each with `HELP`, `add_arguments(parser)` and `render(args, overrides)`, which returns the YAML documents to submit.

Every job trains with torchrun on each node, into the run folder `<runs path>/torchrun-<job id>`: the scheduler's
id for the job names the run and its rendezvous. A job that the scheduler starts again (after a node fails, or a
preemption) keeps its id and carries on from its checkpoint there; a new job starts a new run."""
import argparse
import importlib
import pkgutil
from types import ModuleType

from ...core.command_line import at_least_one
from ...options import PACKAGE


def schedulers() -> dict[str, ModuleType]:
    """Each scheduler's module, by name."""
    return {name: importlib.import_module(f"{__name__}.{name}") for _, name, _ in pkgutil.iter_modules(__path__)}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="train", help="the job's name (default: train)")
    parser.add_argument("--nodes", type=at_least_one, default=1, help="machines (default: 1)")
    parser.add_argument("--processes-per-node", type=at_least_one, default=None,
                        help="training processes on each node (default: its GPUs, or 1 without)")
    parser.add_argument("--runs-path", default="/runs",
                        help="where every node sees the shared volume that holds the run folders (default: /runs)")
    parser.add_argument("--data-path", default="/data", help="where the data volume is mounted (default: /data)")


def run_folder(runs_path: str) -> str:
    """The run folder's path, less the job's id that ends it."""
    return f"{runs_path.rstrip('/')}/torchrun-"


def train_arguments(run_dir: str, overrides: list[str]) -> list[str]:
    """What follows torchrun's flags: the training module, the run folder, the user's overrides."""
    return ["-m", f"{PACKAGE}.train", f"hydra.run.dir={run_dir}", *overrides]
