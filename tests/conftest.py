import importlib.util
import site
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]
BAKED = TEMPLATE / "{{cookiecutter.project}}"  # what the bake renders, as the template holds it


@pytest.fixture(scope="session")
def template() -> Path:
    return TEMPLATE


def venv_seeing_ours(folder: Path) -> Path:
    """A venv without pip's own copy of anything: it reads this one's packages through a .pth file."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin/python"
    child_site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    Path(child_site, "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def baked_helper(name: str):
    """A module of the baked tests' helpers that imports nothing of the package, loaded from the template as it is."""
    spec = importlib.util.spec_from_file_location(f"baked_{name}", BAKED / "tests/helpers" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pages = baked_helper("pages")  # the pages' links, anchors and commands, as the baked tests read them
