"""ruff over the code and the tests, with pyproject.toml's [tool.ruff] rules: unused imports, undefined names and
pycodestyle's errors are found here, not by the next reader."""
import importlib.util
import subprocess
import sys

import pytest

from helpers.paths import PROJECT


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed: pip install -e '.[dev]'")
def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "scripts"],
                            cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
