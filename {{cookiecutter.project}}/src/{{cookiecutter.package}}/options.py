"""What an option says about itself, declared once, under `_facts_` in its YAML file beside its settings:

    _facts_:
      gpu: decodes whole batches on the GPU   # why it wants a GPU (absent: it runs anywhere)
      without_gpu: {on_cpu: true}             # the settings that run it without one, if any
      bench_without_gpu: false                # whether bench times it that way (a test path is not worth it)
      extra: torchcodec                       # pip install -e '.[torchcodec]' ...
      module: torchcodec                      # ... installs this module
      distribution: turbojpeg                 # the module must be this distribution's (another installs one of that
      bundles: libturbojpeg                   # name), and its files must hold this library: turbojpeg's facts

and what it can do, which generic code asks instead of naming it (absent: false):
      decode_us: 1180          # a CPU decoder's cost per training image, one process (scripts/decode_cost.py)
      takes_pixels: true       # a decoder for stores of decoded pixels
      packed: true             # a format read from what `pack` wrote
      packed_for_storage: true # ... whose long reads suit slow storage
      holds_pixels: true       # ... which holds decoded pixels
      reads_runs: true         # ... whose records sit end to end: a run of them is one request
      copies_to_ram: true      # a staging that copies the data into RAM
      on_device: true          # a staging that holds a pixel pack in the device's memory and makes the batches there
      passed_on: [cpu]         # the devices (cpu, cuda) its tests have passed on, where not every one: advised there alone
      in_runs: true            # an order that reads runs of consecutive records at once (formats that reads_runs)
      overlaps_copy: true      # a prefetcher that copies the next batch while the step computes
      ceiling: true            # ... that replays one batch: the compute ceiling, not a way to train
      streams: into its cache  # a format that streams its data itself (how, in words): nothing to stage
      remote: true             # a format pack can write to, and training read from, object storage (s3://)
      built_in: true           # a data set that needs no path: written once, on first use
      followed: true           # a logger whose `file` in the run folder shows each window as it ends

Building an option whose module is missing refuses in one line with the install command (config.build);
tests, bench and the report's advice read the rest from here, so a new option needs no edit elsewhere.
"""
import functools
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .core import resolvers  # noqa: F401 - registers the resolvers the YAML files under CONF use
from .core.config import FACTS, check_values
from .core.errors import ConfigError
from .core.packages import not_from, not_installed, wrong_version

CONF = Path(__file__).resolve().parent / "conf"  # the entry points' config_path, shipped in the wheel
PACKAGE = __package__  # the import name, in the commands the tools run


@dataclass(frozen=True)
class Facts:
    gpu: str | None = None
    without_gpu: dict = field(default_factory=dict)
    bench_without_gpu: bool = False
    extra: str | None = None
    module: str | None = None
    distribution: str | None = None
    bundles: str | None = None
    decode_us: float | None = None
    region_decode: bool = False
    takes_pixels: bool = False
    packed: bool = False
    packed_for_storage: bool = False
    holds_pixels: bool = False
    reads_runs: bool = False
    copies_to_ram: bool = False
    on_device: bool = False
    passed_on: tuple[str, ...] = ()
    in_runs: bool = False
    overlaps_copy: bool = False
    ceiling: bool = False
    streams: str | None = None
    remote: bool = False
    built_in: bool = False
    followed: bool = False

    def missing(self) -> str | None:
        """Why this option cannot be built here for want of its package, and what to do, or None."""
        if not self.module:
            return None
        if not importable(self.module):
            return not_installed(self.module, self.extra)
        if why := wrong_version(self.distribution or self.module, self.extra):
            return why
        why = not_from(self.module, self.distribution, self.bundles)
        return not_installed(self.distribution, self.extra, f" ({why})") if why else None

    def passed(self, device: str) -> bool:
        """Whether its tests have passed on `device` (cpu, cuda): where its facts name no device, on every one."""
        return not self.passed_on or device in self.passed_on

    def overrides_without_gpu(self, group: str) -> list[str]:
        return [f"{group}.{key}={str(value).lower() if isinstance(value, bool) else value}"
                for key, value in self.without_gpu.items()]


def importable(module: str) -> bool:
    """Whether `module`, dotted or not, is installed. The whole name is looked up: CUDA wheels (torch's among them)
    install into an `nvidia` namespace package, which says nothing about whether nvidia.dali is there."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@functools.cache  # read at every suggestion; the files do not change while a process runs
def facts(group: str, option: str) -> Facts:
    return facts_of(OmegaConf.load(CONF / group / f"{option}.yaml"))


def facts_of(node: DictConfig) -> Facts:
    """The facts a composed option carries: its YAML's, or those of a user's own option in --config-dir."""
    declared = node.get(FACTS)
    return Facts(**OmegaConf.to_container(declared)) if declared is not None else Facts()


def name_of(group: str, node: DictConfig) -> str:
    """The option of `group` a composed node comes from, found by what it builds: for messages."""
    return next((option for option in options(group)
                 if OmegaConf.load(CONF / group / f"{option}.yaml").get("_target_") == node.get("_target_")),
                str(node.get("_target_")))


def having(group: str, fact: str) -> list[str]:
    """The options of `group` whose facts say `fact`."""
    return [option for option in options(group) if getattr(facts(group, option), fact)]


def only(group: str, fact: str) -> str:
    """The one option of `group` whose facts say `fact` (the format that holds pixels, the decoder that takes them):
    where two said it, picking one would be the alphabet's choice, so that is refused instead."""
    holding = having(group, fact)
    if len(holding) != 1:
        raise ConfigError(f"the {group} options {', '.join(holding) or '(none)'} declare the fact {fact}, which "
                          f"exactly one {group} option must: keep it in one of their conf/{group}/*.yaml _facts_")
    return holding[0]


@functools.cache  # asked for every group at every start; parsing train.yaml each time cost 70 ms a group
def default(group: str) -> str | None:
    """The option train.yaml's defaults list picks for `group`."""
    for entry in OmegaConf.load(CONF / "train.yaml").defaults:
        if isinstance(entry, DictConfig) and group in entry:
            return entry[group]
    return None


def picked_by_default(group: str) -> bool:
    """Whether this run's option of `group` is train.yaml's default, which no one named: not on the command line
    (`group=...`), not by a recipe. False outside a run Hydra started, where a config composed in code names its
    choices."""
    if not HydraConfig.initialized():
        return False
    run = HydraConfig.get()
    named = any(override.split("=")[0] == group for override in run.overrides.task)
    return not named and run.runtime.choices.get(group) == default(group)


def unavailable(group: str, node: DictConfig) -> str | None:
    """The line refusing the option `node` where its package is missing here, naming it and the install command, or
    None. A CPU decoder's line also names the fastest CPU decoder installed, which decodes the same images."""
    if not (missing := facts_of(node).missing()):
        return None
    instead = (f"; or pick decoder={fastest_cpu_decoder()}, the fastest CPU decoder installed here"
               if facts_of(node).decode_us else "")
    return f"{group}={name_of(group, node)}: {missing}{instead}"


def check(cfg: DictConfig) -> None:
    """Every command's start-up check: each key and value (core/config.py), then every option it picked has its
    packages; each refusal is one line."""
    check_values(cfg)
    refuse_missing_packages(cfg)


def refuse_missing_packages(cfg: DictConfig) -> None:
    """Stop a run before any work where an option it picked needs a package that is not installed (`unavailable`). A
    default no one named is left to give way instead (data/fit.py: usable_decoder)."""
    for group in options_groups():
        node = cfg.get(group)
        if isinstance(node, DictConfig) and not picked_by_default(group) and (refusal := unavailable(group, node)):
            raise ConfigError(refusal)


def options_groups() -> list[str]:
    """The option groups: the folders of the config tree."""
    return sorted(path.name for path in CONF.iterdir() if path.is_dir())


def fastest_cpu_decoder() -> str:
    """Of the CPU decoders installed here, the one whose facts' measured cost per training image (decode_us) is the
    least: advice names only what this machine can run."""
    return min((facts("decoder", name).decode_us, name) for name in having("decoder", "decode_us")
               if not facts("decoder", name).missing())[1]


def gpu_options(group: str) -> list[str]:
    return [option for option in options(group) if facts(group, option).gpu]
