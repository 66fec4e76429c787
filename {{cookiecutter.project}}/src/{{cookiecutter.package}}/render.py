"""A job for a cluster's scheduler, written as YAML to stdout: torchrun on every node, the job's id naming the run.

    python -m {{ cookiecutter.package }}.render kubernetes --nodes 2 --gpus-per-node 8 --image registry/train:1 \\
        --runs-claim runs --data-claim imagenet -- data=folder data.root=/data/imagenet | kubectl apply -f -

Training's overrides follow `--`. docs/distributed.md says what each scheduler does when it stops a job.
"""
import argparse
import sys

import yaml

from .tools.render import PACKAGE, schedulers


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.render", description=__doc__.splitlines()[0])
    choices = parser.add_subparsers(dest="scheduler", required=True)
    modules = schedulers()
    for name, module in modules.items():
        module.add_arguments(choices.add_parser(name, help=module.HELP, description=module.__doc__))
    args = parser.parse_args(ours)
    yaml.safe_dump_all(modules[args.scheduler].render(args, overrides), sys.stdout, sort_keys=False, width=1000)


if __name__ == "__main__":
    main()
