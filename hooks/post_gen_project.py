"""Tell the user what to run next: the first steps the root README and the baked README give."""
import os

print(
    f"""
Baked {{ cookiecutter.project }} in {os.getcwd()}

First steps:
  cd {{ cookiecutter.project }}
  pip install -e .                                            # to train; extras only for the options that need them
  python -m {{ cookiecutter.package }}.train experiment=cpu_quick    # a first run: minutes on a laptop CPU, then its report
  make test                                                   # the fast tests, once pip install -e '.[dev]' adds pytest

Then your own photos: the baked README's first section.
"""
)
