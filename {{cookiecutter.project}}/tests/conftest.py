"""The real config, composed once and shrunk: CPU, a tiny synthetic data set, a few steps, output under tmp_path.
The fixtures live here; what the tests share besides them is in helpers/."""
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

# What the project keeps for later runs (worker counts, file indexes) goes to a folder of the pytest session's own,
# not the user's cache: set before the package is imported, and inherited by every command line the tests run.
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
from {{ cookiecutter.package }}.core.failures import STOP_SIGNALS, end_workers  # noqa: E402
from {{ cookiecutter.package }}.diagnosis.summary import Summary  # noqa: E402

from helpers.images import encoded, photo  # noqa: E402 - helpers import the package too
from helpers.machines import CUDA  # noqa: E402
from helpers.nodes import Nodes  # noqa: E402
from helpers.packs import TENSOR_SHORT_SIDE  # noqa: E402
from helpers.paths import CONF, PROJECT  # noqa: E402
from helpers.processes import QUIET, cli_command  # noqa: E402
from helpers.runs import hydra_run, tiny  # noqa: E402

# A failing test's traceback can keep a loader's persistent workers alive to the end of the pytest session; they ignore
# the SIGTERM multiprocessing sends them at exit, which would then wait for them forever. Registered after
# multiprocessing's own exit handler, this runs first.
atexit.register(end_workers)


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
    """Where data=synthetic writes its files; shared by the pytest session so they are made once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_root(cache_dir) -> Path:
    """A tiny ImageNet-style tree (3 classes), for data=folder."""
    from {{ cookiecutter.package }}.data.synth import write_dataset

    return write_dataset(cache_dir / "tiny-tree", num_classes=3, train_per_class=8, val_per_class=4, workers=2)


@pytest.fixture(scope="session")
def packs(cache_dir, tiny_root) -> dict[str, Path]:
    """The tiny tree packed into every packed format, once per pytest session."""
    from {{ cookiecutter.package }}.tools.pack import pack

    packed = {}
    for path in sorted((CONF / "format").glob("*.yaml")):
        if options.facts("format", path.stem).packed and not options.facts("format", path.stem).missing():
            packed[path.stem] = cache_dir / f"packed-{path.stem}"
            pack(tiny_root, path.stem, packed[path.stem], TENSOR_SHORT_SIDE if path.stem == "tensor" else None,
                 90, 2, False, "raise", chunk_mb=0.05)  # litdata: several chunks per split
    return packed


@pytest.fixture
def compose_tiny(cache_dir, tiny_root, packs):
    """compose(overrides) -> the shrunk training config with those overrides on top."""

    def composed(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("train", tiny(overrides, cache_dir, tiny_root))

    return composed


@pytest.fixture
def kept_signal_handlers():
    """The stop signals' handlers put back as they were after the test: a run installs its own, for preemption."""
    kept = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    yield
    for number, handler in kept.items():
        signal.signal(number, handler)


@pytest.fixture
def train_in_process(cache_dir, tiny_root, packs, tmp_path, monkeypatch, kept_signal_handlers):
    """train_in_process(*overrides, run_dir=...) -> summary, as `python -m ... train` would run them, in this process;
    its run folder `train_in_process.run_dir` unless given."""
    from {{ cookiecutter.package }}.core.distributed import setup
    from {{ cookiecutter.package }}.core.forensics import Forensics
    from {{ cookiecutter.package }}.train import train

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # torch has not looked yet: a CPU run whatever the machine
    run_dir = tmp_path / "run"

    def run(*overrides: str, run_dir: Path = run_dir) -> Summary | None:
        with hydra_run("train", tiny(overrides, cache_dir, tiny_root), run_dir) as cfg:
            return train(cfg, run_dir, setup(1.0), Forensics(run_dir, cfg.distributed.stall_min,
                                                             cfg.distributed.stall_exit))

    run.run_dir = run_dir
    return run


@pytest.fixture
def compose_tiny_tune(cache_dir, tiny_root):
    """compose(overrides) -> tune's shrunk config with those overrides on top."""

    def composed(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("tune", tiny(overrides, cache_dir, tiny_root))

    return composed


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


@pytest.fixture
def read_only_view(tmp_path):
    """read_only_view(folder): `folder` with what it holds, seen through a bind mount remounted read-only, which
    refuses writes even to root, as a share served read-only does; the test skips where it cannot be made."""
    mounts = []

    def view(folder: Path) -> Path:
        if shutil.which("mount") is None:
            pytest.skip("no mount command here to make a read-only bind mount")
        mounted = tmp_path / f"read-only-view{len(mounts)}"
        mounted.mkdir()
        done = subprocess.run(["mount", "--bind", str(folder), str(mounted)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"a bind mount was refused: {done.stderr.strip()}")
        mounts.append(mounted)
        done = subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"remounting a bind mount read-only was refused: {done.stderr.strip()}")
        try:
            (mounted / "written").touch()
        except OSError:
            return mounted
        pytest.skip(f"{mounted} took a write after it was remounted read-only")

    yield view
    for folder in mounts:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def s3_server(monkeypatch):
    """A real S3 endpoint on 127.0.0.1 (moto's server), with a bucket; AWS_* set for the processes started."""
    server_module = pytest.importorskip("moto.server", reason="pip install 'moto[server]'")
    import boto3

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="images")
    yield url
    server.stop()


@pytest.fixture
def nodes():
    """Two nodes on this machine (helpers/nodes.py)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("two nodes need root, ip (iproute2) and unshare (util-linux) to make network namespaces")
    made = Nodes()
    yield made
    made.close()
