"""Start-up checks and building from config, so a bad command line costs one clear line, not a traceback."""
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf


class ClearError(Exception):
    """An error whose message says all the user needs; the entry points print it as one line, no traceback."""


class ConfigError(ClearError):
    """A mistake in the command line, the config or the input paths."""


def optional_import(module: str, extra: str) -> ModuleType:
    """Import a backend's package where the backend is built, or refuse in one line naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ConfigError(f"{module} is not installed ({err}): pip install -e '.[{extra}]'") from None


def build(node: DictConfig, **runtime: Any) -> Any:
    """The node's target called with its config values and the runtime objects.

    The runtime objects are passed to the call, not through instantiate, which would turn a dataclass
    such as World into a DictConfig; a ConfigError raised by the target reaches the caller as itself.
    """
    return instantiate(node, _partial_=True)(**runtime)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


def _kind(default: Any) -> tuple[str, tuple[type, ...]] | None:
    if isinstance(default, bool):
        return "true or false", (bool,)
    if isinstance(default, int):
        return "a whole number", (int,)
    if isinstance(default, float):
        return "a number", (int, float)
    return None


AUTO_KEYS = {"loader.num_workers"}  # whole numbers that may also be measured at start-up


def check(cfg: DictConfig) -> None:
    """Refuse a missing value, or an override whose type differs from the default of its key.

    Without a schema, Hydra takes `optim.lr=abc` as the string 'abc'; comparing against the
    same options composed without the user's values catches that for every key of every group.
    """
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} has no value: pass {missing[0]}=...")
    hydra_cfg = HydraConfig.get()
    choices = [f"{group}={option}" for group, option in hydra_cfg.runtime.choices.items()
               if not group.startswith("hydra") and option is not None]
    defaults = compose(hydra_cfg.job.config_name, overrides=choices)
    plain = OmegaConf.to_container(defaults, resolve=False)
    for key, default in _leaves({k: v for k, v in plain.items() if k != "hydra"}):
        kind = _kind(default)
        value = OmegaConf.select(cfg, key)
        if key in AUTO_KEYS and value == "auto":
            continue
        if kind and value is not None and (isinstance(value, bool) != (bool in kind[1])
                                           or not isinstance(value, kind[1])):
            raise ConfigError(f"{key}={value!r} is not {kind[0]}, as its default {default!r} is")
