"""The loader benchmark: one row per configuration plus the ceiling and baseline references, a CSV and a chart."""
import csv
import errno
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core import failures
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.packages import not_installed
from {{ cookiecutter.package }}.data.format import META
from {{ cookiecutter.package }}.data.format.folder import open_tree
from {{ cookiecutter.package }}.data.sources import Source
from {{ cookiecutter.package }}.tools.bench import storage_probe
from {{ cookiecutter.package }}.tools.bench import bench, stores_for, timed_decoders
from {{ cookiecutter.package }}.tools.bench.report import best_line, chart, table
from {{ cookiecutter.package }}.tools.pack import pack_path, tree_key
from {{ cookiecutter.package }}.tools.bench.storage_probe import training_decoder
from {{ cookiecutter.package }}.tools.tune.outputs import chart as tune_chart

from helpers.machines import CUDA
from helpers.packs import TENSOR_SHORT_SIDE
from helpers.paths import PACKAGE, PROJECT
from helpers.processes import QUIET, error_line
from helpers.runs import hydra_run

FASTEST = options.fastest_cpu_decoder()  # of those installed here
CPU_DECODERS = list(dict.fromkeys(["pil", "opencv", FASTEST]))
PACKED = next((name for name in options.having("format", "packed") if not options.facts("format", name).missing()),
              None)

FULL = pytest.mark.full  # subprocesses, torchrun or the clock: make test-full


@FULL
def test_bench_writes_a_row_per_configuration_and_both_references(tiny_root, tmp_path):
    """Through the command line, so that it must also exit: litdata's loader keeps its workers, which ignore SIGTERM."""
    result = subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.bench", "data=folder", f"data.root={tiny_root}", "data.crop_size=32",
         "bench.formats=[folder,litdata,tensor]", "bench.orders=[random,blocks]", "bench.num_workers=[0,1]",
         "bench.batch_size=4",
         "bench.timed_epochs=1", f"bench.short_side={TENSOR_SHORT_SIDE}", f"bench.pack_dir={tmp_path / 'packs'}",
         f"hydra.run.dir={tmp_path}"], cwd=PROJECT, capture_output=True, text=True, timeout=300,
        env={**os.environ, **QUIET})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    with (tmp_path / "bench.csv").open() as file:
        written = list(csv.DictReader(file))
    probe = [row for row in written if row["decoder"] == "storage"]
    assert sorted((row["format"], row["num_workers"]) for row in probe) == [
        (format, "1") for format in ("folder", "litdata", "tensor")]  # 1 reader: 0 workers read in one process
    assert all(float(row["images_per_s"]) > 0 and float(row["sequential_mb_s"]) > 0 and row["limit"] in
               ("storage", "decode") and row["page_cache"].startswith(("cold", "warm")) for row in probe), probe
    written = [row for row in written if row["decoder"] != "storage"]
    decoders = [name for name in options.options("decoder") if name != "none"]  # bench.decoders=all
    for workers in ("0", "1"):
        rows_here = [(row["decoder"], row["format"]) for row in written if row["num_workers"] == workers]
        assert rows_here[:3] == [("ceiling", "memory"), ("baseline", "folder"), ("region ceiling", "memory")]
        assert rows_here[-2:] == [("none", "tensor")] * 2  # in either order: tensor's records sit end to end
        assert sorted(rows_here[3:-2]) == sorted((name, format) for name in decoders for format in ("folder", "litdata"))
    ordered = {(row["format"], row["order"]) for row in written if row["order"]}
    assert ordered == {("folder", "random"), ("litdata", "random"), ("tensor", "random"), ("tensor", "blocks")}
    for row in written:  # timed where this machine can run it; otherwise a row saying why, with no figures
        facts = options.facts("decoder", row["decoder"]) if row["decoder"] in decoders else options.Facts()
        timed = not facts.missing() and (CUDA or not facts.gpu or facts.bench_without_gpu)
        assert (row["images_per_s"] != "" and float(row["images_per_s"]) > 0) == timed, row
        if not timed:
            assert row["note"].startswith("not run: ") and (facts.missing() or facts.gpu) in row["note"], row
            assert row["vs_baseline"] == row["vs_ceiling"] == "", row
    baseline = [row for row in written if row["decoder"] == "baseline"]
    assert all(float(row["vs_baseline"]) == 1.0 for row in baseline)
    for row in (row for row in written if row["images_per_s"]):  # the ratios are those of the figures in the same file
        reference = next(b for b in baseline if b["num_workers"] == row["num_workers"])
        ratio = float(row["images_per_s"]) / float(reference["images_per_s"])
        assert abs(ratio - float(row["vs_baseline"])) < 0.02 * ratio + 0.01
    assert "warm" in written[0]["page_cache"]
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "baseline" in result.stdout + result.stderr and (tmp_path / "packs").is_dir()


@FULL
def test_a_staged_row_is_read_from_a_fresh_copy_in_ram_with_its_copy_seconds_and_leaves_none_behind(tiny_root, tmp_path):
    result = run_bench(tmp_path, tiny_root, "bench.formats=[folder,lmdb,litdata]", f"bench.decoders=[{FASTEST}]",
                       "bench.stagings=[none,tmpfs]", "bench.num_workers=[1]", "bench.probe_storage=false",
                       "bench.batch_size=4")
    assert result.returncode == 0, result.stderr[-3000:]
    with (tmp_path / "bench/bench.csv").open() as file:
        rows = {(row["format"], row["staging"]): row for row in csv.DictReader(file) if row["decoder"] == FASTEST}
    assert set(rows) == {(format, staging) for format in ("folder", "lmdb") for staging in ("none", "tmpfs")} | {
        ("litdata", "none")}  # it streams its chunks: no copy of them to read
    for format in ("folder", "lmdb"):
        staged, local = rows[format, "tmpfs"], rows[format, "none"]
        assert staged["staging_s"] != "" and "copied in" in staged["note"] and float(staged["images_per_s"]) > 0
        assert local["staging_s"] == "" and "copied" not in local["note"]
    assert not list(Path("/dev/shm").glob(f"{PACKAGE}-bench-*")), "the copies are removed at the end"


@FULL
def test_a_batch_larger_than_the_data_set_is_one_line(tiny_root, tmp_path):
    result = run_bench(tmp_path, tiny_root, "bench.num_workers=[0]", "bench.batch_size=64", "bench.probe_storage=false")
    assert result.returncode == 1
    assert error_line(result.stderr) == (f"error: bench.batch_size=64 is more than the 24 training images under "
                                         f"{tiny_root}: pass a smaller bench.batch_size"), result.stderr[-2000:]


@FULL
def test_bench_on_a_tree_of_ones_own_writes_its_packs_in_the_cache_without_being_told_where(tiny_root, tmp_path):
    """data=folder has no cache folder of its own: the packs go where tune's do."""
    result = subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.bench", "data=folder", f"data.root={tiny_root}", "data.crop_size=32",
         "bench.formats=[lmdb]", f"bench.decoders=[{FASTEST}]", "bench.num_workers=[0]", "bench.batch_size=4",
         "bench.timed_epochs=1", "bench.probe_storage=false", f"hydra.run.dir={tmp_path / 'bench'}"],
        cwd=PROJECT, capture_output=True, text=True, timeout=300,
        env={**os.environ, **QUIET, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert pack_path(tmp_path / "cache" / PACKAGE / "packs", tree_key(tiny_root), "lmdb", None).is_dir()


def run_bench(tmp_path, root, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"{PACKAGE}.bench", "data=folder", f"data.root={root}", "data.crop_size=32",
         "data.val_resize=36", "bench.formats=[folder]", f"bench.decoders=[{','.join(CPU_DECODERS)}]",
         "bench.timed_epochs=1", f"bench.pack_dir={tmp_path / 'packs'}", f"hydra.run.dir={tmp_path / 'bench'}", *overrides],
        cwd=PROJECT, capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET, **(env or {})})


@FULL
def test_bench_runs_each_row_at_the_count_auto_picks_for_it_beside_references_of_every_core(tiny_root, tmp_path):
    """bench.num_workers=[auto], with a cache of its own: each row is timed at the count the sweep picks, which tries
    no workers only for a decoder that decodes beside the training process, and says the count; the references
    count every core this process may use. A second bench takes every count from the cache, the rows read from a
    copy in RAM (a new folder each run) included."""
    decoders = [FASTEST, *(name for name in ["dali"] if not options.facts("decoder", name).missing())]
    runs = [run_bench(tmp_path, tiny_root, f"bench.decoders=[{','.join(decoders)}]", "bench.num_workers=[auto]",
                      "bench.stagings=[none,tmpfs]", "bench.batch_size=2", "bench.probe_storage=false",
                      env={"XDG_CACHE_HOME": str(tmp_path / "cache")}) for _ in range(2)]
    assert all(result.returncode == 0 for result in runs), runs[-1].stderr[-3000:]
    with (tmp_path / "bench/bench.csv").open() as file:
        rows = {(row["decoder"], row["staging"]): row for row in csv.DictReader(file)}
    cores = len(os.sched_getaffinity(0))
    ceiling, region, baseline = rows["ceiling", ""], rows["region ceiling", ""], rows["baseline", ""]
    assert ceiling["num_workers"] == region["num_workers"] == "auto" and baseline["num_workers"] == str(cores)
    assert f"x {cores} cores" in ceiling["note"] and {row["workers"] for row in rows.values()} == {"auto"}
    built, _ = timed_decoders(decoders, 2, torch.device("cpu"))
    logged = runs[0].stdout + runs[0].stderr
    sweeps = re.findall(r"bench.num_workers=auto: (.*) images/s by worker count; using (\d+)", logged)
    assert len(sweeps) == 2 * len(decoders), logged[-3000:]
    for (name, staging), (rates, chosen) in zip([(name, staging) for staging in ("none", "tmpfs") for name in decoders],
                                                sweeps):
        row, tried = rows[name, staging], [int(rate.split(":")[0]) for rate in rates.split(", ")]
        assert (0 in tried) == (built[name].queued_batches > 0), (name, tried)
        assert int(chosen) in tried and f"num_workers=auto: {chosen}" in row["note"]
        ratio = float(row["images_per_s"]) / float(ceiling["images_per_s"])
        assert abs(ratio - float(row["vs_ceiling"])) < 0.02 * ratio + 0.01
    again = runs[1].stdout + runs[1].stderr
    assert "by worker count" not in again and again.count("measured before, cached") == 2 * len(decoders), again[-3000:]
    assert len(json.loads((tmp_path / "cache" / PACKAGE / "num_workers.json").read_text())) == 2 * len(decoders)


@FULL
def test_worker_counts_that_are_not_a_list_of_counts_or_auto_are_one_line(tiny_root, tmp_path):
    for value, line in (("[two]", "bench.num_workers='two': pass a count (0 = load in the training process) or auto"),
                        ("auto", "bench.num_workers=auto: pass a list, such as [auto] or [2,4]")):
        result = run_bench(tmp_path, tiny_root, f"bench.num_workers={value}")
        assert result.returncode == 1
        assert error_line(result.stderr) == f"error: {line}", result.stderr[-2000:]


@FULL
def test_bench_skips_and_counts_unreadable_files_in_every_row_the_ceiling_included(tree_with_bad_files, tmp_path):
    """A zero-byte, a truncated and a text file among 11: each batch of 11 holds every image, so every row meets all
    three, as training would, and says so."""
    result = run_bench(tmp_path, tree_with_bad_files, "bench.num_workers=[0,2]", "bench.batch_size=11")
    assert result.returncode == 0, result.stderr[-3000:]
    with (tmp_path / "bench/bench.csv").open() as file:
        written = list(csv.DictReader(file))
    probe = [row for row in written if row["decoder"] == "storage"]
    decoded = [row for row in written if row["decoder"] != "storage"]
    assert sorted(row["num_workers"] for row in probe) == ["1", "2"]  # reads bytes, so bad files cost nothing there
    assert len(decoded) == 2 * 6 and all(float(row["images_per_s"]) > 0 for row in written)
    assert {row["unreadable"] for row in decoded} == {"3"}, [(row["decoder"], row["unreadable"]) for row in decoded]


@FULL
def test_bench_over_a_data_set_past_the_bad_fraction_ends_in_the_line_training_gives(tiny_root, tmp_path):
    import shutil

    root = shutil.copytree(tiny_root, tmp_path / "data")
    for path in sorted((root / "train").rglob("*.JPEG"))[::2]:
        path.write_bytes(b"not an image")
    result = run_bench(tmp_path, root, "bench.num_workers=[0]", "bench.batch_size=4")
    assert result.returncode == 1
    assert error_line(result.stderr).startswith("error: 11 of the 24 training images are unreadable, more than "
                                                "data.max_bad_fraction=0.01 allows (10): is this the data set you "
                                                "meant?"), result.stderr[-2000:]


@pytest.mark.skipif(PACKED is None, reason="no packed format is installed here")
def test_a_pack_is_keyed_by_its_trees_index_and_read_again_while_that_is_unchanged(tiny_root, tmp_path):
    """Two data sets in folders of the same name, one image apart, get a pack each, each holding its own images; the
    unchanged one reads its pack again rather than writing it twice. An image rewritten at another size changes the
    key too."""
    trees = [shutil.copytree(tiny_root, tmp_path / where / tiny_root.name) for where in ("a", "b")]
    next((trees[1] / "train").rglob("*.JPEG")).unlink()
    pack_dir = tmp_path / "packs"

    def train_split(tree):
        source = Source(root=tree, crop_size=32, val_resize=36, train_crop_size=32, on_error="skip")
        return stores_for(PACKED, source, pack_dir, tree_key(tree), TENSOR_SHORT_SIDE).train

    assert [len(train_split(tree)) for tree in trees] == [len(open_tree(tree)[0]) for tree in trees]
    packs = sorted(pack_dir.iterdir())
    assert len(packs) == 2 and all(pack.name.startswith(f"{tiny_root.name}-") for pack in packs), packs
    written = [(pack / META).stat().st_mtime_ns for pack in packs]
    assert len(train_split(trees[0])) == len(open_tree(trees[0])[0])
    assert sorted(pack_dir.iterdir()) == packs and [(pack / META).stat().st_mtime_ns for pack in packs] == written
    before = tree_key(trees[0])
    image = next((trees[0] / "train").rglob("*.JPEG"))
    image.write_bytes(image.read_bytes() + b"\0")
    assert tree_key(trees[0]) != before


def compose_bench(root, tmp_path, *overrides: str):
    """bench's config as hydra.main hands it over, writing into tmp_path: bench(cfg) runs inside the `with`."""
    return hydra_run("bench", ["data=folder", f"data.root={root}", "data.crop_size=32", "bench.formats=[folder]",
                               "bench.batch_size=4", "bench.timed_epochs=1", f"bench.pack_dir={tmp_path / 'packs'}",
                               *overrides], tmp_path)


def test_a_failing_storage_probe_is_one_line_and_leaves_every_row_measured_before_it(tiny_root, tmp_path, monkeypatch):
    """bench.csv is written as rows finish: an error in the probe's second read (of two: 2 readers, then 1) leaves
    the references, the loader's row and the probe's first row on disk, nothing half-written, and ends in one line."""
    read_rate, reads = storage_probe.read_rate, []

    def failing_second(*args):
        reads.append(args)
        if len(reads) == 2:
            raise OSError(errno.EIO, "Input/output error")
        return read_rate(*args)

    monkeypatch.setattr(storage_probe, "read_rate", failing_second)
    with compose_bench(tiny_root, tmp_path, f"bench.decoders=[{FASTEST}]", "bench.num_workers=[2]") as cfg, \
            pytest.raises(SystemExit) as exited:
        failures.one_line(lambda: bench(cfg, tmp_path))
    line = str(exited.value.code)
    assert line.startswith("error: the storage probe failed on format=folder (OSError: [Errno 5] Input/output "
                           "error)") and "\n" not in line, line
    with (tmp_path / "bench.csv").open() as file:
        written = list(csv.DictReader(file))
    assert [(row["decoder"], row["format"], row["num_workers"]) for row in written] == [
        ("ceiling", "memory", "2"), ("baseline", "folder", "2"), ("region ceiling", "memory", "2"),
        (FASTEST, "folder", "2"), ("storage", "folder", "2")]
    assert float(written[3]["images_per_s"]) > 0 and float(written[3]["vs_ceiling"]) > 0
    assert f"the {len(written)} rows measured before it are in {tmp_path / 'bench.csv'}" in line
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".bench.csv")] == []


@pytest.mark.skipif(not options.facts("decoder", training_decoder()).region_decode,
                    reason=f"decoder={training_decoder()}, which training uses here, decodes whole images")
def test_the_probe_compares_reads_with_the_region_ceiling_where_trainings_decoder_decodes_regions(tiny_root, tmp_path):
    """The default decoder decodes only the crop's region: a loader of it could go as fast as the region ceiling, so
    storage limits it wherever reads are slower than that, not slower than decoding whole images."""
    with compose_bench(tiny_root, tmp_path, f"bench.decoders=[{training_decoder()}]", "bench.num_workers=[0]") as cfg:
        rows = bench(cfg, tmp_path)
    full, region, storage = (next(row for row in rows if row["decoder"] == name)
                             for name in ("ceiling", "region ceiling", "storage"))
    assert region["images_per_s"] > 0 and region["images_per_s"] != full["images_per_s"]
    assert storage["vs_region_ceiling"] == pytest.approx(storage["images_per_s"] / region["images_per_s"])
    assert storage["limit"] == ("storage" if storage["images_per_s"] < region["images_per_s"] else "decode")
    assert "region decodes/s" in storage["note"], storage["note"]


def test_bench_refuses_a_key_no_option_reads(tiny_root, tmp_path):
    with compose_bench(tiny_root, tmp_path, "+bench.decoder=[pil]") as cfg, pytest.raises(ConfigError) as refused:
        bench(cfg, tmp_path)
    assert str(refused.value) == "+bench.decoder: no such key; did you mean bench.decoders?"


GPU_ONLY = next((name for name in options.options("decoder") if (facts := options.facts("decoder", name)).gpu
                 and not facts.bench_without_gpu), None)


@pytest.mark.skipif(GPU_ONLY is None, reason="no decoder here is one bench cannot time without a GPU")
def test_a_row_that_did_not_run_says_why_in_place_of_its_figures(tiny_root, tmp_path):
    with compose_bench(tiny_root, tmp_path, f"bench.decoders=[{FASTEST},{GPU_ONLY}]", "bench.device=cpu",
                       "bench.num_workers=[0]", "bench.probe_storage=false") as cfg:
        rows = bench(cfg, tmp_path)
    why = f"not run: {options.facts('decoder', GPU_ONLY).gpu}, and bench.device is cpu; on cpu"
    assert f"{GPU_ONLY:<15}{'folder':<14}{0:>8}  {why}" in table(rows).splitlines()
    with (tmp_path / "bench.csv").open() as file:
        written = next(row for row in csv.DictReader(file) if row["decoder"] == GPU_ONLY)
    assert [written[column] for column in ("images_per_s", "vs_baseline", "vs_ceiling", "note")] == ["", "", "", why]


def test_the_chart_draws_the_storage_probes_reads_in_a_panel_of_their_own(tmp_path, monkeypatch):
    """Reads per second run ten times the decode rates: on one axis they would flatten the loaders' bars."""
    Figure = pytest.importorskip("matplotlib.figure", reason=not_installed("matplotlib", "bench")).Figure
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, path, **kwargs: drawn.append(figure))
    row = {"format": "folder", "num_workers": 2}
    loaders = [{**row, "decoder": "baseline", "images_per_s": 400.0, "reference": True},
               {**row, "decoder": "pil", "images_per_s": 700.0}, {**row, "decoder": "nvjpeg", "images_per_s": None}]
    storage = [{**row, "decoder": "storage", "images_per_s": 38000.0, "reference": True}]
    chart(loaders, storage, tmp_path / "bench.png")
    panels = drawn[0].axes
    assert [axis.get_ylabel() for axis in panels] == ["images/s (loader only)", "random reads/s (storage probe)"]
    assert [[bar.get_height() for bar in axis.patches] for axis in panels] == [[400.0, 700.0], [38000.0]]


def test_without_matplotlib_the_charts_are_left_out_in_one_line_each(tmp_path, monkeypatch, caplog):
    """matplotlib is the [bench] extra: without it, bench and tune still write their tables, and say what they left
    out and how to have it."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *package: None if name == "matplotlib" else find_spec(name, *package))
    chart([{"format": "folder", "num_workers": 2, "decoder": "pil", "images_per_s": 700.0}], [], tmp_path / "bench.png")
    tune_chart([], tmp_path / "tune.png")
    assert list(tmp_path.iterdir()) == []
    install = not_installed("matplotlib", "bench")
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == [
        f"bench.png is not drawn: {install}", f"tune.png is not drawn: {install}"]


@pytest.mark.skipif(PACKED is None, reason="no packed format is installed here")
def test_bench_ends_with_the_fastest_row_beside_the_baseline_and_the_command_that_trains_with_it(tiny_root, tmp_path):
    with compose_bench(tiny_root, tmp_path, f"bench.decoders=[{FASTEST}]", f"bench.formats=[folder,{PACKED}]",
                       "bench.num_workers=[1]", "bench.probe_storage=false", f"bench.short_side={TENSOR_SHORT_SIDE}") as cfg:
        rows = bench(cfg, tmp_path)
    loaders = [row for row in rows if not row.get("reference")]
    best = max(loaders, key=lambda row: row["images_per_s"])
    baseline = next(row for row in rows if row["decoder"] == "baseline")
    side = TENSOR_SHORT_SIDE if options.facts("format", PACKED).holds_pixels else None
    chosen = [f"{group}={best[group]}" for group in ("decoder", "format") if best[group] != options.default(group)]
    read = [f"format.path={pack_path(tmp_path / 'packs', tree_key(tiny_root), PACKED, side)}"] \
        if best["format"] == PACKED else []
    assert best_line(rows, ["data=folder", f"data.root={tiny_root}"]) == (
        f"best here: decoder={best['decoder']} on {best['format']}, 1 worker: {best['images_per_s']:.0f} images/s, "
        f"x{best['images_per_s'] / baseline['images_per_s']:.2f} the pytorch/examples baseline's "
        f"{baseline['images_per_s']:.0f} (loader only, no model); train with it: python -m {PACKAGE}.train "
        + " ".join(["data=folder", f"data.root={tiny_root}", *chosen, *read, "loader.num_workers=1"]))


@pytest.mark.skipif(PACKED is None, reason="no packed format's extra is installed: pip install -e '.[lmdb]'")
def test_a_pack_dir_that_cannot_be_written_is_refused_before_bench_measures(read_only_folder, tiny_root, tmp_path):
    pack_dir = read_only_folder / "packs"
    with compose_bench(tiny_root, tmp_path, f"bench.formats=[folder,{PACKED}]", f"bench.pack_dir={pack_dir}",
                       f"bench.short_side={TENSOR_SHORT_SIDE}") as cfg, pytest.raises(ConfigError) as refused:
        bench(cfg, tmp_path)
    side = TENSOR_SHORT_SIDE if options.facts("format", PACKED).holds_pixels else None
    pack = pack_path(pack_dir, tree_key(tiny_root), PACKED, side)
    assert re.match(rf"bench.pack_dir={pack_dir}: {read_only_folder} cannot be written \((Read-only file system|"
                    rf"Permission denied)\); bench would have to write {pack}: pass a bench.pack_dir this user can "
                    rf"write, or leave {PACKED} out of bench.formats$", str(refused.value)), refused.value
    assert not (tmp_path / "bench.csv").exists()


@pytest.mark.skipif(PACKED is None, reason="no packed format's extra is installed: pip install -e '.[lmdb]'")
def test_packs_already_on_a_read_only_folder_are_measured_and_only_a_pack_to_write_is_refused(read_only_view,
                                                                                              tiny_root, tmp_path):
    """Packs written once and served from a read-only share (NFS, a FUSE mount, a container's layer) are read there;
    a tree whose pack is not there yet is refused in one line naming that pack."""
    share = tmp_path / "share"
    source = Source(root=tiny_root, crop_size=32, val_resize=36, train_crop_size=32, on_error="skip")
    stores_for(PACKED, source, share, tree_key(tiny_root), TENSOR_SHORT_SIDE)  # packed where the share is writable
    pack_dir = read_only_view(share)
    served = sorted(pack_dir.rglob("*"))
    side = TENSOR_SHORT_SIDE if options.facts("format", PACKED).holds_pixels else None
    with compose_bench(tiny_root, tmp_path, f"bench.formats=[{PACKED}]", f"bench.decoders=[{FASTEST}]",
                       "bench.num_workers=[0]", "bench.probe_storage=false", f"bench.short_side={TENSOR_SHORT_SIDE}",
                       f"bench.pack_dir={pack_dir}") as cfg:
        rows = bench(cfg, tmp_path)
    measured = next(row for row in rows if row["format"] == PACKED)
    assert measured["images_per_s"] > 0
    assert f"format.path={pack_path(pack_dir, tree_key(tiny_root), PACKED, side)}" in measured["train_with"]
    assert sorted(pack_dir.rglob("*")) == served

    other = shutil.copytree(tiny_root, tmp_path / "other" / tiny_root.name)  # another data set: no pack of it served
    next((other / "train").rglob("*.JPEG")).unlink()
    with compose_bench(other, tmp_path, f"bench.formats=[{PACKED}]", f"bench.short_side={TENSOR_SHORT_SIDE}",
                       f"bench.pack_dir={pack_dir}") as cfg, pytest.raises(ConfigError) as refused:
        bench(cfg, tmp_path)
    assert str(refused.value) == (
        f"bench.pack_dir={pack_dir}: {pack_dir} cannot be written (Read-only file system); bench would have to write "
        f"{pack_path(pack_dir, tree_key(other), PACKED, side)}: pass a bench.pack_dir this user can write, or leave "
        f"{PACKED} out of bench.formats")


@pytest.mark.parametrize(("override", "line"), [
    ("bench.batch_size=64", "bench.batch_size=64 is more than the 24 training images under {root}: pass a smaller "
                            "bench.batch_size"),
    ("bench.orders=[random,shuffled]", "bench.orders: shuffled is not one of conf/order's options: "
                                       + ", ".join(options.options("order"))),
    ("bench.decoders=pil", "bench.decoders=pil: pass a list, such as [{decoder}]"),
    *((f"bench.stagings=[{name}]", f"bench.stagings: staging={name} cuts the batches on the device with no loader "
       f"worker, and bench times loader workers: measure it with two training runs side by side, python -m "
       f"{options.PACKAGE}.train ... staging={name} and staging={options.default('staging')}")
      for name in options.having("staging", "on_device")),
])
def test_what_bench_can_check_is_refused_in_one_line_before_it_packs(override, line, tiny_root, tmp_path):
    """A small data set used to be refused after four packs had been written (17 s for a folder of 350 photos)."""
    with compose_bench(tiny_root, tmp_path, f"bench.formats=[folder,{PACKED or 'folder'}]", override) as cfg, \
            pytest.raises(ConfigError) as refused:
        bench(cfg, tmp_path)
    assert str(refused.value) == line.format(root=tiny_root, decoder=options.default("decoder"))
    assert not (tmp_path / "packs").exists() and not (tmp_path / "bench.csv").exists()
