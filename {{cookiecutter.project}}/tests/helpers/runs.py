"""Tiny runs in this process: the overrides that shrink a run, its config as hydra.main hands it over, what it
writes, and the command lines a user gets wrong."""
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.diagnosis.summary import Summary

from helpers.paths import CONF

# A run that takes seconds on two CPU cores and still goes through every stage: debug=tiny, as users have it,
# on a synthetic set of 3 classes.
TINY_SYNTHETIC = ["data.num_classes=3", "data.train_per_class=8", "data.val_per_class=4"]
TINY_OPTIONS = {"profiler=torch": ["profiler.wait=1", "profiler.warmup=1", "profiler.active=1"],
                "decoder=none": ["format=tensor"], "format=tensor": ["decoder=none"],
                "staging=device": ["format=tensor", "decoder=none", "staging.reserve_gb=0"]}  # what each needs beside it

# The network of every tiny run whose claim does not need ResNet-18 (a test that does names its model): torchvision's
# smallest with BatchNorm and an `fc` head, as ResNet's, whose step on 32-pixel crops is a third of ResNet-18's and
# whose checkpoint is a thirtieth.
SMALL_MODEL = "shufflenet_v2_x0_5"
PICKS_A_MODEL = ("model=", "model.name=", "experiment=")


def tiny(overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path) -> list[str]:
    """The user's overrides on top of those that shrink the run and point the chosen data option at tiny data."""
    picked = next((choice[5:] for choice in overrides if choice.startswith("data=")), options.default("data"))
    data = [f"data.cache_dir={cache_dir}", *TINY_SYNTHETIC] if picked in options.having("data", "built_in") \
        else [f"data.root={tiny_root}"]
    named = {override.split("=")[0] for override in overrides}  # what the overrides name themselves is theirs
    needed = [shrink for choice, shrinks in TINY_OPTIONS.items() if choice in overrides for shrink in shrinks
              if shrink.split("=")[0] not in named]
    packed = [f"format.path={cache_dir / f'packed-{choice[7:]}'}" for choice in [*needed, *overrides]
              if choice.startswith("format=") and choice != "format=folder"]
    staged = [f"staging.dir={cache_dir / 'staged'}", "staging.reserve_gb=0"] if "staging=tmpfs" in overrides else []
    model = [] if any(choice.startswith(PICKS_A_MODEL) for choice in overrides) else [f"model.name={SMALL_MODEL}"]
    return ["debug=tiny", *model, *data, *needed, *packed, *staged, *overrides]


@contextmanager
def hydra_run(config: str, overrides: list[str], run_dir: Path, config_dir: Path = CONF) -> Iterator[DictConfig]:
    """`config` composed with `overrides` as hydra.main hands it to its task, Hydra's own part set where
    HydraConfig.get() finds it (the run folder, the overrides, the choices)."""
    run_dir.mkdir(exist_ok=True)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name=config):
        cfg = compose(config, [*overrides, f"hydra.run.dir={run_dir}"], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        yield cfg


def summary(run_dir: Path) -> Summary:
    return Summary.read(run_dir / "summary.json")


def a_summary(**figures) -> Summary:
    """A summary as train writes it, with `figures` and, for everything else, a CPU run of 30 steps that waited 2% of
    the time for data and said nothing of it."""
    plain = dict(overrides=[], choices={}, images_per_s=50.0, data_ms=10.0, host_ms=0.0, compute_ms=500.0,
                 data_frac=0.02, host_frac=0.0, data_cost=0.02, bound="compute", verdict="", advice=[], suggestions=[],
                 withheld=[], hardware={"device": "cpu"}, system={}, env={"device": "cpu: AMD EPYC"}, val_top1=50.0,
                 val_top5=90.0, classes=10, steps=30, skipped_files=0, skipped_steps=0, processes=1, timing_rank=0,
                 ranks=[], epoch_start_ms=[], coverage=[], setup={})
    return Summary(**{**plain, **figures})


LONGER = ("data.train_per_class=40", "train.epochs=3")  # 120 images: 30 steps per epoch for one process

# Command lines a user gets wrong, each refused in one line naming the key or value, before anything is written.
BAD_INPUT = {
    "optim.lr=abc": ["optim.lr=abc"],
    "train.epochs=two": ["train.epochs=two"],
    "data=nosuch": ["data=nosuch"],
    "missing data.root": ["data=folder", "data.root=???"],
    "absent data.root": ["data=folder", "data.root=/no/such/imagenet"],
    "model.name=nosuchnet": ["model.name=nosuchnet"],
    "resume=missing": ["resume=/no/such/last.pt"],
    "decoder=nvjpeg without a GPU": ["decoder=nvjpeg"],
    "prefetcher=cuda_stream without a GPU": ["prefetcher=cuda_stream"],
    "format.path missing": ["format=hdf5", "format.path=???"],
    "format.path absent": ["format=hdf5", "format.path=/no/such/pack"],  # h5py comes with the base install
    "loader.num_workers=lots": ["loader.num_workers=lots"],
    "precision=fp16 without a GPU": ["precision=fp16"],
    "cudnn=fast": ["cudnn=fast"],
    "train.batch_size=0": ["train.batch_size=0"],
    "train.epochs=0": ["train.epochs=0"],
    "data.crop_size=0": ["data.crop_size=0"],
    "loader.prefetch_factor=0": ["loader.prefetch_factor=0"],
    "optim.lr=-0.1": ["optim.lr=-0.1"],
    "data.val_resize below the crop": ["data.crop_size=64", "data.val_resize=32"],
    "order=blocks on files": ["format=folder", "order=blocks"],
    "order.window=0": ["format=lmdb", "order=blocks", "order.window=0"],
    "model.weights absent": ["model.weights=/no/such/weights.pt"],
    "model.weights=NOSUCH": ["model.weights=NOSUCH"],
    "train.freeze_epochs without weights": ["train.freeze_epochs=1"],
    "data.mean of two channels": ["data.mean=[0.5,0.5]"],
    "+ a key no option reads": ["+train.bach_size=32"],
    "+data.root without data=folder": ["+data.root=/photos"],
    "train.batch_size above the training set": ["train.batch_size=64"],
    "optim.betas of one value": ["optim=adamw", "optim.betas=[0.9]"],
    "optim.betas not a list": ["optim=adamw", "optim.betas=0.9"],
    "train.clip_grad_norm=-1": ["train.clip_grad_norm=-1"],
    "train.ema_decay=1": ["train.ema_decay=1"],
    "train.mixup_alpha=-0.2": ["train.mixup_alpha=-0.2"],
    "train.accumulate=0": ["train.accumulate=0"],
    "train.global_batch the batches cannot make up": ["train.global_batch=6"],
    "data.start_crop_size above data.crop_size": ["data.start_crop_size=64"],
    "data.crop_ramp_epochs not a pair": ["data.start_crop_size=16", "data.crop_ramp_epochs=3"],
    "data.start_crop_size without a ramp": ["data.start_crop_size=16"],
    "data.train_crop_size=abc": ["data.train_crop_size=abc"],
    "data.crop_scale backwards": ["data.crop_scale=[0.9,0.1]"],
    "augment.magnitude beyond its bins": ["augment=rand_augment", "augment.magnitude=31"],
    "train.top1_levels above 100": ["train.top1_levels=[50,150]"],
    "CUDA graphs with train.accumulate": ["model.compile=true", "model.compile_mode=reduce-overhead",
                                          "train.accumulate=2"],  # test_precision.py has the other refusals
}


def logged_windows(run_dir: Path) -> list[dict]:
    """The logging windows logger=jsonl has written so far, each with every scalar logged at its step: the rank
    spread is a line of its own after the window's (the setup time is no window, nor the top-1 against the run's
    seconds)."""
    path = run_dir / "scalars.jsonl"
    windows = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if not {"time/setup_s", "val/top1_by_second"} & (scalars := json.loads(line)).keys():
            windows.setdefault(scalars["step"], {}).update(scalars)
    return list(windows.values())
