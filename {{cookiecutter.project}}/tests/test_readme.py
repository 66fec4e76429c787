"""The README a new user reads top-down: its first screen, "your own data in five commands", works on a class-folder
tree as written, and its contents list every section. It stays one screen that maps the project, and the pages under
docs/ hold the rest in short paragraphs, every link of either leading to a file that exists."""
import re
import shlex

import pytest

from {{ cookiecutter.package }}.options import check

from helpers.paths import PACKAGE, PROJECT
from helpers.runs import hydra_run, tiny

README = (PROJECT / "README.md").read_text()
DOCS = sorted((PROJECT / "docs").glob("*.md"))
PAGES = [PROJECT / "README.md", *DOCS]
MAX_LINES = 300
MAX_WORDS = 60
# Pages whose paragraphs may run long, each with its reason. A page here that has no long paragraph left fails, so
# that it leaves this table once it is reflowed.
LONG_PARAGRAPHS_ALLOWED = {}


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def first_screen() -> list[str]:
    """The commands of the first section's code block, without their comments."""
    block = section("Your own data in five commands").split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def github_anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_the_readme_starts_with_your_own_data_in_five_commands():
    assert re.findall(r"^## (.+)$", README, re.M)[:2] == ["First steps", "Your own data in five commands"]
    commands = first_screen()
    assert len(commands) == 5
    assert commands[0] == "pip install -e ."
    assert commands[1].startswith(f"python -m {PACKAGE}.train ") and commands[3].startswith(f"python -m {PACKAGE}.tune ")
    assert commands[2].startswith("tensorboard --logdir outputs") and "command.txt" in commands[4]


def own_data_overrides(command: str) -> tuple[str, ...]:
    """The command's overrides, its data.root left to tiny() to point at the tests' class-folder tree."""
    return tuple(word for word in shlex.split(command)[3:] if not word.startswith("data.root="))


def test_the_first_screen_trains_on_a_class_folder_tree_and_ends_with_the_report(train_in_process, caplog):
    caplog.set_level("INFO")
    overrides = own_data_overrides(first_screen()[1])
    assert train_in_process(*overrides).choices["data"] == "folder"
    assert "==== where the time went ====" in caplog.text


def test_the_first_screen_tune_command_passes_the_checks(cache_dir, tiny_root, tmp_path):
    with hydra_run("tune", tiny(own_data_overrides(first_screen()[3]), cache_dir, tiny_root), tmp_path) as cfg:
        check(cfg)
    assert cfg.data.root == str(tiny_root)


def test_the_contents_list_every_section_in_order_with_its_anchor():
    listed = re.findall(r"^- \[(.+)\]\(#([\w-]+)\)$", section("Contents"), re.M)
    headings = [title for title in re.findall(r"^## (.+)$", README, re.M) if title != "Contents"]
    assert [title for title, _ in listed] == headings
    assert all(anchor == github_anchor(title) for title, anchor in listed), listed


def test_the_recipe_translation_command_passes_the_checks(cache_dir, tiny_root, tmp_path):
    block = (PROJECT / "docs/coming-from.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    overrides = own_data_overrides(block.strip())
    with hydra_run("train", tiny(overrides, cache_dir, tiny_root), tmp_path) as cfg:
        check(cfg)
    assert cfg.train.ema_decay == 0.9998 and cfg.train.mixup_alpha == 0.2 and cfg.augment.num_magnitude_bins == 31


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code spans, where brackets and hashes are not Markdown."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def paragraphs(text: str) -> list[str]:
    """A page's prose paragraphs: runs of lines between blank lines, outside fenced code blocks, leaving out table
    rows and headings. Each list item (a line starting with "- ", "* " or "1. ") is a paragraph of its own."""
    found, lines = [], []
    for line in without_code_blocks(text).splitlines() + [""]:
        if re.match(r"\s*([-*]|\d+\.) ", line) or not line.strip() or line.lstrip().startswith(("|", "#")):
            found += [" ".join(lines)] if lines else []
            lines = []
        if line.strip() and not line.lstrip().startswith(("|", "#")):
            lines.append(line.strip())
    return found


def links(text: str) -> list[str]:
    """Every Markdown link's target that is not on the web."""
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", prose(text))
            if not re.match(r"[a-z]+:", target)]


def anchors(page) -> set[str]:
    return {github_anchor(title) for title in re.findall(r"^#{1,6} (.+)$", without_code_blocks(page.read_text()), re.M)}


def test_the_readme_is_one_screen():
    lines = len(README.splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines, more than {MAX_LINES}: move the detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_paragraph_runs_past_60_words(page):
    long = [paragraph for paragraph in paragraphs(page.read_text()) if len(paragraph.split()) > MAX_WORDS]
    if page.name in LONG_PARAGRAPHS_ALLOWED and page.parent.name == "docs":
        assert long, f"docs/{page.name} has no paragraph over {MAX_WORDS} words: take it out of LONG_PARAGRAPHS_ALLOWED"
    else:
        assert not long, [f"{len(paragraph.split())} words: {paragraph[:80]}..." for paragraph in long]


def test_the_paragraph_rule_counts_prose_and_leaves_out_code_tables_and_headings():
    text = "# " + "title " * 70 + "\n\n```\n" + "code " * 70 + "\n```\n\n| " + "cell " * 70 + "|\n\n- a\n- b c\nd\n\ne f\n"
    assert paragraphs(text) == ["- a", "- b c d", "e f"]


def command_modules() -> list[str]:
    """The package's commands: each top-level module that runs as `python -m <package>.<name>`."""
    return sorted(path.name for path in (PROJECT / "src" / PACKAGE).glob("*.py")
                  if 'if __name__ == "__main__":' in path.read_text())


def test_the_code_names_every_command_module_and_every_package():
    code = section("The code")
    assert {"train.py", "evaluate.py", "predict.py", "export.py", "tune.py", "bench.py"} <= set(command_modules())
    assert [name for name in command_modules() if f"`{name}`" not in code] == []
    packages = sorted({path.parent.name for path in (PROJECT / "src" / PACKAGE).glob("*/*.py")})
    assert "core" in packages and [name for name in packages if f"`{name}/`" not in code] == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(PROJECT / target.split("#")[0]).resolve() for target in links(README)}
    assert len(DOCS) >= 10 and [page.name for page in DOCS if page.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in links(page.read_text()):
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        if not found.exists() or (anchor and found.suffix == ".md" and anchor not in anchors(found)):
            broken.append(target)
    assert broken == []


def test_each_docs_page_opens_with_its_commands():
    """A topic page starts with its title, then a bash block of the commands it is about."""
    topics = [page for page in DOCS if page.name != "benchmarks.md"]
    assert [page.name for page in topics if not re.match(r"# .+\n\n```bash\n", page.read_text())] == []
