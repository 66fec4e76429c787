"""Each epoch's coverage check: the digests, the line that stops a run whose processes' shares overlap, and a real
job of two processes stopped part-way and resumed, with and without a process whose order drifted."""
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from {{ cookiecutter.package }}.contracts import Layout
from {{ cookiecutter.package }}.data.coverage import Coverage, CoverageMismatch, Digest
from {{ cookiecutter.package }}.data.order import RandomOrder

from helpers.machines import TWO_PROCESSES
from helpers.packs import packed_tree
from helpers.paths import PACKAGE, PROJECT
from helpers.processes import QUIET, stop_one_rank
from helpers.runs import summary
from helpers.epochs import WIDE, Reads, agreed, read_epoch, records, stopped_and_resumed, trained_by_all


def test_a_digest_is_the_same_in_any_order_and_adds_up_as_the_sets_do():
    rng = np.random.default_rng(0)
    indices = rng.permutation(10_000)
    assert Digest.of(indices) == Digest.of(np.sort(indices)) == Digest.of(indices[:3000]) + Digest.of(indices[3000:])
    assert Digest.of(indices).count == 10_000
    swapped = indices.copy()
    swapped[0] = 10_000  # one image missed, another trained in its place
    doubled = np.append(indices[1:], indices[1])  # one missed, one twice: the count alone would not tell
    assert len({Digest.of(indices), Digest.of(swapped), Digest.of(doubled)}) == 3
    assert all(value < 2**48 for value in (Digest.of(indices).first, Digest.of(indices).second))  # exact as float64


def test_a_process_that_drew_its_order_for_another_layout_fails_its_resumed_epochs_check():
    """faults.unagreed_workers: rank 1 draws the order as if every process ran its 3 workers. Its share of the epoch
    is the same set of images, in another order within it, so the epoch adds up; stopped part-way and resumed from
    the checkpoint's layout (rank 0's), the resumed run skips what rank 1 did not train, and the check says so.
    Windows of 32 images: rank 0's lanes take 8 rows of random keys under one layout and 9 under the other, so rank 1
    draws its windows' orders from other keys."""
    size, batch, workers = 500, 4, [2, 3]
    layout, drifted = agreed(size, workers, batch, WIDE), Layout(2, 3, batch)
    whole = [read_epoch(size, layout, WIDE, workers).traces[0], read_epoch(size, drifted, WIDE, [3, 3]).traces[1]]
    every = Coverage(size).check([trace.record(size) for trace in whole], whole[0], counts=None)
    assert every["trained"] == 496 and every["left_out"] == 4

    stopped = Reads(Counter(), {}, [read_epoch(size, layout, WIDE, workers, stop_after=20).traces[0],
                                    read_epoch(size, drifted, WIDE, [3, 3], stop_after=20).traces[1]])
    stopped.trained.update(int(index) for trace in stopped.traces for index in np.concatenate(trace.taken))
    coverage = stopped_and_resumed(Coverage(size), stopped)
    resumed = read_epoch(size, layout, WIDE, workers, skip=160, began=layout)
    counts = sum(trace.counts(size) for trace in resumed.traces)
    with pytest.raises(CoverageMismatch) as refused:
        coverage.check(records(resumed, trained_by_all(resumed)), resumed.traces[0], counts=lambda: counts)
    assert str(refused.value).startswith(
        "epoch 3 did not train every image once: the images trained before the resume are not those the resumed "
        "order left out (336 trained by 2 processes with 2, 3 loader workers by rank, 4 left out, 160 trained before "
        "the resume)")


def test_an_epoch_whose_processes_overlap_is_refused_with_the_images_missed_and_doubled():
    """Rank 1 drawing another seed's order: half its images are rank 0's too."""
    size, batch = 200, 5
    traces = [read_epoch(size, Layout(2, 1, batch), RandomOrder(), [1, 1], seed=seed).traces[rank]
              for rank, seed in ((0, 0), (1, 7))]
    counts = sum(trace.counts(size) for trace in traces)
    missed, doubled = int((counts == 0).sum()), int((counts > 1).sum())
    with pytest.raises(CoverageMismatch, match=rf"^epoch 3 did not train every image once: of 200 images, {missed} "
                                               rf"were missed and {doubled} read more than once \(200 trained"):
        Coverage(size).check([trace.record(size) for trace in traces], traces[0], counts=lambda: counts)
    assert missed == doubled > 20




def blocks_job(run_dir, pack, tree, *overrides: str, format: tuple[str, ...] = ("format=hdf5",)) -> list[str]:
    """Two processes of torchrun on the CPU training on `pack` (in `format`) in blocks, 10 steps an epoch each,
    slowed by 0.3 s a step so that a stop lands part-way through an epoch."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
            f"{PACKAGE}.train", f"hydra.run.dir={run_dir}", "debug=tiny", "data=folder", f"data.root={tree}",
            *format, f"format.path={pack}", "order=blocks", "order.block=4", "order.window=2",
            "loader.num_workers=2", "train.epochs=2", "logger=jsonl", "faults.host_delay_ms=300", *overrides]


@pytest.fixture(scope="module")
def blocks_pack(tmp_path_factory):
    """80 training images in an HDF5 pack: 40 per process, 10 batches of 4."""
    return packed_tree(tmp_path_factory.mktemp("blocks"), num_classes=2, train_per_class=40)


def stopped_part_way(run_dir, command) -> None:
    """Start the job, and once its first window is logged, SIGTERM one of its processes: all stop at the next window's
    end, part-way through epoch 0, with a checkpoint."""
    job = subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, **QUIET, **TWO_PROCESSES})
    stop_one_rank(job, run_dir, "1")


def assert_every_image_trained_once_across_the_stop(run_dir) -> None:
    """Both epochs of 80 images checked, the first stopped part-way by 2 processes of 2 workers and resumed."""
    epochs = summary(run_dir).coverage
    assert [(entry["epoch"], entry["checked"], entry["images"], entry["left_out"]) for entry in epochs] == [
        (0, True, 80, 0), (1, True, 80, 0)]
    assert 0 < epochs[0]["trained_before_resume"] < 80 and epochs[1]["trained_before_resume"] == 0
    assert epochs[0]["trained"] + epochs[0]["trained_before_resume"] == 80 and epochs[0]["workers"] == [2, 2]


@pytest.mark.full
@pytest.mark.parametrize("drifted", [False, True], ids=["agreed", "rank 1 drifted"])
def test_a_stopped_and_resumed_epoch_is_checked_against_what_was_trained_before_the_stop(drifted, tmp_path,
                                                                                          blocks_pack):
    """Rank 1 drawing its order for 3 workers of every process (faults.unagreed_workers, as each process did before
    they agreed) trains its share of epoch 0 in another order: the resumed run skips what it did not train, and the
    epoch's check stops the run in one line. Agreed, the same stop and resume ends with both epochs checked."""
    run_dir, (pack, tree) = tmp_path / "run", blocks_pack
    fault = ("faults.rank=1", "faults.unagreed_workers=3") if drifted else ()
    stopped_part_way(run_dir, blocks_job(run_dir, pack, tree, *fault))
    resumed = subprocess.run(blocks_job(run_dir, pack, tree, *fault, "resume=auto"), cwd=PROJECT, capture_output=True,
                             text=True, timeout=300, env={**os.environ, **QUIET, **TWO_PROCESSES})
    if drifted:
        assert resumed.returncode != 0
        line = (r"^error: epoch 0 did not train every image once: the images trained before the resume are not those "
                r"the resumed order left out \(\d+ trained by 2 processes with 2, 3 loader workers by rank, 0 left out, "
                r"\d+ trained before the resume\)")
        refused = re.search(line, resumed.stderr, re.MULTILINE)
        assert refused, resumed.stderr[-3000:]
        return
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_every_image_trained_once_across_the_stop(run_dir)


@pytest.mark.full
def test_shards_on_s3_stopped_and_resumed_on_two_processes_train_every_image_once_an_epoch(tmp_path, blocks_pack,
                                                                                           s3_server):
    """format=webdataset packed to S3 and read back by range, 2 processes x 2 workers: the stop and the resume
    of the agreed run above, from a bucket."""
    import boto3

    from {{ cookiecutter.package }}.tools.pack import pack

    run_dir, (_, tree) = tmp_path / "run", blocks_pack
    pack(tree, "webdataset", "s3://images/blocks", None, 90, 2, False, "raise", endpoint_url=s3_server)
    keys = [item["Key"] for item in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket="images", Prefix="blocks/")["Contents"]]
    assert "blocks/pack.json" in keys and not [key for key in keys if key.endswith(".npz")], keys  # no local index
    on_s3 = ("format=webdataset", f"format.endpoint_url={s3_server}", f"format.cache_dir={tmp_path / 'cache'}")
    stopped_part_way(run_dir, blocks_job(run_dir, "s3://images/blocks", tree, format=on_s3))
    resumed = subprocess.run(blocks_job(run_dir, "s3://images/blocks", tree, "resume=auto", format=on_s3),
                             cwd=PROJECT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, **QUIET, **TWO_PROCESSES})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_every_image_trained_once_across_the_stop(run_dir)
    assert "testing" not in (run_dir / "train.log").read_text(), "no secret kept"
