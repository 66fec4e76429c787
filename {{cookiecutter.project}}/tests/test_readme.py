"""The pages a user reads, README.md and docs/*.md, whatever their edits have made of them: every relative link leads
to a file and heading that exist, and every training or tune command their bash blocks show passes the start-up
checks. A page without links or commands has nothing to check. What the pages hold (the first screen, the contents,
short paragraphs) is the template's to check, in its own tests."""
import re
import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.errors import ConfigError

from helpers.pages import broken_links, commands
from helpers.paths import CONF, PACKAGE, PROJECT
from helpers.runs import hydra_run

PAGES = [page for page in [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))] if page.exists()]
ENTRIES = ("train", "tune")  # the commands whose config options.check() checks at start-up
# The measurements' commands (docs/benchmarks.md, a dozen long sweeps) are the full tier's: the fast one checks
# those a user starts from.
MEASURED = ("benchmarks.md",)


def tier(page) -> list:
    return [pytest.mark.full] if page.name in MEASURED else []


# A command that reads a config folder of the user's own (--config-dir) is left out: the tests cannot have it.
DOCUMENTED = [pytest.param(command, id=f"{page.name}:{line}", marks=tier(page)) for page in PAGES
              for line, command in commands(page.read_text(), *(f"{PACKAGE}.{entry}" for entry in ENTRIES))
              if not re.search(r"(^|\s)(--config-dir|-cd)\b", command)]
HYDRA_OWN = ("hydra.", "hydra/")  # the run folder and the launcher: Hydra's own settings, not the run's
# The other commands with a config of their own (export's in its own folder): what they show must compose.
CONFIGS = {path.stem: path.parent for path in [*CONF.glob("*.yaml"), *CONF.glob("*/*.yaml")]
           if path.stem not in ENTRIES and path.parent.name in (CONF.name, path.stem)}
COMPOSED = [pytest.param(command, id=f"{page.name}:{line}", marks=tier(page)) for page in PAGES
            for line, command in commands(page.read_text(), *(f"{PACKAGE}.{name}" for name in CONFIGS))]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    assert broken_links(page) == []


def runs(words: list[str], paths: dict[str, str]) -> list[list[str]]:
    """The overrides of each run a command line starts: one, or with --multirun one per value of its longest sweep,
    the i-th run taking each sweep's i-th value (its last, where it has fewer). Hydra's own settings are left out, and
    the keys in `paths` get this machine's paths instead of the user's."""
    multirun = "--multirun" in words or "-m" in words
    given = [f"{key}={paths[key]}" if key in paths else word for word in words
             if word not in ("--multirun", "-m") and not word.startswith(HYDRA_OWN) for key in [word.split("=")[0]]]
    if not multirun:
        return [given]
    parsed = OverridesParser.create().parse_overrides(given)
    values = [[f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
              if override.is_sweep_override() else [override.input_line] for override in parsed]
    return [[each[min(index, len(each) - 1)] for each in values] for index in range(max(map(len, values), default=1))]


@pytest.mark.parametrize("command", DOCUMENTED)
def test_every_documented_training_and_tune_command_passes_the_start_up_checks(command, tiny_root, packs, tmp_path):
    """As the command line would start it, on the tests' tiny tree (data.root) and its pack (format.path), each
    <placeholder> one word. An option whose package is not installed here skips, with the install command."""
    words = shlex.split(re.sub(r"<[^<>\n]*>", "placeholder", command), comments=True)
    start = next(index for index, word in enumerate(words)
                 if word == "-m" and words[index + 1] in {f"{PACKAGE}.{entry}" for entry in ENTRIES})
    entry, overrides = words[start + 1].rpartition(".")[2], words[start + 2:]
    format_ = next((word[7:] for word in reversed(overrides) if word.startswith("format=")), options.default("format"))
    paths = {"data.root": str(tiny_root), "format.path": str(packs.get(format_, tmp_path / "no-pack"))}
    for overrides in runs(overrides, paths):
        with hydra_run(entry, overrides, tmp_path) as cfg:
            try:
                options.refuse_missing_packages(cfg)
            except ConfigError as missing:
                pytest.skip(str(missing))
            options.check(cfg)


@pytest.mark.parametrize("command", COMPOSED)
def test_every_other_documented_command_composes(command, tmp_path):
    """evaluate, predict, export, bench, pack and gpu_check as a page shows them: each key and option exists in
    that command's config, each <placeholder> one word."""
    words = shlex.split(re.sub(r"<[^<>\n]*>", "placeholder", command), comments=True)
    start = next(index for index, word in enumerate(words)
                 if word == "-m" and words[index + 1] in {f"{PACKAGE}.{name}" for name in CONFIGS})
    entry = words[start + 1].rpartition(".")[2]
    for overrides in runs(words[start + 2:], {}):
        with hydra_run(entry, overrides, tmp_path, CONFIGS[entry]):
            pass


def test_a_sweep_is_checked_value_by_value_and_paths_are_this_machines():
    paths = {"data.root": "/tiny"}
    assert runs(["data.root=/data/mine", "hydra.run.dir=out", "precision=fp32"], paths) == [["data.root=/tiny",
                                                                                            "precision=fp32"]]
    assert runs(["--multirun", "hydra/launcher=slurm", "a=1,2,3", "b=x,y", "c=z"], paths) == [
        ["a=1", "b=x", "c=z"], ["a=2", "b=y", "c=z"], ["a=3", "b=y", "c=z"]]
