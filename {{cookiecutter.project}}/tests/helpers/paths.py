"""Where the project, its config and the tests' own data files are."""
from pathlib import Path

from {{ cookiecutter.package }} import options

PROJECT = Path(__file__).resolve().parents[2]
CONF = options.CONF
PACKAGE = "{{ cookiecutter.package }}"
DATA = PROJECT / "tests" / "data"  # files no Python library writes, made once by hand
