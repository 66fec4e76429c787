"""Optional backends: import one where its extra is installed, or refuse in one line with the command that installs it
(or the reason this machine cannot have it)."""
import importlib
import importlib.util
import platform
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .errors import ConfigError

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
