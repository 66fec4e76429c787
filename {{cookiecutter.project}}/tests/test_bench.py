"""The loader benchmark: one row per configuration plus the ceiling and baseline references, a CSV and a chart."""
import csv

from conftest import CONF, CUDA, TENSOR_SHORT_SIDE
from hydra import compose, initialize_config_dir

from {{ cookiecutter.package }}.bench import bench, table


def test_bench_writes_a_row_per_configuration_and_both_references(tiny_root, tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("bench", ["data=imagenet", f"data.root={tiny_root}", "data.crop_size=32",
                                "bench.decoders=[pil,opencv,nvjpeg]", "bench.formats=[folder,tensor]",
                                "bench.num_workers=[0,1]", "bench.batch_size=4", "bench.timed_epochs=1",
                                f"bench.short_side={TENSOR_SHORT_SIDE}", f"bench.pack_dir={tmp_path / 'packs'}"])
    rows = bench(cfg, tmp_path)
    with (tmp_path / "bench.csv").open() as file:
        written = list(csv.DictReader(file))
    assert [(row["decoder"], row["format"], row["num_workers"]) for row in written] == [
        (decoder, format, workers) for workers in ("0", "1") for decoder, format in (
            ("ceiling", "memory"), ("baseline", "folder"), ("pil", "folder"), ("opencv", "folder"),
            ("nvjpeg", "folder"), ("none", "tensor"))]
    nvjpeg = [row for row in written if row["decoder"] == "nvjpeg"]
    if CUDA:  # the GPU decoder is timed where it can run, and says why it was not where it cannot
        assert all(float(row["images_per_s"]) > 0 and row["note"] == "on cuda" for row in nvjpeg)
    else:
        assert all(float(row["images_per_s"]) == 0 and row["note"].startswith(
            "not run: decoder=nvjpeg decodes on the GPU and this run has none") for row in nvjpeg)
    assert all(float(row["images_per_s"]) > 0 for row in written if row["decoder"] != "nvjpeg")
    baseline = [row for row in written if row["decoder"] == "baseline"]
    assert all(float(row["vs_baseline"]) == 1.0 for row in baseline)
    for row in written:  # the ratios are those of the figures in the same file
        reference = next(b for b in baseline if b["num_workers"] == row["num_workers"])
        ratio = float(row["images_per_s"]) / float(reference["images_per_s"])
        assert abs(ratio - float(row["vs_baseline"])) < 0.02 * ratio + 0.01
    assert "warm" in written[0]["page_cache"]
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "baseline" in table(rows) and (tmp_path / "packs").is_dir()
