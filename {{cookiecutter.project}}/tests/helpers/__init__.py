"""What the tests share that is not a fixture: paths, machines described, tiny runs, command lines, test images.
Fixtures and the pytest session's set-up live in conftest.py, which sets the environment before anything here imports
the package."""
