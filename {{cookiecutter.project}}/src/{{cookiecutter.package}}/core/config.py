"""Start-up checks and building from config, so a bad command line costs one clear line, not a traceback."""
import functools
from collections.abc import Iterator
from typing import Any

from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .keys import leaves, unknown_added, wanted
from .packages import optional_import

RANGES = "_ranges_"  # in a config node: the valid values of its numeric keys, beside the keys themselves
FACTS = "_facts_"  # in an option's node: what it needs (options.py)


def composed(config_name: str, overrides: list[str]) -> DictConfig:
    """Hydra's compose, read-only and kept for the life of the process: the start-up checks compose the same
    options several times over (each run's, each option alone), some 0.3 s each, and the files they read do not
    change while a process runs. Keyed by the config folders too, so a user's --config-dir is composed apart."""
    sources = tuple(source.full_path() for source in GlobalHydra.instance().config_loader().get_sources())
    return _composed(sources, config_name, tuple(overrides))


@functools.lru_cache(maxsize=64)
def _composed(sources: tuple[str, ...], config_name: str, overrides: tuple[str, ...]) -> DictConfig:
    del sources  # a key only: compose reads them from Hydra's global state
    cfg = compose(config_name, overrides=list(overrides))
    OmegaConf.set_readonly(cfg, True)
    return cfg


def build(node: DictConfig, **runtime: Any) -> Any:
    """The node's target called with its config values and the runtime objects.

    The runtime objects are passed to the call, not through instantiate, which would turn a dataclass
    such as World into a DictConfig; a ConfigError raised by the target reaches the caller as itself.
    An option whose package is missing (its `_facts_`) is refused first, with the command that installs it.
    """
    facts = node.get(FACTS) or {}
    if facts.get("module"):
        optional_import(facts.module, facts.extra, facts.get("distribution"), facts.get("bundles"))
    values = {key: node[key] for key in node if key not in (RANGES, FACTS)}  # resolved: may point outside node
    return instantiate(OmegaConf.create(values), _partial_=True)(**runtime)


def _bounds(spec: str) -> list[tuple[float | None, float | None]]:
    """'1..' -> [(1, None)]; '-1 | 1..' -> [(-1, -1), (1, None)]; '0..1' -> [(0, 1)]."""
    bounds = []
    for part in spec.split("|"):
        low, dots, high = part.strip().partition("..")
        low, high = (float(low) if low else None), (float(high) if high else None)
        bounds.append((low, high) if dots else (low, low))
    return bounds


def describe_range(spec: str) -> str:
    """A range as words: 'at least 1', '-1, or at least 1', 'from 0 to 1'."""
    def words(low, high):
        if low == high:
            return f"{low:g}"
        if high is None:
            return f"at least {low:g}"
        return f"at most {high:g}" if low is None else f"from {low:g} to {high:g}"

    return ", or ".join(words(low, high) for low, high in _bounds(spec))


def in_range(value: float, spec: str) -> bool:
    return any((low is None or value >= low) and (high is None or value <= high) for low, high in _bounds(spec))


def ranged_keys(cfg: DictConfig, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """(dotted key, value, range) for every key that a `_ranges_` beside it constrains, Hydra's own excluded."""
    for key, node in cfg.items():
        if isinstance(node, DictConfig) and key != "hydra":
            yield from ranged_keys(node, f"{prefix}{key}.")
    for key, spec in (cfg.get(RANGES) or {}).items():
        yield f"{prefix}{key}", cfg.get(key), spec


def check_ranges(cfg: DictConfig) -> None:
    """Refuse, in one line, a number outside its key's range, and a crop larger than the resize before it."""
    for key, value, spec in ranged_keys(cfg):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not in_range(value, spec):
            raise ConfigError(f"{key}={value} is out of range: it must be {describe_range(spec)}")
    data = cfg.get("data")
    if data is not None and "val_resize" in data and data.val_resize < data.crop_size:
        raise ConfigError(f"data.val_resize={data.val_resize} is smaller than data.crop_size={data.crop_size}: the "
                          "validation crop is cut from the resized image; raise data.val_resize")


def _kind(default: Any) -> tuple[str, tuple[type, ...]] | None:
    if isinstance(default, bool):
        return "true or false", (bool,)
    if isinstance(default, int):
        return "a whole number", (int,)
    if isinstance(default, float):
        return "a number", (int, float)
    return None


AUTO_KEYS = {"loader.num_workers"}  # whole numbers that may also be measured at start-up


def check_values(cfg: DictConfig) -> None:
    """Refuse a key that no option reads, a missing value, an override whose type differs from the default of its
    key, or a number out of range (options.check then refuses an option whose packages are missing).

    Without a schema, Hydra takes `optim.lr=abc` as the string 'abc' and `+train.bach_size=32` as a new key;
    comparing against the same options composed without the user's values catches both for every key of every group.
    """
    hydra_cfg = HydraConfig.get()
    appended = {override.split("=")[0] for override in hydra_cfg.overrides.task if override.startswith("+")}
    # A group the defaults list lacks (a user's own, from --config-dir) is added with +, and is again here.
    choices = [f"{'+' if f'+{group}' in appended else ''}{group}={option}"
               for group, option in hydra_cfg.runtime.choices.items()
               if not group.startswith("hydra") and option is not None]
    defaults = composed(hydra_cfg.job.config_name, choices)
    plain = OmegaConf.to_container(defaults, resolve=False)
    if unknown := unknown_added(hydra_cfg, plain, choices):
        raise ConfigError(unknown)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:  # every one in the same line, so that a user fixes them all at once
        wants = {key: wanted(hydra_cfg, key) for key in missing}
        raise ConfigError("; ".join(f"{key} has no value: pass {key}=...{f', {wants[key]}' if wants[key] else ''}"
                                    for key in missing))
    for key, default in leaves({k: v for k, v in plain.items() if k != "hydra"}):
        if isinstance(default, str) and default.startswith("${"):  # an interpolation's kind is that of its value
            default = OmegaConf.select(defaults, key, throw_on_resolution_failure=False)
        kind = _kind(default)
        value = OmegaConf.select(cfg, key)
        if key in AUTO_KEYS and value == "auto":
            continue
        if kind and value is not None and (isinstance(value, bool) != (bool in kind[1])
                                           or not isinstance(value, kind[1])):
            raise ConfigError(f"{key}={value!r} is not {kind[0]}, as its default {default!r} is")
    check_ranges(cfg)


def chosen_keys(cfg: DictConfig, group: str) -> set[str]:
    """The keys of `group` that the command line or a recipe set, beyond its option's file: those an override names,
    and those whose value differs from the option composed alone. Every key of it where Hydra did not start the run,
    since a config composed in code names its values."""
    node = cfg[group]
    if not HydraConfig.initialized():
        return set(node)
    run = HydraConfig.get()
    named = {override.lstrip("+~").split("=")[0] for override in run.overrides.task}
    # Compared unresolved: data.val_resize follows data.crop_size, but only the crop was chosen.
    alone = composed(run.job.config_name, [f"{group}={run.runtime.choices[group]}"])[group]
    given, alone = (OmegaConf.to_container(each, resolve=False) for each in (node, alone))
    return {key for key in node if f"{group}.{key}" in named or given.get(key) != alone.get(key)}
