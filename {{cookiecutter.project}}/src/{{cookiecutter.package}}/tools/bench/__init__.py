"""The loader benchmark behind `python -m <package>.bench`: the rows, the references, bench.csv and bench.png."""
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import psutil
import torch
from omegaconf import DictConfig, OmegaConf

from ... import options
from ...contracts import Decoder, Stores
from ...core.config import build
from ...core.errors import ConfigError
from ...core.distributed import ALONE
from ...core.files import bytes_in
from ...data.decoder import CpuDecoder
from ...data.images import Splits, make_splits
from ...data.loaders import training_loader
from ...data.sources import Source
from ...data.staging import no_staging
from ...data.workers import pick_num_workers, work_of
from .baseline import baseline
from .checks import check_packs_writable, checked_source, pack_for
from .results import BenchCsv
from .timing import Timed, time_epochs
from .report import chart
from .ceilings import CEILING_FILES, Ceilings, cores_for
from ..pack import pack, tree_key
from .staged import counted, stagings, timed_staging
from .storage_probe import probe

log = logging.getLogger(__name__)

def make_decoder(name: str, batch_size: int, device: torch.device, settings: dict) -> Decoder:
    """The decoder option `name` as training builds it with `settings`, or a ConfigError saying why this
    machine cannot run it."""
    node = OmegaConf.merge({"train": {"batch_size": batch_size}},
                           {"decoder": OmegaConf.load(options.CONF / "decoder" / f"{name}.yaml")}, {"decoder": settings})
    decoder = build(node.decoder)
    decoder.check_device(device)
    # What its bench row says it ran with: its own keys, as the command line would set them.
    decoder.settings = " ".join(f"decoder.{key}={str(value).lower() if isinstance(value, bool) else value}"
                                for key, value in node.decoder.items() if not key.startswith("_"))
    return decoder


def timed_decoders(names: list[str], batch_size: int, device: torch.device) -> tuple[dict[str, Decoder], dict[str, str]]:
    """The decoders bench times on `device`, a GPU decoder without a GPU in its CPU mode when that is worth
    timing (its facts say), and why each of the others is not timed."""
    runnable, unable = {}, {}
    for name in names:
        facts, settings, overrides = options.facts("decoder", name), {}, []
        if facts.gpu and device.type != "cuda":
            if not facts.bench_without_gpu:
                unable[name] = f"{facts.gpu}, and bench.device is {device.type}"
                continue
            settings, overrides = facts.without_gpu, facts.overrides_without_gpu("decoder")
        try:
            runnable[name] = make_decoder(name, batch_size, device, settings)
        except ConfigError as err:
            unable[name] = str(err)
            continue
        runnable[name].overrides = overrides  # what training needs, beside decoder=<name>, to decode as its row did
    return runnable, unable


def format_node(format: str, source: Source, pack_dir: Path, key: str, short_side: int) -> DictConfig:
    """`format`'s config, pointing at its pack of the source tree, whose `tree_key` is `key`, written on first use."""
    node = OmegaConf.load(options.CONF / "format" / f"{format}.yaml")
    where = pack_for(format, pack_dir, key, short_side)
    if where is not None:
        node["path"] = str(where)
        if not where.exists():
            log.info("format=%s: packing %s into %s, read again by every bench of this tree", format, source.root,
                     where)
            side = short_side if options.facts("format", format).holds_pixels else None
            pack(source.root, format, where, side, 90, os.cpu_count() or 1, False, "skip")
    return node


def stores_for(format: str, source: Source, pack_dir: Path, key: str, short_side: int) -> Stores:
    """The training split in `format`, packed from the source tree on first use."""
    return build(format_node(format, source, pack_dir, key, short_side)).stores(source, no_staging)


def train_overrides(row: dict, decoder: Decoder, format_node: DictConfig) -> list[str]:
    """The overrides of `python -m <package>.train` that load as `row` did: each choice that is not the default,
    the decoder's settings, the pack read and the worker count."""
    chosen = [f"{group}={row[group]}" for group in ("decoder", "format", "order", "staging")
              if row[group] != options.default(group)]
    return [*chosen, *decoder.overrides, *([f"format.path={format_node.path}"] if "path" in format_node else []),
            f"loader.num_workers={row['num_workers']}"]


@dataclass(frozen=True, kw_only=True)
class Row:
    """One timed loader: a point of bench's grid, each field an axis of bench.yaml's."""
    workers: int | str  # as bench.num_workers names it: a count, or auto
    format: str
    staging: str
    order: str
    decoder: str


def grid(settings: DictConfig, decoders: list[str], pixels: list[str], unable: list[str],
         workers: int | str) -> Iterator[Row]:
    """The rows of `workers`: every format, staging, order and decoder the settings name, as far as the facts let them
    go together. A format that streams has nothing for a staging to copy, only a format that reads runs of records
    is read in an order of runs, and a format of pixels is read by the decoder that takes them. After each format
    and staging, a row for each decoder this machine cannot run (`unable`), in no order: it is not timed."""
    for format in settings.formats:
        stored = options.facts("format", format)
        for staging in settings.stagings:
            if stored.streams and options.facts("staging", staging).copies_to_ram:
                continue
            for order in settings.orders:
                if options.facts("order", order).in_runs and not stored.reads_runs:
                    continue
                for decoder in pixels if stored.holds_pixels else decoders:
                    yield Row(workers=workers, format=format, staging=staging, order=order, decoder=decoder)
            if not stored.holds_pixels:
                yield from (Row(workers=workers, format=format, staging=staging, order="", decoder=decoder)
                            for decoder in unable)


def time_row(row: Row, stores: Stores, decoder: Decoder, source: Source, settings: DictConfig, device: torch.device,
             references: Ceilings) -> tuple[int, Timed, Splits]:
    """The loader of `row` timed over whole epochs, the references measured beside it: (its worker count, what was
    timed, its splits)."""
    order = build(OmegaConf.load(options.CONF / "order" / f"{row.order}.yaml"))
    ordered = replace(stores, train=order.reads(stores.train))
    splits = make_splits(source, ordered, decoder)

    def loader_with(count: int, persistent: bool = False):
        return training_loader(ordered, splits.train, settings.batch_size, 0, ALONE, splits.decoder.collate, order,
                               num_workers=count, prefetch_factor=2, pin_memory=False, persistent_workers=persistent)

    def uploads(batches):
        return splits.decoder.uploads(batches, device, True)

    count = pick_num_workers(row.workers, splits.train, settings.batch_size, work_of(decoder, source.train_crop_size),
                             lambda count: uploads(loader_with(count)), decodes_beside=decoder.queued_batches > 0,
                             device=device, setting="bench.num_workers",
                             data=f"{source.root}|{row.format}|{row.staging}")
    references.measure()
    loader = loader_with(count, persistent=True)
    return count, time_epochs(loader, settings.timed_epochs, uploads, device, loader.set_epoch), splits


def loader_row(row: Row, count: int, timed: Timed, splits: Splits, decoder: Decoder, node: DictConfig,
               staging_s: float | str, timed_epochs: int) -> dict:
    """bench.csv's line of a timed row."""
    fields = {**asdict(row), "num_workers": count}
    notes = [decoder.settings, f"num_workers=auto: {count}" if row.workers == "auto" else "",
             "pre-decoded pixels" if options.facts("format", row.format).holds_pixels else "",
             f"epoch start {timed.epoch_start_s:.2f} s",
             counted(staging_s, len(splits.train), timed.rate, timed_epochs)]
    return {**fields, "train_with": train_overrides(fields, decoder, node), "images_per_s": timed.rate,
            "staging_s": staging_s, "first_batch_s": timed.epoch_start_s,
            "unreadable": int(splits.train.bad_flags().sum()), "note": "; ".join(filter(None, notes))}


def reference_rows(workers: int | str, references: Ceilings, source: Source, settings: DictConfig,
                   device: torch.device) -> list[dict]:
    """The references beside the rows of `workers`: the two ceilings and the pytorch/examples baseline."""
    references.measure()
    cores = cores_for(workers)
    baseline_workers = cores if workers == "auto" else workers  # a worker per core, as its users pass -j
    baseline_rate, baseline_bad = baseline(source.root, source.train_crop_size, settings.batch_size, baseline_workers,
                                           settings.timed_epochs, device)
    region = (f"{references.region.decoder} decodes the training crop's region only, 1 process x {cores} cores, "
              "files in memory") if references.region else "not run: no decoder here decodes a region"
    return [{"decoder": "ceiling", "format": "memory", "workers": workers, "num_workers": workers,
             "ceiling": references.full, "note": f"{references.full.decoder} full decode, 1 process x {cores} cores, "
                                                  f"unreadable files of the {CEILING_FILES} first skipped"},
            {"decoder": "baseline", "format": "folder", "workers": workers, "num_workers": baseline_workers,
             "images_per_s": baseline_rate, "reference": True, "unreadable": baseline_bad,
             "note": "ImageFolder+PIL+ToTensor+Normalize fp32, unreadable files skipped" +
                     ("; a worker per core" if workers == "auto" else "")},
            {"decoder": "region ceiling", "format": "memory", "workers": workers, "num_workers": workers,
             "ceiling": references.region, "note": region}]


def bench(cfg: DictConfig, run_dir: Path) -> list[dict]:
    options.check(cfg)
    source, settings = checked_source(cfg), cfg.bench
    pack_dir, key = Path(settings.pack_dir).expanduser(), tree_key(source.root)
    check_packs_writable(list(settings.formats), pack_dir, key, settings.short_side)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if settings.device == "auto" \
        else torch.device(settings.device)
    names = [name for name in options.options("decoder") if not options.facts("decoder", name).takes_pixels] \
        if settings.decoders == "all" else list(settings.decoders)
    runnable, unable = timed_decoders(names, settings.batch_size, device)
    pixels, _ = timed_decoders(options.having("decoder", "takes_pixels"), settings.batch_size, device)
    decoders = {**runnable, **pixels}
    cpu_decoders = {name: decoder for name, decoder in runnable.items() if isinstance(decoder, CpuDecoder)}
    data_mb = bytes_in(source.root / "train") / 1e6
    cache = f"warm: read once in warm-up; {data_mb:.0f} MB vs {psutil.virtual_memory().available / 1e9:.0f} GB free RAM"
    fallback = options.fastest_cpu_decoder()
    references = Ceilings(source.root, cpu_decoders or {fallback: make_decoder(fallback, settings.batch_size, device, {})},
                          source.train_crop_size)
    written = BenchCsv(run_dir / "bench.csv", cache, device)
    nodes = {format: format_node(format, source, pack_dir, key, settings.short_side) for format in settings.formats}
    with stagings(list(settings.stagings)) as stages:
        staged = {(format, name): timed_staging(partial(build(nodes[format]).stores, source), stage, copies)
                  for format in settings.formats for name, (stage, copies) in stages.items()
                  if not (copies and options.facts("format", format).streams)}  # it streams: nothing to copy
        for workers in settings.num_workers:  # a count, or auto: each row at the count training's auto picks for it
            written.add(reference_rows(workers, references, source, settings, device))
            for row in grid(settings, list(runnable), list(pixels), list(unable), workers):
                if row.decoder in unable:
                    written.add([{"decoder": row.decoder, "format": row.format, "staging": row.staging,
                                  "workers": workers, "num_workers": workers, "images_per_s": None, "unreadable": "",
                                  "note": f"not run: {unable[row.decoder]}"}])  # in no order: nothing was read
                    continue
                stores, staging_s = staged[row.format, row.staging]
                count, timed, splits = time_row(row, stores, decoders[row.decoder], source, settings, device,
                                                references)
                written.add([loader_row(row, count, timed, splits, decoders[row.decoder], nodes[row.format],
                                        staging_s, settings.timed_epochs)])
                log.info("%s / %s / order=%s / staging=%s / %d workers: %.0f images/s", row.decoder, row.format,
                         row.order, row.staging, count, timed.rate)
    references.measure()
    written.save()  # with the last pass of the references
    if settings.probe_storage:
        readers = sorted({1, *(cores_for(n) if n == "auto" else max(1, n) for n in settings.num_workers)})
        probe(list(settings.formats),
              lambda format: stores_for(format, source, pack_dir, key, settings.short_side).train,
              readers, references, written)
    chart(written.loader_rows(), written.probed, run_dir / "bench.png")
    return written.rows()
