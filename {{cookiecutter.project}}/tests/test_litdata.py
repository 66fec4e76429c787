"""format=litdata: LitData shards the stream across processes and workers, resumes exactly, reads from S3."""
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import ALONE, World
from {{ cookiecutter.package }}.data.format import litdata
from {{ cookiecutter.package }}.data.images import make_splits
from {{ cookiecutter.package }}.data.fit import check_fit
from {{ cookiecutter.package }}.data.loaders import make_loaders, training_loader
from {{ cookiecutter.package }}.data.staging import no_staging

from helpers.machines import DEVICE, TWO_PROCESSES, installed, on_this_machine
from helpers.paths import CONF, PACKAGE, PROJECT
from helpers.processes import QUIET, finish, start_cli, stopped_after_first_checkpoint, training_images_script
from helpers.runs import summary, tiny

pytest.importorskip("litdata", reason="pip install -e '.[litdata]'")

LITDATA = ("format=litdata",)
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")


def test_staging_is_refused_and_points_to_the_cache(cache_dir, tiny_root, packs):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", tiny((*LITDATA, "staging=tmpfs"), cache_dir, tiny_root))
    with pytest.raises(ConfigError, match="staging=tmpfs has nothing to copy: .* format.cache_dir at a tmpfs"):
        check_fit(cfg.format, cfg.staging, cfg.decoder, cfg.order)


def test_a_missing_index_is_refused_at_start(packs, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(packs["litdata"], copy)
    (copy / "val/index.json").unlink()
    with pytest.raises(ConfigError, match="val has no index.json: the pack is damaged"):
        litdata.checked_meta(str(copy), None)


def test_each_image_lies_between_its_chunks_offsets_whatever_is_installed(packs, tmp_path):
    """Where pyarrow is installed, LitData's writer puts a dict of plain values in an Arrow table after the offsets,
    and its reader finds no bytes there from S3: pack writes tuples, which it keeps between the offsets."""
    folder = packs["litdata"] / "train"
    chunk = json.loads((folder / "index.json").read_text())["chunks"][0]
    data = (folder / chunk["filename"]).read_bytes()
    offsets = np.frombuffer(data, np.uint32, chunk["chunk_size"] + 1, offset=4)
    store = litdata.streamed(str(packs["litdata"]), str(tmp_path), 1.0, None).train
    assert all(store.payload(index) in data[offsets[index]:offsets[index + 1]] for index in range(len(offsets) - 1))


def first_val_batch(cfg) -> torch.Tensor:
    loaders = make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                           batch_size=cfg.train.batch_size, seed=cfg.seed, world=World(0, 0, 1, DEVICE),
                           memory_format=torch.contiguous_format)
    return next(iter(loaders.val))[0]


@pytest.mark.parametrize("name", installed("decoder", [name for name in options.options("decoder") if name != "none"]))
def test_every_decoder_reads_the_stream_as_it_reads_lmdb(name, compose_tiny):
    """The same bytes, decoder and centre crops: the same pixels, whichever format held them."""
    here = on_this_machine(f"decoder={name}")
    streamed = first_val_batch(compose_tiny(*LITDATA, f"decoder={name}", *here))
    assert torch.equal(streamed, first_val_batch(compose_tiny("format=lmdb", f"decoder={name}", *here)))


def test_a_dropped_loader_ends_its_persistent_workers_at_once_in_the_process_that_started_them(compose_tiny):
    """With the garbage collector off, as it is until it happens to run: a loader left in a reference cycle would
    keep its workers until a collection, perhaps in a worker forked for the next loader, which cannot end them
    ("Exception ignored ... can only test a child process" on bench's stderr)."""
    import gc
    import multiprocessing

    cfg = compose_tiny(*LITDATA)
    source = build(cfg.data)
    stores = build(cfg.format).stores(source, no_staging)
    splits = make_splits(source, stores, build(cfg.decoder))
    gc.collect()
    gc.disable()
    before = multiprocessing.active_children()  # earlier tests' workers, where they are still alive
    try:  # the loader as bench builds one per row
        loader = training_loader(stores, splits.train, 4, 0, ALONE, splits.decoder.collate, num_workers=1,
                                 prefetch_factor=2, pin_memory=False, persistent_workers=True)
        assert len([batch for batch in loader]) > 0
        workers = [process for process in multiprocessing.active_children() if process not in before]
        assert len(workers) == 1, "its persistent worker, between epochs"
        del loader
        assert not workers[0].is_alive()
    finally:
        gc.enable()


EPOCHS_SEEN = """
seen = dict()
for epoch in (0, 1):
    loaders.train.set_epoch(epoch)
    seen[epoch] = [int(crc) for batch, _ in loaders.train.loader for crc in batch]
with open(os.path.join(out, "rank%d.json" % world.rank), "w") as file:
    json.dump(seen, file)
end_workers()  # as training does: persistent workers ignore the SIGTERM exit would send them
"""


@pytest.mark.full
def test_two_processes_and_their_workers_see_every_image_once_per_epoch(tmp_path, cache_dir, tiny_root, packs):
    script = training_images_script(tmp_path / "shards.py", EPOCHS_SEEN)
    overrides = tiny((*LITDATA, "loader.num_workers=2", "train.batch_size=3"), cache_dir, tiny_root)
    result = subprocess.run([*TORCHRUN, str(script), str(CONF), str(tmp_path), *overrides], cwd=PROJECT,
                            capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET, **TWO_PROCESSES})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    every_image = sorted(zlib.crc32(path.read_bytes()) for path in sorted((tiny_root / "train").rglob("*.JPEG")))
    for epoch in ("0", "1"):
        assert len(ranks[0][epoch]) == len(ranks[1][epoch]) == 12  # 24 images, 2 processes, 2 workers, batch 3
        assert sorted(ranks[0][epoch] + ranks[1][epoch]) == every_image
    assert ranks[0]["0"] != ranks[0]["1"], "reshuffled each epoch"


@pytest.mark.full
def test_two_processes_train_and_validate_as_one_process_would(tmp_path, cache_dir, tiny_root, packs):
    run_dir = tmp_path / "two"
    process = start_cli(run_dir, (*LITDATA, "train.epochs=2"), cache_dir, tiny_root, launcher=TORCHRUN,
                        env=TWO_PROCESSES)
    stderr = finish(process, timeout=400)
    assert process.returncode == 0, stderr[-3000:]
    two = summary(run_dir)
    assert two.processes == 2 and two.steps == 2 * 3  # 24 images, batch 4 per process
    one_dir = tmp_path / "one"  # the same weights, evaluated by a single process: nothing is left to train
    process = start_cli(one_dir, (*LITDATA, "train.epochs=2", f"resume={run_dir / 'last.pt'}"), cache_dir,
                        tiny_root, env=QUIET)
    stderr = finish(process, timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    one = summary(one_dir)
    assert one.processes == 1 and (one.val_top1, one.val_top5) == (two.val_top1, two.val_top5)


EXACT = (*LITDATA, "train.epochs=8", "train.batch_size=2", "cudnn=deterministic", "loader.num_workers=2",
         "train.log_every=1")  # 12 steps an epoch, 96 in all


def position(run_dir) -> tuple[int, int]:
    """(images of the epoch trained, the samples LitData's saved state says it yielded) in last.pt."""
    state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
    return state["progress"]["images_in_epoch"], state["loader"]["num_samples_yielded"]


@pytest.mark.full
def test_resume_mid_epoch_reads_on_as_the_uninterrupted_run(tmp_path, cache_dir, tiny_root, packs, train_cli):
    """SIGTERM, then a loader worker that fails: each resume reads LitData's stream on from the next batch, so
    the weights end bit for bit as an uninterrupted run's."""
    train_cli(tmp_path / "straight", *EXACT)
    run_dir = tmp_path / "interrupted"
    stopped_after_first_checkpoint(run_dir, EXACT, cache_dir, tiny_root)
    stops = [position(run_dir)]

    failed = train_cli(run_dir, *EXACT, "resume=auto", "faults.worker_error_at=39", check=False)
    assert failed.returncode == 1 and "faults.worker_error_at=39" in failed.stderr.strip().splitlines()[-1]
    stops.append(position(run_dir))
    assert all(samples == images for images, samples in stops), stops  # the trained place, not the read-ahead
    assert any(0 < images < 24 for images, _ in stops), f"neither stop came mid-epoch: {stops}"

    train_cli(run_dir, *EXACT, "resume=auto")
    expected = torch.load(tmp_path / "straight/last.pt", map_location="cpu", weights_only=False)["model"]
    resumed = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)["model"]
    assert summary(run_dir).steps == summary(tmp_path / "straight").steps == 96
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)


@pytest.mark.full
def test_a_run_cut_short_on_two_processes_finishes_its_plan_on_one(tmp_path, cache_dir, tiny_root, packs, train_cli):
    """LitData restripes the rest of the cut epoch over the one process, and the loop goes on to the next
    epoch when the stream runs out, not when its own count of the epoch's batches says so."""
    run_dir = tmp_path / "run"
    plan = (*LITDATA, "train.epochs=8", "train.batch_size=2", "loader.num_workers=2")  # 24 images an epoch
    train_cli(run_dir, *plan, "train.max_steps=9", launcher=TORCHRUN, env=TWO_PROCESSES)  # 6 steps an epoch
    state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
    assert (state["progress"]["epoch"], state["progress"]["step"], state["progress"]["images_in_epoch"]) == (1, 9, 12)
    train_cli(run_dir, *plan, "resume=auto", "loader.num_workers=1")
    assert summary(run_dir).steps == 9 + 12 // 2 + 6 * 24 // 2  # the rest of epoch 1, then 6 more of 12 steps
    assert ("format=litdata resumes on another layout (processes=1, loader workers=1; its stream was saved with "
            "processes=2, loader workers=2): LitData restripes") in (run_dir / "train.log").read_text()


@pytest.mark.full
def test_pack_to_s3_then_train_from_it(s3_server, tmp_path, cache_dir, tiny_root, packs):
    import boto3

    endpoint = f"format.endpoint_url={s3_server}"
    packed = subprocess.run([sys.executable, "-m", f"{PACKAGE}.pack", f"data.root={tiny_root}", "format=litdata",
                             "pack.out=s3://images/tiny", "pack.chunk_mb=0.05", endpoint,
                             f"hydra.run.dir={tmp_path / 'pack'}"],
                            cwd=PROJECT, capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert packed.returncode == 0, packed.stderr[-3000:]
    keys = [item["Key"] for item in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket="images")["Contents"]]
    assert {"tiny/pack.json", "tiny/train/index.json", "tiny/val/index.json"} <= set(keys)
    assert sum(key.endswith(".bin") for key in keys) > 2

    run_dir = tmp_path / "run"
    on_s3 = (*LITDATA, "format.path=s3://images/tiny", endpoint)  # after tiny()'s local format.path, so it wins
    process = start_cli(run_dir, (*on_s3, "train.max_steps=2", f"format.cache_dir={tmp_path / 'node-cache'}"),
                        cache_dir, tiny_root, launcher=TORCHRUN, env={**QUIET, **TWO_PROCESSES})
    stderr = finish(process, timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "is plain HTTP: allowed for LitData's S3 client" in log
    assert summary(run_dir).steps == 2 and summary(run_dir).processes == 2
    assert any((tmp_path / "node-cache").rglob("*.bin")), "chunks were cached"
    assert "testing" not in log and "testing" not in (run_dir / ".hydra/config.yaml").read_text(), "no secret kept"

    s3 = boto3.client("s3", endpoint_url=s3_server)
    first = json.loads(s3.get_object(Bucket="images", Key="tiny/train/index.json")["Body"].read())["chunks"][0]
    key = f"tiny/train/{first['filename']}"
    chunk = bytearray(s3.get_object(Bucket="images", Key=key)["Body"].read())
    header = 4 * (first["chunk_size"] + 2)
    chunk[4:header] = np.full(first["chunk_size"] + 1, header, np.uint32).tobytes()  # the Arrow layout's offsets
    s3.put_object(Bucket="images", Key=key, Body=bytes(chunk))
    arrow = start_cli(tmp_path / "arrow", on_s3, cache_dir, tiny_root, env=QUIET)
    assert f"s3://images/{key} holds its images in LitData's Arrow layout" in finish(arrow, timeout=120).strip().splitlines()[-1]

    s3.delete_object(Bucket="images", Key="tiny/pack.json")
    refused = start_cli(tmp_path / "refused", on_s3, cache_dir, tiny_root, env=QUIET)
    assert "s3://images/tiny has no pack.json" in finish(refused, timeout=120).strip().splitlines()[-1]
