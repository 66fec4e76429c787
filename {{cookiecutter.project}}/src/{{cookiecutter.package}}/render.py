"""A job for a cluster's scheduler, written as YAML to stdout: torchrun on every node, the job's id naming the run.

    python -m {{ cookiecutter.package }}.render kubernetes --nodes 2 --gpus-per-node 8 --image registry/train:1 \\
        --runs-claim runs --data-claim imagenet -- data=folder data.root=/data/imagenet | kubectl apply -f -
    python -m {{ cookiecutter.package }}.render skypilot --nodes 2 --accelerators H100:8 --runs s3://bucket/runs \\
        --data s3://bucket/imagenet -- data=folder data.root=/data/imagenet > train.yaml
    sky jobs launch train.yaml

Training's overrides follow `--`. docs/distributed.md says what each scheduler does when it stops a job.
"""
import argparse
import sys

import yaml

from .core.command_line import flags_and_overrides
from .options import PACKAGE
from .tools.render import schedulers


class Dumper(yaml.SafeDumper):
    """YAML as a person writes it: a script of several lines (SkyPilot's `run:`) as a block, line by line."""


Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text,
                                                                         style="|" if "\n" in text else None))


def main(argv: list[str] | None = None) -> None:
    ours, overrides = flags_and_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.render", description=__doc__.splitlines()[0])
    choices = parser.add_subparsers(dest="scheduler", required=True)
    modules = schedulers()
    for name, module in modules.items():
        module.add_arguments(choices.add_parser(name, help=module.HELP, description=module.__doc__))
    args = parser.parse_args(ours)
    yaml.dump_all(modules[args.scheduler].render(args, overrides), sys.stdout, Dumper=Dumper, sort_keys=False,
                  width=1000)


if __name__ == "__main__":
    main()
