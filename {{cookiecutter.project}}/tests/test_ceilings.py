"""The references bench puts beside its rows: the full-decode and the region-decode ceilings, and a bench run that
reports every row as a share of both."""
import csv

import pytest
from PIL import Image

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.data.decoder.pil import PilDecoder
from {{ cookiecutter.package }}.tools.bench import bench
from {{ cookiecutter.package }}.tools.bench.ceilings import Ceilings

from helpers.decoders import make_decoder
from helpers.images import encoded, photo
from helpers.runs import hydra_run

REGION_DECODERS = [name for name in options.options("decoder") if options.facts("decoder", name).region_decode
                   and not options.facts("decoder", name).gpu]


@pytest.fixture(scope="module")
def photo_tree(tmp_path_factory):
    """40 training JPEGs of 640x480 and a validation one: large beside a 64-pixel crop, as ImageNet's are beside 224,
    and smooth as photographs are (photo's noise at full size would make the decode all entropy decoding)."""
    root = tmp_path_factory.mktemp("photos")
    for split, count in (("train", 40), ("val", 1)):
        (root / split / "a").mkdir(parents=True)
        for index in range(count):
            image = photo(160, 120, seed=index).resize((640, 480), Image.BILINEAR)
            (root / split / "a" / f"{index}.JPEG").write_bytes(encoded(image, quality=90))
    return root


@pytest.mark.parametrize("name", REGION_DECODERS)
def test_the_region_ceiling_decodes_crops_faster_than_the_full_ceiling_decodes_images(name, photo_tree):
    """Measured side by side in one process: decoding what random 64-pixel crops keep, at the DCT scale they allow,
    takes a fraction of decoding every pixel. A decoder that cannot decode a region sets no region ceiling."""
    references = Ceilings(photo_tree, {name: make_decoder(name), "pil": PilDecoder()}, 64)
    for _ in range(5):
        references.measure()
    full, region = references.full, references.region
    assert region.decoder == name and full.unreadable == region.unreadable == 0
    assert len(full.passes) == len(region.passes) == 5 and all(decoded == 40 for decoded, _ in full.passes)
    # Each pair of passes ran back to back, so the median pair's ratio holds where a neighbour's load (the
    # parallel tests) slows some passes: over all passes, one slowed region pass once gave 1.20.
    ratios = sorted((decoded / seconds) / (full_decoded / full_seconds)
                    for (full_decoded, full_seconds), (decoded, seconds) in zip(full.passes, region.passes))
    ratio = ratios[len(ratios) // 2]  # 1.59-1.67 in six runs over all passes; a whole decode is 1x
    assert ratio > 1.25, ratios
    assert Ceilings(photo_tree, {"pil": PilDecoder()}, 64).region is None


@pytest.mark.parametrize("name", REGION_DECODERS)
def test_bench_gives_every_row_as_a_share_of_both_ceilings(name, photo_tree, tmp_path):
    overrides = ["data=folder", f"data.root={photo_tree}", "data.crop_size=64", "bench.formats=[folder]",
                 f"bench.decoders=[{name}]", "bench.num_workers=[0]", "bench.batch_size=8", "bench.timed_epochs=1",
                 "bench.probe_storage=false", f"bench.pack_dir={tmp_path / 'packs'}"]
    with hydra_run("bench", overrides, tmp_path) as cfg:
        rows = bench(cfg, tmp_path)
    full, region = (next(row for row in rows if row["decoder"] == reference) for reference in ("ceiling", "region ceiling"))
    assert region["images_per_s"] > full["images_per_s"] > 0 and name in region["note"]
    # a pass of each before the baseline, before the one row and after it: the references span the rows' time
    assert "3 passes beside the rows" in full["note"] and "3 passes beside the rows" in region["note"]
    with (tmp_path / "bench.csv").open() as file:
        written = {row["decoder"]: row for row in csv.DictReader(file)}
    for row in written.values():  # the shares are those of the figures in the same file
        rate = float(row["images_per_s"])
        assert abs(float(row["vs_ceiling"]) - rate / full["images_per_s"]) < 0.01 + 0.02 * rate / full["images_per_s"]
        assert abs(float(row["vs_region_ceiling"]) - rate / region["images_per_s"]) < 0.01 + 0.02 * rate / region[
            "images_per_s"]
    assert set(written) == {"ceiling", "region ceiling", "baseline", name}
    # an epoch's first batch of 8 of its 40 images: after a fifth of the epoch, in one process
    timed = next(row for row in rows if row["decoder"] == name)
    epoch_s = 40 / timed["images_per_s"]
    assert 0 < timed["first_batch_s"] < epoch_s / 2, (timed["first_batch_s"], epoch_s)
    assert f"epoch start {timed['first_batch_s']:.2f} s" in written[name]["note"]
