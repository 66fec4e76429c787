"""Start-up checks, building from config and the resolvers the YAML files use, so a bad command line costs one
clear line, not a traceback.

Every rank resolves the same run folder: under torchrun it is named after the rendezvous id, which all ranks
(and an elastic restart of them) share, instead of a timestamp each rank would read for itself.
"""
import importlib
import importlib.util
import os
import platform
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .keys import leaves, unknown_added, wanted


class ClearError(Exception):
    """An error whose message says all the user needs; the entry points print it as one line, no traceback."""


class ConfigError(ClearError):
    """A mistake in the command line, the config or the input paths."""


DISTRIBUTION = "{{ cookiecutter.project }}"  # pyproject.toml's name: its extras' markers say where each installs


def optional_import(module: str, extra: str, distribution: str | None = None, bundles: str | None = None) -> ModuleType:
    """Import a backend's package where the backend is built, or refuse in one line naming the extra to install: where
    it is missing, and where the module of that name is not `distribution`'s (see `not_from`)."""
    if why := wrong_version(distribution or module, extra):
        raise ConfigError(why)
    try:
        imported = importlib.import_module(module)
    except ImportError as err:
        raise ConfigError(not_installed(module, extra, f" ({err})")) from None
    except (OSError, RuntimeError) as err:  # installed, but its compiled libraries do not load with this torch
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{module} is installed but does not load here ({first}): reinstall the build made for "
                          f"this torch, pip install --force-reinstall -e '.[{extra}]'") from None
    if why := not_from(module, distribution, bundles):
        raise ConfigError(not_installed(distribution, extra, f" ({why})"))
    return imported


def not_from(module: str, distribution: str | None, bundles: str | None = None) -> str | None:
    """Why the importable `module` is not the one an option wants, or None: it is not the file `distribution`
    installed (PyTurboJPEG installs a top-level `turbojpeg` module too, which decoder=turbojpeg cannot use), or that
    distribution's files lack the library it `bundles`. Nothing to check for an option that names no distribution."""
    if distribution is None:
        return None
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        files = []
    origin = importlib.util.find_spec(module).origin
    if origin is None or not any(Path(file.locate()).resolve() == Path(origin).resolve() for file in files):
        owners = [owner for owner in metadata.packages_distributions().get(module.split(".")[0], [])
                  if owner != distribution] or [str(origin)]
        return f"the module {module} here comes from {', '.join(owners)}, not from {distribution}"
    if bundles and not any(bundles in file.name for file in files):
        return f"{distribution} here holds no {bundles}"
    return None


def not_installed(module: str, extra: str, detail: str = "") -> str:
    """A missing backend's line: the extra that installs it, or, where none does, that this machine cannot have it."""
    if installs_here(extra):
        return f"{module} is not installed{detail}: pip install -e '.[{extra}]'"
    return (f"{module} is not installed{detail}, and pip cannot install it on this machine ({this_machine()}): "
            f"pyproject.toml installs the extra [{extra}] only where it has wheels")


def extra_requirements(extra: str) -> list[Requirement]:
    """The requirements pyproject.toml lists for `extra`; none where the project runs from a source tree, since
    nothing installed says what the extra holds."""
    try:
        lines = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    return [requirement for requirement in map(Requirement, lines)
            if requirement.marker and f'extra == "{extra}"' in str(requirement.marker)]


def installs_here(extra: str, environment: dict[str, str] | None = None) -> bool:
    """Whether `pip install -e '.[extra]'` installs the extra's packages on this machine (or on `environment`'s
    markers): not where pyproject.toml's markers keep them to other machines or Pythons."""
    markers = [requirement.marker for requirement in extra_requirements(extra)]
    return not markers or any(marker.evaluate({**(environment or {}), "extra": extra}) for marker in markers)


def wrong_version(distribution: str, extra: str) -> str | None:
    """The line refusing an installed `distribution` (or the package a dotted module belongs to) outside the versions
    its extra asks for, or None: an older one lacks the API the option calls (torchcodec before 0.16 has no
    decode_jpeg, and its import may fail before saying so)."""
    name = canonicalize_name(distribution.split(".")[0])
    for requirement in extra_requirements(extra):
        if canonicalize_name(requirement.name) == name and requirement.specifier:
            try:
                version = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                return None
            if not requirement.specifier.contains(version, prereleases=True):
                return (f"{requirement.name} {version} is installed, and [{extra}] asks for {requirement.specifier}: "
                        f"pip install -e '.[{extra}]'")
    return None


def this_machine() -> str:
    return f"{platform.system()} {platform.machine()}, Python {sys.version_info.major}.{sys.version_info.minor}"


RANGES = "_ranges_"  # in a config node: the valid values of its numeric keys, beside the keys themselves
FACTS = "_facts_"  # in an option's node: what it needs (options.py)


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
    defaults = compose(hydra_cfg.job.config_name, overrides=choices)
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
    alone = compose(run.job.config_name, overrides=[f"{group}={run.runtime.choices[group]}"])[group]
    given, alone = (OmegaConf.to_container(each, resolve=False) for each in (node, alone))
    return {key for key in node if f"{group}.{key}" in named or given.get(key) != alone.get(key)}


def linear_lr(base: float, reference_batch: int, *, _root_) -> float:
    """`base` per `reference_batch` images of the global batch, train.batch_size times the processes of the job
    (torchrun's WORLD_SIZE): the linear scaling rule of Goyal et al. (arXiv:1706.02677)."""
    return base * _root_.train.batch_size * int(os.environ.get("WORLD_SIZE", 1)) / reference_batch


CROP_SHARE = 0.875  # of the validation image's shorter side that its centre crop keeps: ImageNet's 224 of 256


def resize_for(crop_size: int) -> int:
    """data.val_resize where none is set: the shorter side whose centre crop of `crop_size` keeps CROP_SHARE of it."""
    return round(crop_size / CROP_SHARE)


NO_RENDEZVOUS_ID = "none"  # what torchrun sets TORCHELASTIC_RUN_ID to when the job was given no --rdzv-id


def run_name() -> str:
    """The run folder's name: torchrun's rendezvous id, the same on every rank, or the start time."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", NO_RENDEZVOUS_ID)
    return f"torchrun-{run_id}" if run_id != NO_RENDEZVOUS_ID else time.strftime("%Y-%m-%d/%H-%M-%S")


def rank_suffix() -> str:
    """'' on rank 0, '-rank<N>' elsewhere: each rank's log file name."""
    rank = int(os.environ.get("RANK", 0))
    return f"-rank{rank}" if rank else ""


def rank_label() -> str:
    """'' on rank 0, '[rank <N>]' elsewhere: a log line's origin on a console every process writes to."""
    rank = int(os.environ.get("RANK", 0))
    return f"[rank {rank}]" if rank else ""


# The resolvers train.yaml and the recipes use, registered with the functions: every entry point imports this
# module before it composes a config.
OmegaConf.register_new_resolver("run_name", run_name, replace=True)
OmegaConf.register_new_resolver("rank_suffix", rank_suffix, replace=True)
OmegaConf.register_new_resolver("rank_label", rank_label, replace=True)
OmegaConf.register_new_resolver("linear_lr", linear_lr, replace=True)
OmegaConf.register_new_resolver("resize_for", resize_for, replace=True)
