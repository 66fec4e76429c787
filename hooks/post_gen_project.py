"""Tell the user what to run next."""
import os

print(
    f"""
Baked {{ cookiecutter.project }} in {os.getcwd()}

Next steps:
  cd {{ cookiecutter.project }}
  pip install -e '.[dev]'
  python -m {{ cookiecutter.package }}.train                               # synthetic data, CPU or GPU
  python -m {{ cookiecutter.package }}.train data=folder data.root=/path/to/photos   # train/<class>/*.jpg, val/<class>/*.jpg
  pytest

Every run ends with a report saying whether data loading is the bottleneck, and which switch to flip.
"""
)
