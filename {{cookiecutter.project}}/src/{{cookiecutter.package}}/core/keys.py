"""Which keys a run's config knows, and what a key without a value wants: for config.check_values at start-up.

Hydra adds any key given with `+` and has no schema; the options a run picks, composed without the user's values,
declare every key the code reads, and the comment on a `???` line says what to give.
"""
import difflib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


def has(tree: Any, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def unknown_added(hydra_cfg: DictConfig, plain: dict, choices: list[str]) -> str | None:
    """The line refusing a key that `+key=value` (or `++`) adds and that no part of the project reads, or None. The
    options picked (`plain`, composed from `choices`) declare every key their code takes. A key another option of its
    group declares names that option; any other names the closest known key."""
    for override in hydra_cfg.overrides.task:
        key, _, value = override.lstrip("+").partition("=")
        if not override.startswith("+") or key.split("@")[0] in hydra_cfg.runtime.choices or has(plain, key):
            continue  # a group added with + (a user's own), or a key an option declares
        group = key.split(".")[0]
        if hydra_cfg.runtime.choices.get(group) is not None:
            readers = options_reading(hydra_cfg.job.config_name, choices, group, key)
            if readers:
                which = " or ".join(filter(None, [", ".join(readers[:-1]), readers[-1]]))
                such = "" if len(readers) == 1 else "one, such as "
                return (f"+{key}: {group}={hydra_cfg.runtime.choices[group]} has no such key; "
                        f"{group}={which} reads it: pass {such}{group}={readers[0]} {key}={value}")
        known = [name for name, _ in leaves({k: v for k, v in plain.items() if k != "hydra"})
                 if not any(part.startswith("_") for part in name.split("."))]  # not _target_, _ranges_, _facts_
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]}?" if close else \
            f"python -m {__package__.split('.')[0]}.{hydra_cfg.job.name} --cfg job lists the keys"
        return f"+{key}: no such key; {hint}"
    return None


def options_reading(config_name: str, choices: list[str], group: str, key: str) -> list[str]:
    """The options of `group` that declare `key` (group.name), each named once: an option that
    only picks another (data=imagenet, the old name of data=folder) composes as that one and is left out."""
    others = [choice for choice in choices if choice.lstrip("+").split("=")[0] != group]
    readers, seen = [], []
    for option in GlobalHydra.instance().config_loader().get_group_options(group):
        node = OmegaConf.to_container(compose(config_name, overrides=[*others, f"{group}={option}"])[group],
                                      resolve=False)
        if node not in seen and has({group: node}, key):
            readers.append(option)
        seen.append(node)
    return readers


def wanted(hydra_cfg: DictConfig, key: str) -> str | None:
    """What a mandatory (???) key wants, as the comment on its line says: in the file of the option that holds it,
    or in the entry point's own config file, in the first config folder that has that file."""
    group, _, rest = key.partition(".")
    option = hydra_cfg.runtime.choices.get(group) if rest else None
    file, name = (f"{group}/{option}.yaml", rest) if option else (f"{hydra_cfg.job.config_name}.yaml", key)
    folders = [Path(source.path) for source in hydra_cfg.runtime.config_sources if source.schema == "file"]
    path = next((folder / file for folder in folders if (folder / file).is_file()), None)
    if path is None:
        return None
    nesting = []  # (indent, name) of the keys that enclose the current line
    for line in path.read_text().splitlines():
        found = re.match(r"( *)([\w-]+):([^#]*)(?:#\s*(.*))?$", line)
        if not found:
            continue
        while nesting and nesting[-1][0] >= len(found[1]):
            nesting.pop()
        nesting.append((len(found[1]), found[2]))
        if ".".join(part for _, part in nesting) == name:
            return found[4]
    return None
