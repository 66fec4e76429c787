"""Finished runs side by side: one Markdown row per run, its throughput as a ratio to the first run's.

    python -m {{ cookiecutter.package }}.train --multirun model.name=resnet50 prefetcher=resident \
        precision=fp32,bf16 model.channels_last=false,true model.compile=false,true
    python -m {{ cookiecutter.package }}.compare multirun/2026-11-21/10-00-00

Columns are the overrides that differ between the runs; those they share are listed above the table.
With `prefetcher=resident` as the first run (`prefetcher=resident,cuda_stream`), the ratio of each other
run is the share of the compute ceiling that its data pipeline reaches.
"""
import argparse
from pathlib import Path

from .core import failures
from .tools.compare import load_runs, table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="run or multirun folders holding summary.json files")
    folders = parser.parse_args(argv).folders
    print(failures.one_line(lambda: table(load_runs(folders))))


if __name__ == "__main__":
    main()
