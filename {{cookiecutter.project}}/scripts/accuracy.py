"""Accuracy tables on a real data set: this project's loop against torchvision's reference recipe, and each fast path
against this project's reference pipeline, each row trained once per seed. A benchmark, not a timed test: each run
of experiment=fashion_mnist trains 10 epochs of 60,000 images, so the whole table takes hours on a few CPU cores.

    python scripts/fashion_mnist.py /data/fashion-mnist
    python scripts/accuracy.py /data/fashion-mnist --work /tmp/accuracy --seeds 0 1 2 \\
        --reference ~/vision/references/classification --out accuracy.md

Every row trains `experiment=fashion_mnist` with its overrides (ResNet-18, 28-pixel crops, batch 128, SGD with
Nesterov momentum at lr 0.2, a linear warm-up of one epoch then cosine decay, label smoothing 0.1). The reference
row runs torchvision's `references/classification/train.py` from a checkout of torchvision (`--reference`; this
project holds none of its code) with the same settings, as far as its flags go: its schedule steps once per epoch
and decays the biases, where this project's steps per batch and does not. It has no seed flag, so its runs differ
by their random start alone.

A row is within the reference's spread where its mean top-1 is no further from the reference row's mean than twice
the larger of the two rows' standard deviations over seeds. The table gives each seed's top-1, so the reader can
judge otherwise.
"""
import argparse
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from {{ cookiecutter.package }}.diagnosis.summary import Summary

PACKAGE = "{{ cookiecutter.package }}"
RECIPE = "experiment=fashion_mnist"
SHORT_SIDE = 32  # format=tensor keeps the images at this shorter side: the validation resize, so no detail is lost

# The reference pipeline (decoder=pil: Pillow, as torchvision's reference decodes) first, then one fast path a row.
VARIANTS = {
    "reference pipeline (decoder=pil)": ["decoder=pil"],
    "decoder=turbojpeg (region, DCT scale)": ["decoder=turbojpeg"],
    "decoder=opencv": ["decoder=opencv"],
    "format=lmdb": ["format=lmdb", "format.path={packs}/lmdb"],
    f"format=tensor, pack.short_side={SHORT_SIDE}": ["format=tensor", "decoder=none", "format.path={packs}/tensor"],
    "order=blocks (format=lmdb)": ["format=lmdb", "format.path={packs}/lmdb", "order=blocks"],
    "precision=bf16": ["decoder=pil", "precision=bf16"],
    "model.channels_last=true": ["decoder=pil", "model.channels_last=true"],
}
PACKS = {"lmdb": [], "tensor": [f"pack.short_side={SHORT_SIDE}"]}


@dataclass
class Row:
    name: str
    top1: list[float] = field(default_factory=list)  # the last validation's top-1 of each seed's run
    minutes: list[float] = field(default_factory=list)  # each run's wall time

    @property
    def mean(self) -> float:
        return statistics.fmean(self.top1)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.top1) if len(self.top1) > 1 else 0.0

    def within(self, reference: "Row") -> bool:
        return abs(self.mean - reference.mean) <= 2 * max(self.sd, reference.sd)


def overrides(variant: list[str], packs: Path) -> list[str]:
    return [override.format(packs=packs) for override in variant]


def ours(root: Path, variant: list[str], seed: int, epochs: int, run_dir: Path, packs: Path) -> float:
    """The last validation top-1 of one run of this project's loop."""
    command = [sys.executable, "-m", f"{PACKAGE}.train", RECIPE, f"data.root={root}", f"seed={seed}",
               f"train.epochs={epochs}", f"hydra.run.dir={run_dir}", *overrides(variant, packs)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return Summary.read(run_dir / "summary.json").val_top1


def reference_command(script: Path, root: Path, epochs: int, out: Path, device: str, workers: int) -> list[str]:
    """torchvision's reference train.py with experiment=fashion_mnist's settings."""
    return [sys.executable, str(script), f"--data-path={root}", "--model=resnet18", f"--epochs={epochs}",
            "--batch-size=128", "--opt=sgd_nesterov", "--lr=0.2", "--momentum=0.9", "--wd=5e-5",
            "--norm-weight-decay=0", "--label-smoothing=0.1", "--lr-scheduler=cosineannealinglr",
            "--lr-warmup-epochs=1", "--lr-warmup-method=linear", "--lr-warmup-decay=0.01", "--train-crop-size=28",
            "--val-resize-size=32", "--val-crop-size=28", f"--workers={workers}", f"--device={device}",
            f"--output-dir={out}"]


def last_top1(log: str) -> float:
    """The top-1 of the last validation a reference run printed ("Test:  Acc@1 91.230 Acc@5 99.810")."""
    found = re.findall(r"Acc@1 ([0-9.]+) Acc@5", log)
    if not found:
        raise RuntimeError(f"the reference run printed no 'Acc@1 ... Acc@5' line; its output ends: {log[-500:]}")
    return float(found[-1])


def reference(script: Path, root: Path, epochs: int, out: Path, device: str, workers: int) -> float:
    result = subprocess.run(reference_command(script, root, epochs, out, device, workers), check=True,
                            capture_output=True, text=True, cwd=script.parent)
    return last_top1(result.stdout)


def table(rows: list[Row], reference_row: Row) -> str:
    lines = ["| run | top-1 per seed (%) | mean | sd | within the reference's spread | minutes per run |",
             "|---|---|---:|---:|---|---:|"]
    for row in rows:
        within = "(the reference)" if row is reference_row else ("yes" if row.within(reference_row) else "**no**")
        lines.append(f"| {row.name} | {', '.join(f'{value:.2f}' for value in row.top1)} | {row.mean:.2f} | "
                     f"{row.sd:.2f} | {within} | {statistics.fmean(row.minutes):.1f} |")
    return "\n".join(lines) + "\n"


def measured(name: str, seeds: list[int], run) -> Row:
    """A row: run(seed), the top-1 of one training run, timed for each seed."""
    row = Row(name)
    for seed in seeds:
        start = time.perf_counter()
        row.top1.append(run(seed))
        row.minutes.append((time.perf_counter() - start) / 60)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the class-folder tree of scripts/fashion_mnist.py")
    parser.add_argument("--work", type=Path, required=True, help="a folder for the packs and the runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--reference", type=Path, help="torchvision's references/classification folder")
    parser.add_argument("--device", default="cpu", help="the reference run's --device (cuda on a GPU)")
    parser.add_argument("--workers", type=int, default=2, help="the reference run's loader workers")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", type=Path, help="write the table here as well as to stdout")
    args = parser.parse_args()
    if not (args.root / "train").is_dir():
        sys.exit(f"error: {args.root} holds no train/: write it first with python scripts/fashion_mnist.py {args.root}")
    script = args.reference / "train.py" if args.reference else None
    if script is not None and not script.is_file():
        sys.exit(f"error: --reference {args.reference} holds no train.py: pass torchvision's "
                 "references/classification folder")
    packs = args.work / "packs"
    for format, settings in PACKS.items():
        if any(f"format={format}" in override for name in args.variants for override in VARIANTS[name]) and \
                not (packs / format).exists():
            subprocess.run([sys.executable, "-m", f"{PACKAGE}.pack", f"data.root={args.root}", f"format={format}",
                            f"pack.out={packs / format}", *settings], check=True, stdout=subprocess.DEVNULL)
    rows = []
    if script is not None:
        rows.append(measured("torchvision's references/classification/train.py", args.seeds, lambda seed: reference(
            script, args.root, args.epochs, args.work / f"reference-{seed}", args.device, args.workers)))
    for name in args.variants:
        runs = args.work / "runs" / re.sub(r"\W+", "-", name).strip("-")
        rows.append(measured(name, args.seeds, lambda seed: ours(args.root, VARIANTS[name], seed, args.epochs,
                                                                 runs / f"seed{seed}", packs)))
    written = table(rows, rows[0])
    print(written)
    if args.out:  # whole or not at all
        partial = args.out.with_name(f".{args.out.name}.partial")
        partial.write_text(written)
        partial.replace(args.out)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as err:  # the run's own error line is above
        sys.exit(f"error: {' '.join(map(str, err.cmd[:4]))} ... failed with exit code {err.returncode}; its output "
                 "above says why")
