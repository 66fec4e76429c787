"""Charts are the [bench] extra: where matplotlib is missing, a tool still writes its tables and figures, and says in
one line which chart it left out and how to have it."""
import importlib.util
import logging
from pathlib import Path
from types import ModuleType

from .packages import not_installed

log = logging.getLogger(__name__)


def pyplot_for(chart: Path) -> ModuleType | None:
    """matplotlib's pyplot, drawing into files only (no display is needed), or None after one warning naming `chart`."""
    if importlib.util.find_spec("matplotlib") is None:
        log.warning("%s is not drawn: %s", chart.name, not_installed("matplotlib", "bench"))
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot
