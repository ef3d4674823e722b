"""Figures written to files (hvdazure bench's --plot, a sweep's sweep.png): matplotlib without a display,
imported only when a figure is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed: ranks and CI machines have none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Write `fig` to `path` (creating its folder) and free it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
