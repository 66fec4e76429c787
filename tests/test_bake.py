"""Bake the template as a user would; then install the baked project, run its own tests and a real training run."""
import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter
from conftest import pages, venv_seeing_ours

JINJA_MARKS = ("{{", "{%", "cookiecutter.")


def bake(template: Path, output: Path, **answers: str) -> Path:
    return Path(cookiecutter(str(template), no_input=True, output_dir=str(output), extra_context=answers))


def leftover_jinja(project: Path) -> list[str]:
    hits = []
    for path in project.rglob("*"):
        if path.is_file():
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue  # an image, copied as it is
            hits += [f"{path.relative_to(project)}: {mark}" for mark in JINJA_MARKS if mark in text]
    return hits + [str(p) for p in project.rglob("*") if any(mark in p.name for mark in JINJA_MARKS)]


def test_default_bake_is_fully_rendered(template, tmp_path):
    project = bake(template, tmp_path)
    assert project.name == "fasttrain-project"
    assert (project / "src/fasttrain_project/train.py").is_file()
    assert leftover_jinja(project) == []


def test_custom_project_name_derives_the_package(template, tmp_path):
    project = bake(template, tmp_path, project="Vision-Lab")
    assert project.name == "Vision-Lab"
    assert (project / "src/vision_lab/train.py").is_file()
    assert "_target_: vision_lab.data.sources.synthetic" in (project / "src/vision_lab/conf/data/synthetic.yaml").read_text()
    assert 'name = "Vision-Lab"' in (project / "pyproject.toml").read_text()
    assert leftover_jinja(project) == []


def cookiecutter_cli(template: Path, output: Path, *answers: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cookiecutter", "--no-input", str(template), *answers,
                           "--output-dir", str(output)], capture_output=True, text=True, timeout=120)


def test_command_line_bake(template, tmp_path):
    result = cookiecutter_cli(template, tmp_path, "project=cli-bake")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cli-bake/src/cli_bake/train.py").is_file()
    assert "python -m cli_bake.train" in result.stdout  # the post-generation hook's next steps


def first_steps(text: str, package: str) -> list[str]:
    """The install, first-run and test commands in `text`, in order, without their comments."""
    commands = [line.split("#")[0].strip() for line in text.splitlines()]
    return [command for command in commands
            if command.startswith(("pip install -e", f"python -m {package}.train", "make test"))]


def test_the_readmes_and_the_bake_give_the_same_first_steps(template, tmp_path):
    """One first hour: a plain install to train, a first run named in full, then the tests, said alike by the
    template's README, the bake's closing lines and the baked README's first section."""
    result = cookiecutter_cli(template, tmp_path, "project=first-hour")
    assert result.returncode == 0, result.stderr
    readme = (template / "README.md").read_text().split("## Baking your own project\n", 1)[1].split("```", 2)[1]
    baked = (tmp_path / "first-hour/README.md").read_text()
    assert baked.split("\n## ")[1].startswith("First steps\n")
    said = {"template README": first_steps(readme.replace("fasttrain_project", "first_hour"), "first_hour"),
            "bake": first_steps(result.stdout, "first_hour"),
            "baked README": first_steps(baked.split("\n## ")[1], "first_hour")}
    assert said["bake"] == ["pip install -e .", "python -m first_hour.train experiment=cpu_quick",
                            "pip install -e '.[dev]' && make test"]
    assert said["template README"] == said["bake"] == said["baked README"], said
    pointed = re.findall(r'README\'s "(.+)"', result.stdout)
    assert pointed and all(f"\n## {title}\n" in baked for title in pointed), pointed


@pytest.mark.parametrize(("answer", "message"), [
    ("package=torch", "package 'torch' would shadow the module of the same name"),
    ("package=json", "package 'json' would shadow the module of the same name"),
    ("package=1st_try", "package '1st_try' is not a valid Python identifier"),
    ("package=my-pkg", "package 'my-pkg' is not a valid Python identifier"),
    ("package=class", "package 'class' is not a valid Python identifier"),
    ("project=", "project must not be empty"),
    ("project=   ", "project must not be empty"),
    ("project=my project", "project 'my project' must be letters, digits"),
])
def test_hook_refuses_bad_names(template, tmp_path, answer, message):
    output = tmp_path / "out"  # not there yet: an empty project name renders to this folder itself
    result = cookiecutter_cli(template, output, answer)
    assert result.returncode != 0
    assert f"fasttrain: {message}" in result.stderr
    assert not output.exists() or list(output.iterdir()) == [], "nothing is left behind"


@pytest.mark.full
def test_wheel_install_names_itself_and_runs_from_anywhere(template, tmp_path):
    """`pip install .` as a container image does it: the wheel carries conf/, and no file says the template's name."""
    project = bake(template, tmp_path, project="Quokka.Lab-7")
    leftovers = [f"{path.relative_to(project)}: {line.strip()}" for path in project.rglob("*") if path.is_file()
                 for line in path.read_text(errors="replace").splitlines() if "fasttrain" in line.lower()]
    assert leftovers == []

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(project)], check=True, timeout=300)
    python = venv_seeing_ours(tmp_path / "venv")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", *(tmp_path / "dist").glob("*.whl")],
                   check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "mine/data").mkdir(parents=True)  # a user's own option, next to the package's
    (elsewhere / "mine/data/few.yaml").write_text("defaults:\n  - synthetic\n  - _self_\n"
                                                  "train_per_class: 6\nval_per_class: 2\n")
    result = subprocess.run(
        [python, "-m", "quokka_lab_7.train", "--config-dir", "mine", "data=few", "hydra.run.dir=out",
         f"data.cache_dir={tmp_path / 'cache'}", "model.name=resnet18", "data.crop_size=32", "data.val_resize=40",
         "train.batch_size=8", "train.max_steps=4", "train.log_every=2", "loader.num_workers=0"],
        cwd=elsewhere, capture_output=True, text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr[-4000:]
    installed_at = subprocess.run([python, "-c", "import quokka_lab_7; print(quokka_lab_7.__file__)"],
                                  capture_output=True, text=True, check=True).stdout
    assert str(project) not in installed_at, "the run used the wheel, not the source tree"
    summary = json.loads((elsewhere / "out/summary.json").read_text())
    assert summary["steps"] == 4 and summary["choices"]["data"] == "few"
    assert len(list((tmp_path / "cache").rglob("*.JPEG"))) == 10 * (6 + 2), "the user's option set the sizes"


@pytest.fixture(scope="module")
def installed(template, tmp_path_factory):
    """A non-default bake, installed with `pip install -e` into a throwaway venv that sees this one's packages."""
    root = tmp_path_factory.mktemp("e2e")
    project = bake(template, root, project="e2e-check", package="e2e_check")
    python = venv_seeing_ours(root / "venv")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e",
                    str(project)], check=True, timeout=300)
    # Its .pyc files written once: where PYTHONDONTWRITEBYTECODE is set, each command line the tests start would
    # compile the package again.
    subprocess.run([python, "-m", "compileall", "-q", str(project / "src")], check=True, timeout=300)
    return project, python


# The baked project's tiers, each a pytest -m expression for its Makefile's `tier`: between them, all its tests.
TIERS = {"fast": "not full", "full": "full and not slow", "slow": "slow"}


@contextmanager
def as_its_user_left_it(project: Path) -> Iterator[list[str]]:
    """The project with its README rewritten to one line and every docs page that no other page links to deleted, as
    a user may leave them; the pages as baked are put back after. Yields the deleted pages' names."""
    kept = {page: page.read_bytes() for page in [project / "README.md", *(project / "docs").glob("*.md")]}
    (project / "README.md").write_text(f"# {project.name}\n")
    docs = sorted((project / "docs").glob("*.md"))
    linked = {target for page in docs for link in pages.links(page.read_text()) if link.split("#")[0]
              for target in [(page.parent / link.split("#")[0]).resolve()] if target != page.resolve()}
    unlinked = [page for page in docs if page.resolve() not in linked]
    for page in unlinked:
        page.unlink()
    try:
        yield [page.name for page in unlinked]
    finally:
        for page, text in kept.items():
            page.write_bytes(text)


@pytest.mark.parametrize("tier", [pytest.param("fast"), pytest.param("full", marks=pytest.mark.full),
                                  pytest.param("slow", marks=[pytest.mark.full, pytest.mark.slow])])
def test_baked_project_passes_its_own_tests(installed, tier, capsys):
    """The baked project's tier as its Makefile runs it, on every core; its slowest tests are printed on success too.

    The fast tier runs as a user may leave the pages, its README one line and the docs pages no other page links to
    deleted: the project is theirs once baked, and none of its tests may hold their pages to the template's (the
    template checks its own, tests/test_bake_pages.py). make test-base runs the same tier on the pages as baked, so
    every command they show is still checked."""
    project, python = installed
    with as_its_user_left_it(project) if tier == "fast" else nullcontext() as deleted:
        returncode, stdout, stderr = run_tier(project, ["make", "--no-print-directory", "tier", f"MARKS={TIERS[tier]}",
                                                        f"PYTHON={python}", "ARGS=-q --durations=30"])
    assert deleted is None or len(deleted) >= 1, "no docs page was left unlinked to delete"
    assert returncode == 0, stdout[-8000:] + stderr[-3000:]
    assert " passed" in stdout and " failed" not in stdout
    with capsys.disabled():
        print(f"\n---- the baked project's {tier} tier ----\n{where_the_time_went(stdout)}")


def run_tier(project: Path, command: list[str], timeout: float = 3600) -> tuple[int, str, str]:
    """The tier's exit code and output. Past `timeout`, every process it started is killed, and the test fails with
    what the tier printed until then: a hang inside must neither hold CI nor leave test processes on its cores."""
    tier = subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = tier.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(tier.pid, signal.SIGKILL)
        stdout, stderr = tier.communicate()
        pytest.fail(f"the tier ran past {timeout:.0f} s; what it printed:\n{stdout[-8000:]}{stderr[-3000:]}")
    return tier.returncode, stdout, stderr


def where_the_time_went(output: str) -> str:
    """Each pytest run's slowest tests and its closing line, from a tier's output."""
    durations = re.findall(r"^=+ slowest \d+ durations =+\n(?:[^=\n].*\n)*", output, re.M)
    closing = re.findall(r"^=* ?\d+ (?:passed|failed|deselected|skipped).* in [\d.]+s.*$", output, re.M)
    return "".join(durations) + "\n".join(closing)


REQUIRED_TAGS = {"time/data_ms", "time/host_ms", "time/compute_ms", "time/data_frac", "time/host_frac",
                 "throughput/images_per_s", "train/loss",
                 "train/lr", "val/top1", "val/top5", "val/top1_by_second", "sys/cpu_util", "sys/iowait", "sys/disk_read_mb_s"}
SUMMARY_KEYS = {"images_per_s", "data_ms", "host_ms", "compute_ms", "data_frac", "host_frac", "bound", "verdict",
                "advice", "val_top1", "val_top5", "steps", "skipped_files", "processes", "timing_rank", "choices", "env",
                "time_to_top1_s", "best_top1"}


@pytest.mark.full
def test_training_run_reports_where_the_time_went(installed, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    project, python = installed
    out = tmp_path / "out"
    result = subprocess.run(
        [python, "-m", "e2e_check.train", f"hydra.run.dir={out}", "train.max_steps=30",
         f"data.cache_dir={tmp_path / 'cache'}", "data.train_per_class=20", "data.val_per_class=5",
         "model.name=resnet18", "data.crop_size=64", "data.val_resize=73", "train.batch_size=16",
         "train.log_every=5"],
        cwd=project, capture_output=True, text=True, timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # a CPU run, whatever the machine has
    assert result.returncode == 0, result.stderr[-4000:]
    assert "==== where the time went ====" in result.stdout + result.stderr

    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["steps"] == 30 and summary["skipped_files"] == 0
    assert summary["images_per_s"] > 0 and 0 <= summary["data_frac"] <= 1
    assert summary["data_ms"] + summary["compute_ms"] > 0 and summary["host_ms"] == 0.0  # none on the CPU
    assert summary["bound"] in ("data", "compute") and summary["processes"] == 1
    assert summary["verdict"].startswith("Data loading is") and summary["advice"]
    defaults = {"data": "synthetic", "format": "folder", "decoder": "turbojpeg", "order": "random", "staging": "none",
                "augment": "none", "prefetcher": "none", "model": "torchvision", "optim": "sgd", "schedule": "warmup_cosine",
                "reduction": "allreduce", "logger": "tensorboard", "profiler": "none", "debug": "none"}
    groups = {folder.name for folder in (project / "src/e2e_check/conf").iterdir() if folder.is_dir()}
    # conf/export/ is the export command's own config folder, no group of training's
    assert set(defaults) == groups - {"experiment", "hydra", "export"}, "a new config group: name its default here"
    assert summary["choices"] == defaults
    assert summary["env"]["device"].startswith("cpu") and summary["env"]["torch"]
    assert 0 <= summary["val_top1"] <= summary["val_top5"] <= 100

    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert REQUIRED_TAGS <= tags, REQUIRED_TAGS - tags
    assert "sys/gpu_util" not in tags, "NVML is read only when the run has a GPU"
    for tag in REQUIRED_TAGS:
        values = [event.value for event in events.Scalars(tag)]
        assert values and all(math.isfinite(v) for v in values), tag
    assert [e.step for e in events.Scalars("time/data_ms")][:2] == [5, 10]
    assert events.Tags()["tensors"], "the custom-scalars layout (data vs compute chart) is written"
    assert (out / "last.pt").is_file()
