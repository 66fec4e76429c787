from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def template() -> Path:
    return TEMPLATE
