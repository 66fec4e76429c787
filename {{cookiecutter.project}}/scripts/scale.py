"""A tree of as many files as ImageNet's training set, and what this project and torchvision's ImageFolder each pay
to start on it and to read it: the scan, a second start, the time to the first batch, and how a loader worker's
private memory grows per image it reads. The files are tiny JPEGs, so the cost is inodes and directory entries.

    python scripts/scale.py write /data/scale        # 1,000 class folders, 1,281,167 training files, 50,000 val
    python scripts/scale.py measure /data/scale      # the figures, both sides in one sitting, page cache warm
"""
import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

IMAGENET_TRAIN, CLASSES, VAL_PER_CLASS = 1_281_167, 1000, 50
WARM_STEPS, BATCH, WORKERS = 20, 64, 2


def tiny_jpeg() -> bytes:
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def write_class(job: tuple[Path, int, int, bytes]) -> None:
    folder, label, count, data = job
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        (folder / f"n{label:08d}_{index}.JPEG").write_bytes(data)


def write(root: Path, train: int, classes: int) -> None:
    data = tiny_jpeg()
    per_class = [train // classes + (label < train % classes) for label in range(classes)]
    jobs = [(root / split / f"n{label:08d}", label, count, data) for split, counts in
            (("train", per_class), ("val", [VAL_PER_CLASS] * classes)) for label, count in enumerate(counts)]
    start = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        pool.map(write_class, jobs, chunksize=8)
    print(f"wrote {sum(per_class)} training and {classes * VAL_PER_CLASS} validation files under {root} in "
          f"{time.perf_counter() - start:.0f} s")


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def private_dirty_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) for line in rollup if line.startswith("Private_Dirty:"))


def first_batch_and_growth(batches, steps: int) -> tuple[float, float]:
    """Seconds to the first batch of a fresh iterator, and its workers' private memory growth per image read between
    step WARM_STEPS and step `steps`. Its workers are this process's only children."""
    import psutil

    start = time.perf_counter()
    stream = iter(batches)
    next(stream)
    first = time.perf_counter() - start
    for _ in range(WARM_STEPS - 1):
        next(stream)
    pids = [child.pid for child in psutil.Process().children()]
    before = sum(map(private_dirty_kb, pids))
    for _ in range(steps - WARM_STEPS):
        next(stream)
    growth = (sum(map(private_dirty_kb, pids)) - before) / ((steps - WARM_STEPS) * BATCH)
    del stream
    return first, growth


def measure(root: Path, steps: int) -> None:
    import torch
    from hydra import compose, initialize_config_dir
    from torchvision import datasets, transforms

    from {{ cookiecutter.package }} import options
    from {{ cookiecutter.package }}.core.distributed import ALONE
    from {{ cookiecutter.package }}.core.failures import end_workers
    from {{ cookiecutter.package }}.data.format.folder import list_split
    from {{ cookiecutter.package }}.data.loaders import make_loaders

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="scale-cache-")  # no index kept from before
    kept = Path(os.environ["XDG_CACHE_HOME"])
    split = root / "train"
    classes = sorted(entry.name for entry in os.scandir(split) if entry.is_dir())
    to_index = {name: label for label, name in enumerate(classes)}
    datasets.folder.make_dataset(str(split), to_index, (".jpeg",))  # the page cache warm for both
    ours, theirs, second = [], [], []
    for _ in range(3):
        shutil.rmtree(kept, ignore_errors=True)
        seconds, index = timed(lambda: list_split(split)[0])
        ours.append(seconds)
        seconds, found = timed(lambda: datasets.folder.make_dataset(str(split), to_index, (".jpeg",)))
        theirs.append(seconds)
        second.append(timed(lambda: list_split(split))[0])
    print(f"{len(index)} training files in {len(classes)} class folders, {os.cpu_count()} cores")
    print(f"scan:          ours {statistics.median(ours):.2f} s, ImageFolder's {statistics.median(theirs):.2f} s "
          f"(x{statistics.median(ours) / statistics.median(theirs):.2f}); medians of 3, in turn")
    print(f"second start:  ours {statistics.median(second):.3f} s "
          f"(x{statistics.median(second) / statistics.median(ours):.3f} of the first), reading the kept index")
    assert len(found) == len(index)

    overrides = ["data=folder", f"data.root={root}", "decoder=pil", "data.crop_size=32", "data.val_resize=36",
                 f"train.batch_size={BATCH}", f"loader.num_workers={WORKERS}", "loader.persistent_workers=true"]
    with initialize_config_dir(config_dir=str(options.CONF), version_base="1.3"):
        cfg = compose("train", overrides)

    def ours_loader():
        loaders = make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                               batch_size=BATCH, seed=0, world=ALONE, memory_format=torch.contiguous_format)
        loaders.train.set_epoch(0)
        return loaders.train.loader

    def theirs_loader():
        folder = datasets.ImageFolder(str(split), transforms.Compose([transforms.RandomResizedCrop(32),
                                                                      transforms.ToTensor()]))
        return torch.utils.data.DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                           persistent_workers=True, prefetch_factor=4)

    rows = []
    for name, cache, build in (("ours", "listing", ours_loader), ("ours", "kept index", ours_loader),
                               ("ImageFolder", "listing", theirs_loader)):
        if cache == "listing":
            shutil.rmtree(kept, ignore_errors=True)
        setup, batches = timed(build)
        first, growth = first_batch_and_growth(batches, steps)
        rows.append((name, cache, setup, first, growth))
        end_workers()
    print(f"first batch:   building the loaders, then a fresh iterator's first batch ({WORKERS} workers, batch {BATCH})")
    for name, cache, setup, first, growth in rows:
        print(f"  {name:<11} {cache:<10} build {setup:6.2f} s + first batch {first:5.2f} s = {setup + first:6.2f} s; "
              f"workers' memory +{growth:.3f} KB per image read (steps {WARM_STEPS}-{steps})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("write", "measure"))
    parser.add_argument("root", type=Path)
    parser.add_argument("--train", type=int, default=IMAGENET_TRAIN, help="training files in all")
    parser.add_argument("--classes", type=int, default=CLASSES)
    parser.add_argument("--steps", type=int, default=140, help="batches read for the workers' memory growth")
    args = parser.parse_args()
    if args.action == "write":
        write(args.root, args.train, args.classes)
    else:
        measure(args.root, args.steps)


if __name__ == "__main__":
    sys.exit(main())
