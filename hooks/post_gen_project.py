"""Tell the user what to run next: the first steps the root README and the baked README give."""
import os

print(
    f"""
Baked {{ cookiecutter.project }} in {os.getcwd()}

First steps:
  cd {{ cookiecutter.project }}
  pip install -e .                                            # to train; extras only for the options that need them
  python -m {{ cookiecutter.package }}.train experiment=cpu_quick    # a first run: minutes on a laptop CPU, then its report
  pip install -e '.[dev]' && make test                        # the fast tests, with the test runner and extras

Then your own photos: the baked README's "Your own data in five commands".
"""
)
