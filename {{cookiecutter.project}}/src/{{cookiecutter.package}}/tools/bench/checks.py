"""What bench refuses before it spends time packing or measuring: each refusal is one line."""
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ... import options
from ...core.config import build
from ...core.errors import ConfigError
from ...core.files import check_writable
from ...data.format.folder import open_tree
from ...data.sources import Source
from ...data.workers import check_worker_count
from ..pack import pack_path


def checked_source(cfg: DictConfig) -> Source:
    """The data set, once everything bench can check before it packs is right: each list and the options it names,
    the device, and a training split that holds a batch. Each is refused in one line. check_packs_writable follows,
    once the tree's key is known."""
    source, settings = build(cfg.data), cfg.bench
    if source.root is None:
        built_in = " or ".join(f"data={name}" for name in options.having("data", "built_in"))
        raise ConfigError(f"pass data.root=/path/to/tree (train/ and val/), or use {built_in}")
    if not OmegaConf.is_list(settings.num_workers):
        raise ConfigError(f"bench.num_workers={settings.num_workers}: pass a list, such as [auto] or [2,4]")
    for workers in settings.num_workers:
        check_worker_count(workers, "bench.num_workers")
    lists = {"formats": "format", "orders": "order", "stagings": "staging"}
    for setting, group in ({**lists, "decoders": "decoder"} if settings.decoders != "all" else lists).items():
        if not OmegaConf.is_list(settings[setting]):
            raise ConfigError(f"bench.{setting}={settings[setting]}: pass a list, such as [{options.default(group)}]")
        for name in settings[setting]:
            if name not in options.options(group):
                raise ConfigError(f"bench.{setting}: {name} is not one of conf/{group}'s options: "
                                  f"{', '.join(options.options(group))}")
    for name in settings.stagings:
        if options.facts("staging", name).on_device:
            raise ConfigError(f"bench.stagings: staging={name} cuts the batches on the device with no loader worker, "
                              "and bench times loader workers: measure it with two training runs side by side, "
                              f"python -m {options.PACKAGE}.train ... staging={name} and staging={options.default('staging')}")
    for format in settings.formats:  # a decoder that cannot run gets a row saying why; a format has none to give
        if why := options.facts("format", format).missing():
            raise ConfigError(f"bench.formats: format={format} cannot run here, {why}; or leave it out of bench.formats")
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("bench.device=cuda, and torch.cuda.is_available() is False here: pass bench.device=auto")
    training_images = len(open_tree(source.root)[0])
    if settings.batch_size > training_images:  # no full batch to time, in any loader
        raise ConfigError(f"bench.batch_size={settings.batch_size} is more than the {training_images} training images "
                          f"under {source.root}: pass a smaller bench.batch_size")
    return source


def pack_for(format: str, pack_dir: Path, key: str, short_side: int) -> Path | None:
    """Where bench reads `format`'s pack of the tree whose tree_key is `key`, or None for a format that reads the tree
    itself."""
    facts = options.facts("format", format)
    return pack_path(pack_dir, key, format, short_side if facts.holds_pixels else None) if facts.packed else None


def check_packs_writable(formats: list[str], pack_dir: Path, key: str, short_side: int) -> None:
    """Refuse, in one line, a pack_dir that cannot be written where a pack bench needs is not there yet. Packs that
    are there are only read, so a read-only share of them (NFS, a FUSE mount, a container's layer) is measured."""
    missing = {format: pack for format in formats if (pack := pack_for(format, pack_dir, key, short_side))
               and not pack.exists()}
    if missing:
        check_writable(pack_dir, "bench.pack_dir",
                       f"bench would have to write {', '.join(map(str, missing.values()))}: pass a bench.pack_dir "
                       f"this user can write, or leave {', '.join(missing)} out of bench.formats")
