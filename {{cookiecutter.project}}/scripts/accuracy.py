"""Accuracy tables on a real data set: this project's loop against torchvision's reference recipe, and each fast path
against this project's reference pipeline, each row trained once per seed. A benchmark, not a timed test: each run
of experiment=fashion_mnist trains 10 epochs of 60,000 images, so the whole table takes hours on a few CPU cores.

    python scripts/fashion_mnist.py /data/fashion-mnist
    python scripts/accuracy.py /data/fashion-mnist --work /tmp/accuracy --seeds 0 1 2 \\
        --reference ~/vision/references/classification --out accuracy.md
    # on a GPU machine: five runs at a time, each with two loader workers, sharing the GPU
    python scripts/accuracy.py ... --device cuda --jobs 5 --workers 2

Every row trains `experiment=fashion_mnist` with its overrides (ResNet-18, 28-pixel crops, batch 128, SGD with
Nesterov momentum at lr 0.2, a linear warm-up of one epoch then cosine decay, label smoothing 0.1). The reference
row runs torchvision's `references/classification/train.py` from a checkout of torchvision (`--reference`; this
project holds none of its code) with the same settings, biases not decayed (`--bias-weight-decay=0`), its output
kept in its run folder's train.log. Its schedule steps once per epoch; this loop's default steps per batch, and the
row `schedule=epoch_cosine` steps as the reference's does. The two rows with `schedule.warmup_epochs=0` complete
the 2x2 of warm-up on or off by per-step or per-epoch. The reference has no seed flag, so its runs differ by their
random start alone. The row `experiment=fast_to_accuracy` trains that recipe, for its own epochs, in place of
experiment=fashion_mnist; the row `experiment=fast_to_accuracy staging=device` trains it with the pack held in the
device's memory, judged against that recipe's row.

Each run's result is kept in its folder under --work (by row, epochs and seed), so the same command run again after
a table was cut short trains only the runs it lacks. Beside it is what the run was trained from: its overrides, the
sha256 of each experiment YAML it composes and of the package's files (the reference's: its folder's .py files). A
kept run whose overrides, recipe or code differ from what its row would run now is refused before anything runs, in
one line naming its folder and what differs; --rerun-changed trains such runs again, each old folder kept beside as
<folder>.replaced-<time>. The --levels timed are not compared: they change what a run records, not what it trains.
With --jobs above 1, runs share the machine, so their minutes compare rows within one table only; time one row
against another alone with --jobs 1. Each run's time to the --levels of validation top-1 comes from its
summary.json. The table is rewritten (whole, under a temporary name) as each row completes, so a table cut short
keeps the rows it finished.

Each row is judged against the row VARIANTS names: this loop's reference pipeline and its per-epoch schedule
against torchvision's reference, each schedule's corner without warm-up against its corner with it, and each fast
path against the reference pipeline. A row is within the other's spread where its mean top-1 is no further from
the other's mean than twice the larger of the two rows' standard deviations over seeds. The table gives each
seed's top-1, so the reader can judge otherwise.
"""
import argparse
import concurrent.futures
import hashlib
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import yaml

from {{ cookiecutter.package }}.core.errors import ClearError
from {{ cookiecutter.package }}.core.files import write_atomic
from {{ cookiecutter.package }}.diagnosis.summary import Summary

PACKAGE = "{{ cookiecutter.package }}"
PACKAGE_DIR = Path(importlib.util.find_spec(PACKAGE).origin).parent  # the package `python -m` runs from here
RECIPE = "experiment=fashion_mnist"
SHORT_SIDE = 32  # format=tensor keeps the images at this shorter side: the validation resize, so no detail is lost

# Each row's overrides and the row it is judged against. This loop's reference pipeline (decoder=pil: Pillow, as
# torchvision's reference decodes) and its schedule stepped per epoch as the reference's is, each against
# torchvision's reference; the schedule's other two corners of the 2x2 (warm-up on or off, per step or per epoch);
# then one fast path a row, each against the reference pipeline.
PIPELINE = "reference pipeline (decoder=pil)"
PER_EPOCH = "decoder=pil schedule=epoch_cosine"
VARIANTS = {
    PIPELINE: (["decoder=pil"], "torchvision"),
    PER_EPOCH: (["decoder=pil", "schedule=epoch_cosine"], "torchvision"),
    "decoder=pil schedule.warmup_epochs=0": (["decoder=pil", "schedule.warmup_epochs=0"], PIPELINE),
    "decoder=pil schedule=epoch_cosine schedule.warmup_epochs=0":
        (["decoder=pil", "schedule=epoch_cosine", "schedule.warmup_epochs=0"], PER_EPOCH),
    "decoder=turbojpeg (region, DCT scale)": (["decoder=turbojpeg"], PIPELINE),
    "decoder=opencv": (["decoder=opencv"], PIPELINE),
    "format=lmdb": (["format=lmdb", "format.path={packs}/lmdb"], PIPELINE),
    f"format=tensor, pack.short_side={SHORT_SIDE}":
        (["format=tensor", "decoder=none", "format.path={packs}/tensor"], PIPELINE),
    "order=blocks (format=lmdb)": (["format=lmdb", "format.path={packs}/lmdb", "order=blocks"], PIPELINE),
    "precision=bf16": (["decoder=pil", "precision=bf16"], PIPELINE),
    "model.channels_last=true": (["decoder=pil", "model.channels_last=true"], PIPELINE),
    "experiment=fast_to_accuracy": (["experiment=fast_to_accuracy", "format.path={packs}/tensor"], PIPELINE),
    "experiment=fast_to_accuracy staging=device":
        (["experiment=fast_to_accuracy", "format.path={packs}/tensor", "staging=device"], "experiment=fast_to_accuracy"),
}
PACKS = {"lmdb": [], "tensor": [f"pack.short_side={SHORT_SIDE}"]}
REFERENCE = "torchvision's references/classification/train.py"


@dataclass
class Row:
    name: str
    top1: list[float] = field(default_factory=list)  # the last validation's top-1 of each seed's run
    minutes: list[float] = field(default_factory=list)  # each run's wall time
    reached: list[dict[str, float]] = field(default_factory=list)  # each run's minutes to each level it reached

    @property
    def mean(self) -> float:
        return statistics.fmean(self.top1)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.top1) if len(self.top1) > 1 else 0.0

    def within(self, reference: "Row") -> bool:
        return abs(self.mean - reference.mean) <= 2 * max(self.sd, reference.sd)

    def minutes_to(self, level: str) -> str:
        """The mean minutes to `level` over the runs that reached it, and how many did, or "-" where none did or
        none was timed (the reference's log gives no times)."""
        times = [reached[level] for reached in self.reached if level in reached]
        if not times:
            return "-"
        return f"{statistics.fmean(times):.1f}" + (f" ({len(times)} of {len(self.reached)})"
                                                   if len(times) < len(self.reached) else "")


@dataclass
class Result:
    """What one training run gives a row."""
    top1: float
    minutes: float
    reached: dict[str, float] | None = None  # minutes to each level reached; None: not timed


@dataclass(kw_only=True)
class Provenance:
    """What a run is trained from, kept beside its result."""
    overrides: list[str]  # its command's settings, but for its run folder and the --levels it times
    recipes: dict[str, str]  # the sha256 of each experiment YAML it composes, by its path under conf/
    code: str  # the sha256 of the code it runs

    def differences(self, now: "Provenance") -> list[str]:
        """What differs from `now`, each in a few words; empty where nothing does."""
        found = []
        if set(self.overrides) != set(now.overrides):
            gone = [override for override in self.overrides if override not in now.overrides]
            new = [override for override in now.overrides if override not in self.overrides]
            found.append(f"its overrides {' '.join(gone) or '(none)'} are now {' '.join(new) or '(none)'}")
        found += [f"its recipe {name} changed" for name in sorted(self.recipes.keys() | now.recipes.keys())
                  if self.recipes.get(name) != now.recipes.get(name)]
        if self.code != now.code:
            found.append("its code changed")
        return found


@dataclass(kw_only=True)
class Planned:
    """One run of a row: the folder that keeps its result, what it is trained from, and how to run it."""
    folder: Path
    provenance: Provenance
    run: Callable[[], Result]


RECORD = "accuracy-run.json"  # in a run's folder: its result and its provenance, written once it finished


def changes(plan: Planned) -> list[str]:
    """How the run kept in plan.folder differs from what plan would run now; empty where none is kept or none does."""
    record = plan.folder / RECORD
    if not record.is_file():
        return []
    kept_from = json.loads(record.read_text()).get("provenance")
    if kept_from is None:  # kept before runs recorded what they were trained from
        return ["its record does not say what it was trained from"]
    return Provenance(**kept_from).differences(plan.provenance)


def kept(plan: Planned) -> Result:
    """The result plan.folder keeps of a run that finished there, else plan.run() with its result and provenance
    kept there: a table cut short goes on from the runs it finished. main() has set aside, or refused, every kept
    run whose provenance differs from the plan's."""
    record = plan.folder / RECORD
    if record.is_file():
        return Result(**json.loads(record.read_text())["result"])
    result = plan.run()
    text = json.dumps({"result": asdict(result), "provenance": asdict(plan.provenance)})
    write_atomic(record, lambda path: path.write_text(text))
    return result


def digest(files: list[Path], under: Path) -> str:
    """The sha256 of `files`, each by its path under `under` and its bytes."""
    total = hashlib.sha256()
    for file in sorted(files):
        data = file.read_bytes()
        total.update(f"{file.relative_to(under)}\0{len(data)}\0".encode() + data)
    return total.hexdigest()


def package_code(package: Path) -> str:
    """The sha256 of the package's files, the recipes in conf/experiment/ left out (recipes() hashes those a row
    composes). A digest of what `python -m` runs, rather than `git rev-parse HEAD`: a baked project need not be a git
    checkout, a commit misses the uncommitted edits a recipe is tuned with, and one that touches only docs, tests or
    scripts would discard hours of runs it does not change. Editing a recipe no row composes keeps every run."""
    recipes = package / "conf" / "experiment"
    return digest([file for file in package.rglob("*") if file.is_file() and "__pycache__" not in file.parts
                   and not file.is_relative_to(recipes)], package)


def recipes(overrides: list[str], conf: Path) -> dict[str, str]:
    """The sha256 of each experiment YAML `overrides` compose, by its path under `conf`: the one experiment= names,
    and in turn each that a defaults list names by its bare name, a file of the same group to Hydra
    (fast_to_accuracy's `- fashion_mnist`)."""
    names = [override.partition("=")[2] for override in overrides if override.startswith("experiment=")]
    found = {}
    while names:
        path = f"experiment/{names.pop()}.yaml"
        if path in found:
            continue
        text = (conf / path).read_bytes()
        found[path] = hashlib.sha256(text).hexdigest()
        names += [entry for entry in yaml.safe_load(text).get("defaults", [])
                  if isinstance(entry, str) and entry != "_self_"]
    return found


def overrides(variant: list[str], packs: Path) -> list[str]:
    return [override.format(packs=packs) for override in variant]


def recipe_and_overrides(variant: list[str], packs: Path, epochs: int) -> list[str]:
    """experiment=fashion_mnist for `epochs` and the row's overrides, or the row's own recipe where it names one,
    for the recipe's own epochs: a recipe's schedule is part of what it is."""
    chosen = overrides(variant, packs)
    if any(override.startswith("experiment=") for override in chosen):
        return chosen
    return [RECIPE, f"train.epochs={epochs}", *chosen]


def our_overrides(root: Path, variant: list[str], seed: int, epochs: int, packs: Path, workers: int) -> list[str]:
    """What a run of this project's loop is given, but for its run folder and the levels it times."""
    return [*recipe_and_overrides(variant, packs, epochs), f"data.root={root.resolve()}", f"seed={seed}",
            f"loader.num_workers={workers}"]


def ours(overrides: list[str], levels: list[str], run_dir: Path) -> Result:
    """One run of this project's loop: its last validation top-1 and its minutes to each level."""
    command = [sys.executable, "-m", f"{PACKAGE}.train", *overrides, f"train.top1_levels=[{','.join(levels)}]",
               f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    summary = Summary.read(run_dir / "summary.json")
    return Result(summary.val_top1, (time.perf_counter() - start) / 60,
               {level: seconds / 60 for level, seconds in summary.time_to_top1_s.items()})


def reference_command(script: Path, root: Path, epochs: int, out: Path, device: str, workers: int) -> list[str]:
    """torchvision's reference train.py with experiment=fashion_mnist's settings."""
    return [sys.executable, str(script), f"--data-path={root}", "--model=resnet18", f"--epochs={epochs}",
            "--batch-size=128", "--opt=sgd_nesterov", "--lr=0.2", "--momentum=0.9", "--wd=5e-5",
            "--norm-weight-decay=0", "--bias-weight-decay=0", "--label-smoothing=0.1", "--lr-scheduler=cosineannealinglr",
            "--lr-warmup-epochs=1", "--lr-warmup-method=linear", "--lr-warmup-decay=0.01", "--train-crop-size=28",
            "--val-resize-size=32", "--val-crop-size=28", f"--workers={workers}", f"--device={device}",
            f"--output-dir={out}"]


def last_top1(log: str) -> float:
    """The top-1 of the last validation a reference run printed ("Test:  Acc@1 91.230 Acc@5 99.810")."""
    found = re.findall(r"Acc@1 ([0-9.]+) Acc@5", log)
    if not found:
        raise RuntimeError(f"the reference run printed no 'Acc@1 ... Acc@5' line; its output ends: {log[-500:]}")
    return float(found[-1])


def reference(script: Path, root: Path, epochs: int, out: Path, device: str, workers: int) -> Result:
    """One run of torchvision's reference, from this folder (so relative paths mean what they say here), its output
    kept whole in out/train.log; a run that fails raises with that output's end."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = subprocess.run(reference_command(script, root.resolve(), epochs, out.resolve(), device, workers),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    write_atomic(out / "train.log", lambda path: path.write_text(result.stdout))
    if result.returncode:
        raise RuntimeError(f"the reference run failed with exit code {result.returncode}; {out / 'train.log'} "
                           f"ends: {result.stdout[-500:]}")
    return Result(last_top1(result.stdout), (time.perf_counter() - start) / 60)


def compared_with(name: str, names: list[str]) -> str | None:
    """The row that the row `name` is judged against, among the rows asked for: the one VARIANTS names, else
    torchvision's reference; None for torchvision's reference itself or where neither was asked for."""
    if name == REFERENCE:
        return None
    named = VARIANTS[name][1]
    ahead = [REFERENCE] if named == "torchvision" else [named, REFERENCE]
    return next((candidate for candidate in ahead if candidate in names), None)


def table(rows: list[Row], names: list[str], levels: list[str]) -> str:
    """The rows finished, each judged against the row compared_with names, once that one has finished too."""
    by_name = {row.name: row for row in rows}
    lines = ["| run | top-1 per seed (%) | mean | sd | within the spread of | minutes per run | "
             + " | ".join(f"minutes to {level}%" for level in levels) + " |",
             "|---|---|---:|---:|---|---:|" + "---:|" * len(levels)]
    for row in rows:
        target = compared_with(row.name, names)
        if target is None:
            within = "(the reference)"
        elif target not in by_name:
            within = f"not judged: {target} did not finish"
        else:
            within = f"{'yes' if row.within(by_name[target]) else '**no**'}, of {target}"
        lines.append(f"| {row.name} | {', '.join(f'{value:.2f}' for value in row.top1)} | {row.mean:.2f} | "
                     f"{row.sd:.2f} | {within} | {statistics.fmean(row.minutes):.1f} | "
                     + " | ".join(row.minutes_to(level) for level in levels) + " |")
    return "\n".join(lines) + "\n"


def measure(rows: dict[str, Callable[[int], Result]], seeds: list[int], jobs: int, levels: list[str],
            out: Path | None) -> tuple[list[Row], list[str]]:
    """Each row's runs, `jobs` at a time: rows maps a row's name to run(seed) -> Result. A run that fails leaves its
    row out, said in one line, and the others go on. The table of the rows finished so far is written to `out` as
    each row finishes. Returns the rows finished and the names of those that failed."""
    done: dict[str, dict[int, Result]] = {name: {} for name in rows}
    failed: list[str] = []
    finished: list[Row] = []
    pool = concurrent.futures.ThreadPoolExecutor(jobs)
    pending = {pool.submit(run, seed): (name, seed) for name, run in rows.items() for seed in seeds}
    try:
        for future in concurrent.futures.as_completed(pending):
            name, seed = pending[future]
            try:
                done[name][seed] = future.result()
            except Exception as err:  # any way a run can fail: its exit code, an unreadable summary, ...
                print(f"error: {name}, seed {seed}: {describe(err)}; the table leaves this row out", file=sys.stderr)
                failed.append(name)
                continue
            if len(done[name]) == len(seeds):
                finished = [collected(name, [done[name][seed] for seed in seeds]) for name in rows
                            if len(done[name]) == len(seeds)]
                if out:
                    text = table(finished, list(rows), levels)
                    write_atomic(out, lambda path: path.write_text(text))
    finally:  # on an error or Ctrl-C, no queued run starts; the running ones end with their own processes
        pool.shutdown(wait=False, cancel_futures=True)
    return finished, list(dict.fromkeys(failed))


def describe(err: Exception) -> str:
    if isinstance(err, subprocess.CalledProcessError):
        return f"{' '.join(map(str, err.cmd[:4]))} ... failed with exit code {err.returncode}; its output says why"
    return str(err)


def planned_runs(args: argparse.Namespace, script: Path | None, packs: Path) -> dict[tuple[str, int], Planned]:
    """Each run the table needs, by row and seed: torchvision's reference where --reference is given, then each of
    --variants."""
    planned = {}
    if script is not None:
        code = digest(list(script.parent.glob("*.py")), script.parent)
        for seed in args.seeds:
            out = args.work / "runs" / "torchvision-reference" / f"epochs{args.epochs}-seed{seed}"
            command = reference_command(script, args.root.resolve(), args.epochs, out, args.device, args.workers)
            settings = [arg for arg in command[2:] if not arg.startswith("--output-dir=")]
            planned[REFERENCE, seed] = Planned(
                folder=out, provenance=Provenance(overrides=settings, recipes={}, code=code),
                run=partial(reference, script, args.root, args.epochs, out, args.device, args.workers))
    code = package_code(PACKAGE_DIR)
    for name in args.variants:
        runs = args.work / "runs" / re.sub(r"\W+", "-", name).strip("-")
        for seed in args.seeds:
            folder = runs / f"epochs{args.epochs}-seed{seed}"
            given = our_overrides(args.root, VARIANTS[name][0], seed, args.epochs, packs, args.workers)
            planned[name, seed] = Planned(
                folder=folder, provenance=Provenance(overrides=given, recipes=recipes(given, PACKAGE_DIR / "conf"),
                                                     code=code),
                run=partial(ours, given, args.levels, folder))
    return planned


def set_aside_changed(planned: list[Planned], rerun: bool) -> None:
    """Refuse, in one line, kept runs that differ from what their rows would run now, or with `rerun` rename each
    beside itself, so that it is trained again and its hours are not lost."""
    changed = {plan.folder: found for plan in planned if (found := changes(plan))}
    if not changed:
        return
    if not rerun:
        folder, found = next(iter(changed.items()))
        raise ClearError(f"{len(changed)} kept run(s) differ from what their rows would run now, such as {folder}: "
                         f"{'; '.join(found)}; pass --rerun-changed to train them again, each old one kept beside as "
                         "<folder>.replaced-<time>, or give another --work")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for folder in changed:
        folder.rename(folder.with_name(f"{folder.name}.replaced-{stamp}"))
    print(f"{len(changed)} changed run(s) kept beside their folders as <folder>.replaced-{stamp}; training them again",
          file=sys.stderr)


def collected(name: str, runs: list[Result]) -> Row:
    return Row(name, [run.top1 for run in runs], [run.minutes for run in runs],
               [run.reached for run in runs if run.reached is not None])


def whole(low: int, high: int | None = None):
    """An argparse type: a whole number from low (to high), refused in argparse's one error line otherwise."""
    def parse(text: str) -> int:
        if not re.fullmatch(r"-?[0-9]+", text) or int(text) < low or (high is not None and int(text) > high):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low}"
                                             + (f" to {high}" if high is not None else " up"))
        return int(text)
    return parse


def percent(text: str) -> str:
    """An argparse type: a top-1 level above 0 and up to 100, such as 88 or 87.6, written as the loop's summary.json
    keys it (time_to_top1_s: "88", "87.6"), refused in argparse's one error line otherwise."""
    try:
        level = float(text)
    except ValueError:
        level = 0.0
    if not 0 < level <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a top-1 percentage above 0 and up to 100, such as 87.6")
    return f"{level:g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the class-folder tree of scripts/fashion_mnist.py")
    parser.add_argument("--work", type=Path, required=True, help="a folder for the packs and the runs")
    parser.add_argument("--seeds", type=whole(0), nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=whole(1), default=10)
    parser.add_argument("--reference", type=Path, help="torchvision's references/classification folder")
    parser.add_argument("--device", default="cpu", help="the reference run's --device (cuda on a GPU)")
    parser.add_argument("--workers", type=whole(0), default=2, help="each run's loader workers, the reference's too")
    parser.add_argument("--jobs", type=whole(1), default=1, help="runs at a time, sharing the machine")
    parser.add_argument("--levels", type=percent, nargs="+", default=["90", "92"],
                        help="validation top-1 levels (%%) whose time the table gives")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", type=Path, help="write the table here as well as to stdout")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="train again each kept run whose overrides, recipe or code changed, the old kept beside")
    args = parser.parse_args()
    if len(set(args.seeds)) < len(args.seeds):
        parser.error(f"argument --seeds: {' '.join(map(str, args.seeds))} names a seed twice; give each once")
    if args.out and not args.out.parent.is_dir():
        sys.exit(f"error: --out {args.out}: {args.out.parent} is not a folder; create it, or write the table elsewhere")
    if not (args.root / "train").is_dir():
        sys.exit(f"error: {args.root} holds no train/: write it first with python scripts/fashion_mnist.py {args.root}")
    script = args.reference / "train.py" if args.reference else None
    if script is not None and not script.is_file():
        sys.exit(f"error: --reference {args.reference} holds no train.py: pass torchvision's "
                 "references/classification folder")
    packs = args.work / "packs"
    planned = planned_runs(args, script, packs)
    set_aside_changed(list(planned.values()), args.rerun_changed)
    for format, settings in PACKS.items():
        wanted = ("format.path={packs}/" + format) in (override for name in args.variants
                                                        for override in VARIANTS[name][0])
        if wanted and not (packs / format).exists():
            subprocess.run([sys.executable, "-m", f"{PACKAGE}.pack", f"data.root={args.root}", f"format={format}",
                            f"pack.out={packs / format}", *settings], check=True, stdout=subprocess.DEVNULL)
    rows = {name: partial(lambda name, seed: kept(planned[name, seed]), name) for name, _ in planned}
    finished, failed = measure(rows, args.seeds, args.jobs, args.levels, args.out)
    print(table(finished, list(rows), args.levels))
    if failed:
        sys.exit(f"error: {len(failed)} row(s) failed: {', '.join(failed)}; the lines above say why")


if __name__ == "__main__":
    try:
        main()
    except (subprocess.CalledProcessError, ClearError) as err:  # a pack's own error line is above; a full disk
        sys.exit(f"error: {describe(err)}")
