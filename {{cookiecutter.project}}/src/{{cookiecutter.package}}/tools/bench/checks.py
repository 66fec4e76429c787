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


def checked_source(cfg: DictConfig) -> Source:
    """The data set, once everything bench can check before it packs is right: each list and the options it names,
    the device, and a training split that holds a batch. Each is refused in one line."""
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
    for format in settings.formats:  # a decoder that cannot run gets a row saying why; a format has none to give
        if why := options.facts("format", format).missing():
            raise ConfigError(f"bench.formats: format={format} cannot run here, {why}; or leave it out of bench.formats")
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("bench.device=cuda, and torch.cuda.is_available() is False here: pass bench.device=auto")
    training_images = len(open_tree(source.root)[0])
    if settings.batch_size > training_images:  # no full batch to time, in any loader
        raise ConfigError(f"bench.batch_size={settings.batch_size} is more than the {training_images} training images "
                          f"under {source.root}: pass a smaller bench.batch_size")
    if any(options.facts("format", format).packed for format in settings.formats):  # packed on first use
        check_writable(Path(settings.pack_dir).expanduser(), "bench.pack_dir")
    return source
