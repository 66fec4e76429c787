"""The real config, composed once and shrunk: CPU, a tiny synthetic data set, a few steps, output under tmp_path."""
import atexit
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict
from PIL import Image

# What the project keeps for later runs (worker counts, file indexes) goes to a folder of the session's own, not the
# user's cache: set before the package is imported, and inherited by every command line the tests run.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
# logger=wandb in the tests: offline (no API key), its settings in that folder too; nothing leaves the machine.
os.environ.pop("WANDB_API_KEY", None)
os.environ["WANDB_CONFIG_DIR"] = os.path.join(os.environ["XDG_CACHE_HOME"], "wandb-config")

# Under pytest-xdist, test processes share the cores: torch gets one thread in each, and so does every command line
# a test starts, or their threads would fight over the cores. The tests that compare CPU rates are marked `serial`
# and run after them, alone, with every thread.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

from {{ cookiecutter.package }} import options  # noqa: E402 - after the cache folder is set
from {{ cookiecutter.package }}.core.failures import end_workers  # noqa: E402
from {{ cookiecutter.package }}.core.hardware import Hardware  # noqa: E402
from {{ cookiecutter.package }}.diagnosis.summary import Summary  # noqa: E402

# A failing test's traceback can keep a loader's persistent workers alive to the end of the session; they ignore the
# SIGTERM multiprocessing sends them at exit, which would then wait for them forever. Registered after
# multiprocessing's own exit handler, this runs first.
atexit.register(end_workers)

PROJECT = Path(__file__).resolve().parents[1]
CONF = options.CONF
PACKAGE = "{{ cookiecutter.package }}"

# A run that takes seconds on two CPU cores and still goes through every stage: debug=tiny, as users have it,
# on a synthetic set of 3 classes.
TINY_SYNTHETIC = ["data.num_classes=3", "data.train_per_class=8", "data.val_per_class=4"]
QUIET = {"PYTHONWARNINGS": "ignore"}
CPU_ONLY = {**QUIET, "CUDA_VISIBLE_DEVICES": ""}  # for the tests that are about a machine without a GPU
TINY_OPTIONS = {"profiler=torch": ["profiler.wait=1", "profiler.warmup=1", "profiler.active=1"],
                "decoder=none": ["format=tensor"], "format=tensor": ["decoder=none"]}  # what each option needs beside it


CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")  # the machine's own: tests run the GPU paths where there is one
# Two processes of one job need a GPU each; with fewer, their tests run both on the CPU.
TWO_PROCESSES = {} if torch.cuda.device_count() >= 2 else {"CUDA_VISIBLE_DEVICES": ""}


# Machines described, for the rules that read the hardware: tests never assume the one they run on.
AVX2 = Hardware(device="cpu", cores=2, cpu="AMD EPYC", cpu_flags=(), cpu_capability="AVX2")
AVX512_BF16 = Hardware(device="cpu", cores=64, cpu="Intel Xeon Platinum 8480+", cpu_flags=("avx512_bf16", "amx_bf16"),
                       cpu_capability="AVX512")
SM61 = Hardware(device="cuda", cores=4, cpu="Intel Core", cpu_flags=(), cpu_capability="AVX2", gpu="GTX 1080",
                gpu_capability=(6, 1))
SM70 = Hardware(device="cuda", cores=8, cpu="Intel Xeon", cpu_flags=(), cpu_capability="AVX512", gpu="Tesla V100",
                gpu_capability=(7, 0))
SM90 = Hardware(device="cuda", cores=16, cpu="AMD EPYC", cpu_flags=(), cpu_capability="AVX2", gpu="NVIDIA H100",
                gpu_capability=(9, 0))
MACHINES = {"avx2": AVX2, "avx512_bf16": AVX512_BF16, "sm61": SM61, "sm70": SM70, "sm90": SM90}


def installed(group: str, names: list[str]) -> list:
    """`names` as test parameters, each skipped with the install command where its extra is missing."""
    return [pytest.param(name, marks=pytest.mark.skipif(bool(options.facts(group, name).missing()),
                                                        reason=str(options.facts(group, name).missing())))
            for name in names]


def on_this_machine(choice: str) -> list[str]:
    """The overrides that let `choice` ("group=option") run on this machine: on one without a GPU, the
    settings its facts give for running without one (GPU decoders: their batched path on the CPU)."""
    group, option = choice.split("=")
    return [] if CUDA else options.facts(group, option).overrides_without_gpu(group)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run the real CUDA paths; without CUDA they are skipped, and say why."""
    if CUDA:
        return
    skip = pytest.mark.skip(reason="gpu: needs CUDA, and torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_busy():
    """gpu_busy(seconds) queues one device op that keeps the GPU busy for about that long, on any card."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm-up
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_s = 10_000_000 / (start.elapsed_time(end) / 1000)
    return lambda seconds: torch.cuda._sleep(int(seconds * cycles_per_s))


def uploaded(decoder, images, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
    """One collated batch's images through the decoder's uploads to `device`, as the training loop gets them."""
    return next(decoder.uploads([(images, None)], device, non_blocking))[0]


def encoded(image: Image.Image, format: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


def photo(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A left-to-right ramp with noise: smooth enough for JPEG, different in every row and column."""
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, width)[None, :, None] * np.ones((height, 1, 3))
    pixels = np.clip(base + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels).convert(mode)


def exif_rotated(width: int, height: int) -> bytes:
    """A JPEG whose EXIF orientation (6) asks viewers to turn it 90 degrees clockwise."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encoded(photo(width, height), exif=exif.tobytes())


# ImageNet's known oddities; every decoder reads each of them.
ODD_FILES = {
    "rgb": encoded(photo(500, 375)),
    "grayscale": encoded(photo(500, 375, "L")),
    "cmyk": encoded(photo(500, 375, "CMYK")),
    "png_named_jpeg": encoded(photo(300, 200), "PNG"),
    "progressive": encoded(photo(500, 375), progressive=True),
    "exif_rotated": exif_rotated(500, 375),
    "large": encoded(photo(4000, 3000)),
    "tiny": encoded(photo(16, 16)),
    "trailer": encoded(photo(500, 375)) + b"ftypmp42" + bytes(range(256)) * 40,  # a motion photo's video after EOI
    # Arithmetic coding, which nvJPEG does not decode; no Python library writes it, so this one was written by
    # libjpeg-turbo's `cjpeg -arithmetic` from photo(64, 48).
    "arithmetic": (Path(__file__).parent / "data/arithmetic.jpg").read_bytes(),
}


@pytest.fixture
def tree_with_bad_files(tmp_path):
    """Two classes of 4 good images per split, plus a zero-byte, a truncated and a text file in train/."""
    for split in ("train", "val"):
        for label in ("a", "b"):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for index in range(4):
                (folder / f"{index}.JPEG").write_bytes(encoded(photo(80, 60, seed=index)))
    good = (tmp_path / "train/a/0.JPEG").read_bytes()
    (tmp_path / "train/a/zero.JPEG").write_bytes(b"")
    (tmp_path / "train/a/truncated.JPEG").write_bytes(good[: len(good) // 2])
    (tmp_path / "train/b/text.JPEG").write_text("not an image")
    return tmp_path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """Where data=synthetic writes its files; shared by the session so they are made once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_root(cache_dir) -> Path:
    """A tiny ImageNet-style tree (3 classes), for data=folder."""
    from {{ cookiecutter.package }}.data.synth import write_dataset

    return write_dataset(cache_dir / "tiny-tree", num_classes=3, train_per_class=8, val_per_class=4, workers=2)


TENSOR_SHORT_SIDE = 40


@pytest.fixture(scope="session")
def packs(cache_dir, tiny_root) -> dict[str, Path]:
    """The tiny tree packed into every packed format, once per session."""
    from {{ cookiecutter.package }}.tools.pack import pack

    packed = {}
    for path in sorted((CONF / "format").glob("*.yaml")):
        if options.facts("format", path.stem).packed and not options.facts("format", path.stem).missing():
            packed[path.stem] = cache_dir / f"packed-{path.stem}"
            pack(tiny_root, path.stem, packed[path.stem], TENSOR_SHORT_SIDE if path.stem == "tensor" else None,
                 90, 2, False, "raise", chunk_mb=0.05)  # litdata: several chunks per split
    return packed


def packed_tree(root: Path, num_classes: int, train_per_class: int) -> tuple[Path, Path]:
    """A synthetic class-folder tree under `root` (two validation images a class) and its HDF5 pack, whose records
    order=blocks reads in runs: (pack, tree)."""
    from {{ cookiecutter.package }}.data.synth import write_dataset
    from {{ cookiecutter.package }}.tools.pack import pack

    tree = write_dataset(root / "tree", num_classes=num_classes, train_per_class=train_per_class, val_per_class=2,
                         workers=2)
    pack(tree, "hdf5", root / "packed", None, 90, 2, False, "raise")
    return root / "packed", tree


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
    needed = [shrink for choice, shrinks in TINY_OPTIONS.items() if choice in overrides for shrink in shrinks]
    packed = [f"format.path={cache_dir / f'packed-{choice[7:]}'}" for choice in [*needed, *overrides]
              if choice.startswith("format=") and choice != "format=folder"]
    staged = [f"staging.dir={cache_dir / 'staged'}", "staging.reserve_gb=0"] if "staging=tmpfs" in overrides else []
    model = [] if any(choice.startswith(PICKS_A_MODEL) for choice in overrides) else [f"model.name={SMALL_MODEL}"]
    return ["debug=tiny", *model, *data, *needed, *packed, *staged, *overrides]


@pytest.fixture
def compose_tiny(cache_dir, tiny_root, packs):
    """compose(overrides) -> the shrunk training config with those overrides on top."""

    def composed(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("train", tiny(overrides, cache_dir, tiny_root))

    return composed


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


@pytest.fixture
def train_in_process(cache_dir, tiny_root, packs, tmp_path, monkeypatch):
    """train_in_process(*overrides, run_dir=...) -> summary, as `python -m ... train` would run them, in this process;
    its run folder `train_in_process.run_dir` unless given."""
    from {{ cookiecutter.package }}.core.distributed import setup
    from {{ cookiecutter.package }}.core.forensics import Forensics
    from {{ cookiecutter.package }}.train import train

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # torch has not looked yet: a CPU run whatever the machine
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    run_dir = tmp_path / "run"

    def run(*overrides: str, run_dir: Path = run_dir) -> Summary | None:
        with hydra_run("train", tiny(overrides, cache_dir, tiny_root), run_dir) as cfg:
            return train(cfg, run_dir, setup(1.0), Forensics(run_dir, cfg.distributed.stall_min,
                                                             cfg.distributed.stall_exit))

    run.run_dir = run_dir
    yield run
    for number, handler in handlers.items():  # train() installs its own, for preemption
        signal.signal(number, handler)


@pytest.fixture
def compose_tiny_tune(cache_dir, tiny_root):
    """compose(overrides) -> tune's shrunk config with those overrides on top."""

    def composed(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("tune", tiny(overrides, cache_dir, tiny_root))

    return composed


def cli_command(run_dir: Path, overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path,
                launcher: tuple[str, ...] = (sys.executable,)) -> list[str]:
    """`python -m PACKAGE.train` (or `launcher` ... -m PACKAGE.train) on tiny data, writing into `run_dir`."""
    return [*launcher, "-m", f"{PACKAGE}.train", f"hydra.run.dir={run_dir}", *tiny(overrides, cache_dir, tiny_root)]


@pytest.fixture
def train_cli(cache_dir, tiny_root, packs):
    """train_cli(run_dir, *overrides) runs `python -m PACKAGE.train` as a user would, on tiny data."""

    def run(run_dir: Path, *overrides: str, check: bool = True, launcher: tuple[str, ...] = (sys.executable,),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        command = cli_command(run_dir, overrides, cache_dir, tiny_root, launcher)
        result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=600,
                                env={**os.environ, **QUIET, **(env or {})})
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
        return result

    return run


def error_line(stderr: str) -> str:
    """The last line a failed command printed, which must be its one line: no traceback anywhere before it."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[-1]


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


LONGER = ("data.train_per_class=40", "train.epochs=3")

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
    "data.start_crop_size above data.crop_size": ["data.start_crop_size=64"],
    "data.crop_ramp_epochs not a pair": ["data.start_crop_size=16", "data.crop_ramp_epochs=3"],
    "data.start_crop_size without a ramp": ["data.start_crop_size=16"],
    "data.train_crop_size=abc": ["data.train_crop_size=abc"],
    "data.start_crop_size above data.train_crop_size": ["data.train_crop_size=16", "data.start_crop_size=24"],
    "augment.magnitude beyond its bins": ["augment=rand_augment", "augment.magnitude=31"],
    "train.top1_levels above 100": ["train.top1_levels=[50,150]"],
    "model.compile_mode=fastest": ["model.compile=true", "model.compile_mode=fastest"],
    "model.compile_mode without model.compile": ["model.compile_mode=reduce-overhead"],
    "CUDA graphs with train.accumulate": ["model.compile=true", "model.compile_mode=reduce-overhead",
                                          "train.accumulate=2"],
    "CUDA graphs with progressive resizing": ["model.compile=true", "data.start_crop_size=16",
                                              "data.crop_ramp_epochs=[0,2]", "train.epochs=3",
                                              "model.compile_mode=reduce-overhead"],
}
  # 120 images: 30 steps per epoch for one process


def start_cli(run_dir: Path, overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path,
              launcher: tuple[str, ...] = (sys.executable,), env: dict[str, str] | None = None) -> subprocess.Popen:
    """The training command line in the background, as train_cli would run it."""
    command = cli_command(run_dir, overrides, cache_dir, tiny_root, launcher)
    return subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **QUIET, **(env or {})})


def stop(process: subprocess.Popen) -> str:
    """Kill `process` and every process it started; its stderr, where it was piped."""
    import psutil

    if process.poll() is None:
        for child in psutil.Process(process.pid).children(recursive=True):
            child.kill()
        process.kill()
    return process.communicate()[1] or ""


def wait_for(condition, *processes: subprocess.Popen, timeout: float = 300) -> None:
    """Return once `condition()` holds; fail, stopping `processes`, if one of them ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [process.returncode for process in processes if process.poll() is not None]
        if ended or time.monotonic() > deadline:
            stderr = "".join(stop(process) for process in processes)
            reason = f"ended with {ended} before the condition held" if ended else f"timed out after {timeout} s"
            raise AssertionError(f"{reason}\n{stderr[-4000:]}")
        time.sleep(0.2)


def logged_windows(run_dir: Path) -> list[dict]:
    """The logging windows logger=jsonl has written so far, each with every scalar logged at its step: the rank
    spread is a line of its own after the window's (the setup time is no window, nor the top-1 by wall time, whose
    step is the run's second)."""
    path = run_dir / "scalars.jsonl"
    windows = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if not {"time/setup_s", "val/top1_by_second"} & (scalars := json.loads(line)).keys():
            windows.setdefault(scalars["step"], {}).update(scalars)
    return list(windows.values())


def stop_one_rank(job: subprocess.Popen, run_dir: Path, rank: str, timeout: float = 600):
    """Once a torchrun `job` (logger=jsonl) has logged its first window, SIGTERM its process of `rank` alone: every
    process stops at the next window's end, and rank 0 saves the step. The log's line that says where it stopped,
    with the step and the images of the epoch as its groups."""
    import psutil
    import re
    import signal

    wait_for(lambda: logged_windows(run_dir), job, timeout=timeout)
    processes = {process.environ()["RANK"]: process for process in psutil.Process(job.pid).children()}
    processes[rank].send_signal(signal.SIGTERM)
    stderr = finish(job, timeout=300)
    assert job.returncode == 0, stderr[-4000:]
    log = (run_dir / "train.log").read_text()
    stopped = re.search(r"stopped by a signal to another rank at step (\d+) \(epoch 0, (\d+) images into it\)", log)
    assert stopped, log[-3000:]
    return stopped


def stopped_after_first_checkpoint(run_dir: Path, overrides: tuple[str, ...], cache_dir: Path, tiny_root: Path) -> str:
    """Train in the background, SIGTERM it once last.pt exists, and check it stopped cleanly; its stderr."""
    import signal

    process = start_cli(run_dir, overrides, cache_dir, tiny_root, env=QUIET)
    wait_for(lambda: (run_dir / "last.pt").exists(), process)
    process.send_signal(signal.SIGTERM)
    stderr = finish(process, timeout=120)
    assert process.returncode == 0, stderr[-2000:]
    return stderr


TRAINING_IMAGES_SCRIPT = """
import atexit, json, os, sys, zlib
import torch
from hydra import compose, initialize_config_dir
from {{ cookiecutter.package }}.contracts import Decoder
from {{ cookiecutter.package }}.core.distributed import setup
from {{ cookiecutter.package }}.core.failures import end_workers
from {{ cookiecutter.package }}.data.decoder import CpuDecoder
from {{ cookiecutter.package }}.data.loaders import make_loaders

atexit.register(end_workers)  # before multiprocessing's, which would wait for workers that ignore its SIGTERM
CpuDecoder.collate = Decoder.collate  # the batches hold CRC-32s, collated as torch does: no crops to resize
world = setup(1.0)
conf, out = sys.argv[1], sys.argv[2]
with initialize_config_dir(config_dir=conf, version_base="1.3"):
    cfg = compose("train", sys.argv[3:])
loaders = make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                       batch_size=cfg.train.batch_size, seed=cfg.seed, world=world, memory_format=torch.contiguous_format)
loaders.splits.train.transform = lambda payload: torch.tensor(zlib.crc32(payload))  # which image, not its pixels
"""


def training_images_script(path: Path, body: str) -> Path:
    """A script, `python path CONF OUT OVERRIDES...` (or under torchrun), that builds training's loaders whose
    batches hold each image's CRC-32 instead of its pixels, then runs `body` (world, loaders, out in scope)."""
    path.write_text(TRAINING_IMAGES_SCRIPT + body)
    return path


def finish(process: subprocess.Popen, timeout: float) -> str:
    """The stderr of `process` once it ends. Past `timeout`, it and every process it started are killed."""
    try:
        return process.communicate(timeout=timeout)[1] or ""
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{process.args} did not end in {timeout} s:\n{stop(process)[-6000:]}") from None


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(megabytes): a folder on a tmpfs of that size, or None where mounting one is not allowed (then
    `small_disk.refused` says why)."""
    mounts = []

    def mount(megabytes: int) -> Path | None:
        folder = tmp_path / f"disk{len(mounts)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode:
            mount.refused = f"mounting a tmpfs was refused: {done.stderr.strip()}"
            return None
        mounts.append(folder)
        return folder

    yield mount
    for folder in mounts:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def read_only_folder(small_disk, tmp_path) -> Path:
    """A folder no write reaches: a tmpfs remounted read-only where mounting is allowed, else a folder without
    write permission (which stops every user but root). Its size leaves room for what a free-space check asks."""
    disk = small_disk(64)
    if disk is not None and not subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True).returncode:
        return disk
    if os.geteuid() == 0:
        pytest.skip(f"root writes past permissions, and {getattr(small_disk, 'refused', 'remounting read-only failed')}")
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    return folder


def fill(disk: Path, leave_bytes: int = 0) -> None:
    """Take the free space of `disk` but `leave_bytes` with a file of its own, as another program filling it would."""
    descriptor = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while (free := shutil.disk_usage(disk).free) > leave_bytes:
            os.write(descriptor, bytes(min(2**20, free - leave_bytes)))
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
    finally:
        os.close(descriptor)
