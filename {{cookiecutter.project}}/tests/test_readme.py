"""The README a new user reads top-down: its first screen, "your own data in five commands", works on a class-folder
tree as written, and its contents list every section."""
import re
import shlex

from helpers.paths import PACKAGE, PROJECT
from helpers.runs import hydra_run, summary, tiny

from {{ cookiecutter.package }}.options import check

README = (PROJECT / "README.md").read_text()


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def first_screen() -> list[str]:
    """The commands of the first section's code block, without their comments."""
    block = section("Your own data in five commands").split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def github_anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_the_readme_starts_with_your_own_data_in_five_commands():
    assert re.findall(r"^## (.+)$", README, re.M)[0] == "Your own data in five commands"
    commands = first_screen()
    assert len(commands) == 5
    assert commands[0] == "pip install -e '.[dev]'"
    assert commands[1].startswith(f"python -m {PACKAGE}.train ") and commands[3].startswith(f"python -m {PACKAGE}.tune ")
    assert commands[2].startswith("tensorboard --logdir outputs") and "command.txt" in commands[4]


def own_data_overrides(command: str) -> tuple[str, ...]:
    """The command's overrides, its data.root left to tiny() to point at the tests' class-folder tree."""
    return tuple(word for word in shlex.split(command)[3:] if not word.startswith("data.root="))


def test_the_first_screen_trains_on_a_class_folder_tree_and_ends_with_the_report(train_cli, tmp_path):
    overrides = own_data_overrides(first_screen()[1])
    result = train_cli(tmp_path / "run", *overrides)
    assert "==== where the time went ====" in result.stdout + result.stderr
    assert summary(tmp_path / "run").choices["data"] == "folder"


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
