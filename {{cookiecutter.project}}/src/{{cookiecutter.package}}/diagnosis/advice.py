"""The records advice is made of: a `Suggestion` (a switch, why, and the fact behind it) and the `Settings` of the
run it is for, so that it names only switches not flipped already."""
from dataclasses import asdict, dataclass, field

from .. import options


@dataclass(frozen=True, kw_only=True)
class Suggestion:
    """One switch to flip, why, and the fact that makes it apply on this machine."""
    key: str  # a config key or group
    value: str | None  # what to set it to; None where no single value fits (a larger train.batch_size)
    why: str  # what flipping it changes
    fact: str  # the measurement or hardware fact behind it
    side: str  # data | host | compute: the share of the step it shortens
    tunable: bool = True  # changes how fast, never what is learned: tune may trial it
    also: dict[str, str] = field(default_factory=dict)  # switches that go with it (format=tensor: decoder=none)
    # The devices (cpu, cuda) its tests have passed on, where not every one: an option's from its facts' passed_on,
    # others' where they are made. The verdict withholds it elsewhere.
    passed_on: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.passed_on is None and self.key in options.options_groups() and self.value is not None:
            object.__setattr__(self, "passed_on", options.facts(self.key, self.value).passed_on or None)

    def passed(self, device: str) -> bool:
        return self.passed_on is None or device in self.passed_on

    @property
    def change(self) -> dict[str, str]:
        """The overrides it stands for; empty for a direction without a value."""
        return {self.key: self.value, **self.also} if self.value is not None else {}

    def line(self) -> str:
        switch = " ".join(f"{key}={value}" for key, value in self.change.items())
        return f"{self.why}{': ' + switch if switch else ''} ({self.fact})."

    def record(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class Settings:
    """The options the advice refers to, so that it names only switches not flipped already."""
    num_workers: int
    prefetch_factor: int
    pin_memory: bool
    persistent_workers: bool
    batch_size: int = 64
    log_every: int = 20
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    cuda_graphs: bool = False  # model.compile_mode records the step as CUDA graphs
    graphs_refused: str | None = None  # why this run could not replay CUDA graphs (loop/compile.py), if it could not
    cudnn: str = "default"
    crop_size: int = 224  # the training crop's (final) side
    pack_fits: str | None = None  # the fact that the pixel pack it reads in loader workers fits in the device's memory
    choices: dict[str, str] = field(default_factory=dict)  # group -> option picked

    def option(self, group: str) -> str:
        """The run's option of `group` (its default, where the run did not say)."""
        return self.choices.get(group) or options.default(group)

    def facts(self, group: str) -> options.Facts:
        """The facts of the run's option of `group`."""
        return options.facts(group, self.option(group))
