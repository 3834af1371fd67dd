"""matplotlib for `--plot` (`report`, `replay`, `bench worker`): an optional extra.

`pip install 'gpuwatch[plot]'` installs it; the node agent, watcher and worker never draw,
so their image goes without. It is imported only when a plot is drawn (about a second),
with the Agg backend: PNG files, no display. A verb given `--plot` asks `unavailable`
before its long read and exits 2 with the message when matplotlib is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

__all__ = ["MISSING", "PlotUnavailable", "pyplot", "unavailable"]

MISSING: Final = "--plot needs matplotlib, which is not installed: pip install 'gpuwatch[plot]'"


class PlotUnavailable(Exception):  # noqa: N818 - named for what the user sees
    """matplotlib is not installed; the message says how to install it."""


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend; PlotUnavailable without matplotlib."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable(MISSING) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def unavailable(plot: Path | None) -> str | None:
    """The message to exit 2 with when a plot is asked for (`plot` given) and matplotlib is
    missing; None otherwise."""
    if plot is None:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return MISSING
    return None
