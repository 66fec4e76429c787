"""How long each process takes to draw an epoch's order, on one core: what every process pays at every epoch's start.

    python scripts/order_speed.py                                   # ImageNet's 1,281,167 images, 8 x 8 readers
    python scripts/order_speed.py --images 100000 --processes 64 --workers 8

Prints the median of `--repeats` draws of order=blocks and order=random, and the time one process then spends
over the epoch turning its share into the keys its loader workers are sent, batch by batch.
"""
import argparse
import statistics
import time

import torch

from {{ cookiecutter.package }}.contracts import Layout
from {{ cookiecutter.package }}.data.order import BlockOrder, RandomOrder
from {{ cookiecutter.package }}.data.sampling import EpochSampler


class Sized:
    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1_281_167)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8, help="loader workers of each process")
    parser.add_argument("--batch", type=int, default=256, help="images per batch, per process")
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core, as each process draws its own
    layout, generator = Layout(args.processes, args.workers, args.batch), torch.Generator().manual_seed(0)
    blocks = BlockOrder(args.block, args.window)
    drawn = {name: seconds(lambda: order.draw(args.images, generator, layout), args.repeats)
             for name, order in (("blocks", blocks), ("random", RandomOrder()))}
    plan = EpochSampler(Sized(args.images), 0, 0, blocks, layout).plan(0, 0, layout)
    keys = seconds(lambda: [plan.keys(batch) for batch in range(plan.batches)], 1)
    print(f"{args.images} images, {args.processes} processes x {args.workers} workers, batch {args.batch}, one core:")
    print(f"  order=blocks (block {args.block}, window {args.window}) drawn in {drawn['blocks']:.3f} s "
          f"(median of {args.repeats}); order=random in {drawn['random']:.3f} s")
    print(f"  one process's {plan.batches} batches of keys over the epoch: {keys:.3f} s")


if __name__ == "__main__":
    main()
