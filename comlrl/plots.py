"""What every plot of a run's report and of ``comlrl compare`` shares: the figure size and resolution, and matplotlib
on its file-only backend."""

from __future__ import annotations

from typing import Any

FIGSIZE = (8.0, 4.5)  # inches; at DPI 100 every plot is 800 x 450 pixels
DPI = 100


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the Agg backend (files only, no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt
