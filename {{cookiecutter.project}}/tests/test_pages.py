"""The pages agree with the code, mechanically. Every key a command's config holds is in docs/switches.md with its
default; every pointer to a section finds it where it says; every `outputs/` path a page shows is the run folder its
command writes; and a defaults-list comment that names options of its group names all of them."""
import functools
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core import resolvers

from helpers.pages import github_anchor
from helpers.paths import CONF, PACKAGE, PROJECT

PAGES = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md")), PROJECT / "src" / PACKAGE / "data/README.md"]
SWITCHES = PROJECT / "docs/switches.md"


def switches_page() -> str:
    """docs/switches.md, where the project keeps it; a project that has let it go has no table to hold to the code."""
    if not SWITCHES.is_file():
        pytest.skip("docs/switches.md is not in this project: no table of keys to check")
    return SWITCHES.read_text()
OPTIONS_KEYS = "The options' keys"  # the heading of switches.md's table of the group options' keys
# Each command's config: conf/<command>.yaml, and export's in its own folder (its target= names the file formats it writes).
COMMANDS = {path.stem: path for path in [*sorted(CONF.glob("*.yaml")), CONF / "export/export.yaml"]}
# Every option of every group, but files that place their keys elsewhere (`# @package _global_` overlays such as
# experiment= and debug=, Hydra's launcher): the keys they set are other nodes'.
OPTION_FILES = sorted(path for path in CONF.glob("*/*.yaml")
                      if path not in COMMANDS.values() and not path.read_text().startswith("# @package"))


CODE_BLOCK = r"^```.*?^```"


def blanked(pattern: str, text: str, flags: int = 0) -> str:
    """`text` with what `pattern` matches blanked, every other character where it was."""
    return re.sub(pattern, lambda match: re.sub(r"[^\n]", " ", match.group()), text, flags=flags)


def without_code(text: str) -> str:
    """The page with its fenced code blocks and inline code spans blanked."""
    return blanked(r"`[^`\n]*`", blanked(CODE_BLOCK, text, re.M | re.S))


def headings(text: str) -> list[tuple[int, str]]:
    """(where it starts, its title without backticks) of each heading outside code blocks."""
    outside = blanked(CODE_BLOCK, text, re.M | re.S)
    return [(match.start(), text[match.start(1):match.end(1)].replace("`", ""))
            for match in re.finditer(r"^#{1,6} (.+)$", outside, re.M)]


def is_switch(key: str, value) -> bool:
    """Whether a config key is one a user sets: not Hydra's own, not a private `_target_`, `_ranges_` or `_facts_`,
    and not a list of overrides (gpu_check's stages are runs of its sweep, read in its file)."""
    overrides = isinstance(value, list) and value and all(isinstance(item, str) and "=" in item for item in value)
    return not (key.startswith("_") or key in ("hydra", "defaults") or overrides)


def written(node: yaml.Node, prefix: str = "") -> dict[str, str]:
    """Each switch of a YAML mapping, dotted, with its default as the file writes it: a scalar's text, a list's as
    [a, b]."""
    found = {}
    for key, value in node.value:
        items = [item.value for item in value.value] if isinstance(value, yaml.SequenceNode) else value.value
        if not is_switch(key.value, items):
            continue
        if isinstance(value, yaml.MappingNode):
            found.update(written(value, f"{prefix}{key.value}."))
        else:
            found[f"{prefix}{key.value}"] = f"[{', '.join(items)}]" if isinstance(items, list) else items
    return found


def defaults(path: Path, prefix: str = "") -> dict[str, str]:
    return written(yaml.compose(path.read_text()), prefix)


def composed_keys(node: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in node.items():
        if is_switch(key, value):
            keys |= composed_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return keys


def key_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """The rows of each table with `key` and `default` columns, by the heading the table stands under; each row maps
    a column's name to its cell."""
    tables, heading, header = {}, None, None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip().replace("`", "")
        elif not line.startswith("|"):
            header = None
        elif header is None:
            header = [cell.strip() for cell in line.strip("|").split("|")]
        elif not re.match(r"\|[-:| ]+\|$", line) and {"key", "default"} <= set(header):
            tables.setdefault(heading, []).append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))))
    return tables


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def shows(cell: str, value: str) -> bool:
    """Whether a default cell shows `value` whole: 8.0 is not shown by 18.0, nor -1 by 1."""
    return re.search(rf"(?<![\w.\-]){re.escape(value)}(?!\w|\.\d)", cell.replace("`", "")) is not None


@pytest.fixture
def as_a_user_sees_it(monkeypatch):
    """Paths under the home folder and the temporary folder as a page writes them: ~ and /tmp."""
    monkeypatch.setenv("HOME", "~")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)


@functools.cache  # each test reads it; its interpolations resolve when read, under the environment of that moment
def composed(command: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(COMMANDS[command].parent), version_base="1.3"):
        return compose(command)


def shown(default: str, cfg, key: str) -> str:
    """A default as a page shows it: an interpolation's value in the composed config, else as the file writes it."""
    return str(OmegaConf.select(cfg, key)) if "${" in default else default


@pytest.mark.parametrize("command", COMMANDS)
def test_every_key_a_command_composes_is_on_the_switches_page(command):
    on_page = {name for rows in key_tables(switches_page()).values() for row in rows for name in names(row["key"])}
    keys = composed_keys(OmegaConf.to_container(composed(command), resolve=False))
    assert sorted(keys - on_page) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_own_keys_are_under_its_heading_with_their_defaults(command, as_a_user_sees_it):
    rows = key_tables(switches_page()).get(command, [])
    cfg = composed(command)
    wrong = [f"{key}: {shown(default, cfg, key)}" for key, default in defaults(COMMANDS[command]).items()
             if not any(key in names(row["key"]) and shows(row["default"], shown(default, cfg, key)) for row in rows)]
    assert wrong == [], f"keys of conf/{COMMANDS[command].relative_to(CONF)} missing from the table under " \
                        f"'### {command}' of docs/switches.md, or shown there with another default"


def test_each_options_keys_are_on_the_switches_page_with_its_defaults(as_a_user_sees_it):
    rows = key_tables(switches_page())[OPTIONS_KEYS]
    train = OmegaConf.to_container(composed("train"))
    wrong = []
    for path in OPTION_FILES:
        group, option = path.parent.name, path.stem
        written_here = defaults(path, f"{group}.")
        cfg = OmegaConf.merge(train, {group: OmegaConf.load(path)}) if any(  # resolved as in a run that picks it
            "${" in default for default in written_here.values()) else None
        for key, default in written_here.items():
            value = shown(default, cfg, key)
            if not any(key in names(row["key"]) and option in names(row["options"]) and shows(row["default"], value)
                       for row in rows):
                wrong.append(f"{group}={option} {key}: {value}")
    assert wrong == []


def test_an_option_that_has_not_passed_its_tests_everywhere_says_so_in_its_row():
    """The advice holds such an option back where its tests have not passed (its facts' passed_on): its row says so."""
    rows = {(group, option): line for line in switches_page().splitlines()
            for group, option in re.findall(r"^\| `(\w+)` \| `(\w+)`", line)}
    held = [(group, option) for group in options.options_groups() for option in options.options(group)
            if options.facts(group, option).passed_on]
    assert [f"{group}={option}" for group, option in held if "passed_on" not in rows.get((group, option), "")] == []


def test_the_key_rules_read_a_table_as_written():
    text = "## t\n\n| key | options | default | meaning |\n|---|---|---|---|\n| `a.b`, `a.c` | `x` | 8.0, `null` | m |\n"
    row = key_tables(text)["t"][0]
    assert names(row["key"]) == ["a.b", "a.c"] and shows(row["default"], "8.0") and shows(row["default"], "null")
    assert not shows("18.0", "8.0") and not shows("-1", "1") and not shows("0.05", "0.0") and shows("5e-5.", "5e-5")
    node = yaml.compose("a: {b: 1.0e-3, _r: 1}\nc: [0.08, 1.0]\nd: [x=1, y=2]\nhydra: {run: 1}\n")
    assert written(node) == {"a.b": "1.0e-3", "c": "[0.08, 1.0]"}


NAMED = r"[\"“]([^\"”\n]+)[\"”]|\]\(#([\w-]+)\)"  # a quoted section title, or a link to an anchor on the page


def pointers(text: str) -> list[tuple[int, str, str]]:
    """(where, direction, the words around it) of each pointer to a section of the page: `see "Title"`, a
    parenthesis ending in below or above, and "the table below" or "the row above". Links to other pages are
    test_readme.py's to follow."""
    prose = without_code(text)
    found = [(match.start(), "see", match.group()) for match in re.finditer(r"\bsee [\"“][^\"”\n]+[\"”]", prose, re.I)]
    for match in re.finditer(r"\(([^()]*\b(below|above))\)", prose):
        found.append((match.start(), match.group(2), text[match.start():match.end()]))
    for match in re.finditer(r"\b(?:table|row)s? (below|above)\b", prose):
        if not any(start <= match.start() < start + len(words) for start, _, words in found):
            found.append((match.start(), f"table {match.group(1)}", sentence(text, match.start())))
    return sorted(found)


def sentence(text: str, where: int) -> str:
    start = max(text.rfind(". ", 0, where), text.rfind("\n\n", 0, where), text.rfind("|", 0, where)) + 1
    ends = [end for end in (text.find(". ", where), text.find("\n\n", where), text.find("|", where)) if end >= 0]
    return text[start:min(ends, default=len(text))]


def tables_between(text: str, where: int, edge: int) -> bool:
    """Whether a table begins between a pointer and an edge of its section, the table the pointer stands in aside."""
    low, high = sorted((where, edge))
    return any(low < start < high and not (start < where and "\n\n" not in text[start + 2:where])
               for start in (match.start() for match in re.finditer(r"(?:\A|\n\n)(?=\|)", text)))


def misplaced(text: str) -> list[str]:
    """The pointers of a page that name no section, or one that is not where they say. A table or row below (above)
    may go unnamed where a table of its section stands there, other than the one it is in."""
    titled = headings(text)
    wrong = []
    for where, direction, words in pointers(text):
        before = [title for start, title in titled if start < where]
        after = [title for start, title in titled if start > where]
        places = {"see": before + after, "below": after, "above": before, "table below": after,
                  "table above": before}[direction]
        named = [title or anchor for title, anchor in re.findall(NAMED, words)]
        if direction.startswith("table"):
            section = [start for start, _ in titled if (start > where) == direction.endswith("below")]
            edge = (min(section, default=len(text)) if direction.endswith("below") else max(section, default=0))
            if not named and tables_between(text, where, edge):
                continue  # the table is in this section, where a reader looks
        if not named or any(name not in places and name not in map(github_anchor, places) for name in named):
            wrong.append(words.strip())
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(PROJECT)))
def test_every_pointer_names_a_section_that_is_where_it_says(page):
    assert misplaced(page.read_text()) == []


def test_the_pointer_rule_finds_what_each_pointer_names():
    page = ("# P\n\n## Early\n\nSee \"Late\" and (\"Early\" above) and ([x](#late), below); not (below), not\n"
            "(see \"Gone\"), not (\"Early\", below). The table below.\n\n## Late\n\n| a |\n|---|\n| the row below |\n\n"
            "The table above.\n")
    assert misplaced(page) == ["(below)", "see \"Gone\"", "(\"Early\", below)", "The table below.", "the row below"]


CLOCK = {"%Y-%m-%d": "<date>", "%H-%M-%S": "<time>"}  # how pages write the parts of a run folder's time


def run_folders(monkeypatch) -> dict[str, list[str]]:
    """Each command's run folder as a page writes it, from its config's hydra.run.dir: <date> and <time> for the
    clock's parts, <id> for torchrun's rendezvous id."""
    folders = {}
    for command, path in COMMANDS.items():
        raw = OmegaConf.to_container(OmegaConf.load(path).hydra.run)["dir"]
        forms = []
        for run_id in (resolvers.NO_RENDEZVOUS_ID, "<id>"):
            with monkeypatch.context() as patch:  # run_name()'s folder, its time format left unformatted
                patch.setenv("TORCHELASTIC_RUN_ID", run_id)
                patch.setattr(resolvers.time, "strftime", lambda pattern, *_: pattern)
                folder = re.sub(r"\$\{now:([^}]*)\}", r"\1", raw.replace("${run_name:}", resolvers.run_name()))
            for part, word in CLOCK.items():
                folder = folder.replace(part, word)
            assert "${" not in folder and "%" not in folder, f"{command}: {raw} has a part pages cannot write"
            forms += [folder] if folder not in forms else []
        folders[command] = forms
    return folders


def as_pattern(folder: str) -> str:
    """A run folder's regular expression: the clock's parts as words or as digits, an <id> as any word in <>, after
    a prefix the launcher gives it (scripts/slurm.sh's slurm-<job id>)."""
    pattern = re.escape(folder).replace(re.escape("<date>"), r"(?:<date>|\d{4}-\d\d-\d\d)")
    pattern = pattern.replace(re.escape("<time>"), r"(?:<time>|\d\d-\d\d-\d\d)")
    return pattern.replace(re.escape("<id>"), r"[\w-]*<[^>]+>")


@functools.cache
def code_of(command: str) -> str:
    """The text of what a command runs: its module, its tools/ module or package, its config; for train, the package
    but tools/ and the other commands' modules."""
    package = PROJECT / "src" / PACKAGE
    if command == "train":
        files = [path for path in package.rglob("*.py") if path.relative_to(package).parts[0] != "tools"
                 and not (path.parent == package and path.stem in COMMANDS and path.stem != "train")]
    else:
        files = [package / f"{command}.py", *package.glob(f"tools/{command}.py"), *package.glob(f"tools/{command}/*.py")]
    return "\n".join(path.read_text() for path in [*files, COMMANDS[command]])


def shown_paths(text: str) -> list[str]:
    """Every path below outputs/ a page shows (outputs/ itself holds every command's folders)."""
    return [path.rstrip(".,;:") for path in re.findall(r"outputs/(?:<[^>\n]*>|[^\s`\"'()<>\[\]|])+", text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(PROJECT)))
def test_every_outputs_path_a_page_shows_is_a_run_folder_its_command_writes(page, monkeypatch):
    """Each path is a command's run folder as its config's hydra.run.dir makes it, and a file in it is one that
    command's code names: tune's command.txt is not in train's folder."""
    folders = run_folders(monkeypatch)
    wrong = []
    for path in shown_paths(page.read_text()):
        writers = [(command, match.group(1)) for command, forms in folders.items() for form in forms
                   if (match := re.fullmatch(rf"{as_pattern(form)}(?:/([^/]+).*)?", path))]
        if not any(file is None or re.search(rf"(?<![\w.]){re.escape(file)}(?!\w)", code_of(command))
                   for command, file in writers):
            wrong.append(path)
    assert wrong == [], f"no command's run folder, or a file its command does not write; the folders: {folders}"


def test_run_folders_come_from_each_commands_config(monkeypatch):
    folders = run_folders(monkeypatch)
    assert folders["train"] == ["outputs/<date>/<time>", "outputs/torchrun-<id>"]
    assert folders["tune"] == ["outputs/tune/<date>_<time>"]
    assert shown_paths("`outputs/torchrun-<rendezvous id>` (a plain run uses outputs/<date>/<time>), `outputs/`.") \
        == ["outputs/torchrun-<rendezvous id>", "outputs/<date>/<time>"]


def defaults_comments(path: Path) -> list[tuple[Path, str, str]]:
    """(the group's folder, the option picked, its comment and the comment lines under it) of each `group: option`
    entry of a config file's defaults list."""
    entries, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("defaults:"):
            inside = True
        elif inside and (entry := re.match(r"\s+- (?:override )?(/?[\w/]+): (\S+)\s*(?:#(.*))?$", line)):
            group, option, comment = entry.groups()
            folder = CONF / group[1:] if group.startswith("/") else path.parent / group
            entries.append((folder, option, comment or ""))
        elif inside and entries and re.match(r"\s+#", line):
            folder, option, comment = entries[-1]
            entries[-1] = (folder, option, f"{comment} {line.strip()[1:]}")
        elif inside and not line.startswith(" "):
            inside = False
    return [entry for entry in entries if entry[0].is_dir()]


CONFIGS = [path for path in sorted(CONF.rglob("*.yaml")) if re.search(r"^defaults:", path.read_text(), re.M)]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: str(path.relative_to(CONF)))
def test_a_defaults_comment_that_names_options_names_them_all(path):
    """A comment that lists a group's options by hand lists every one (the default aside), or it misleads."""
    wrong = []
    for folder, picked, comment in defaults_comments(path):
        offered = {option.stem for option in folder.glob("*.yaml")} - {picked}
        named = set(re.findall(r"\w+", comment)) & offered
        if named and named != offered:
            wrong.append(f"{folder.name}: {picked}  # {comment.strip()} leaves out {', '.join(sorted(offered - named))}")
    assert wrong == []
