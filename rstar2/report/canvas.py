"""Drawing surface shared by the report's figures: a matplotlib ``Figure`` on the Agg canvas (no pyplot state, no
display), the "no data" placeholder, and an atomic PNG save."""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_path

NO_DATA = "no data"


def new_figure(w: float, h: float):
    """A ``matplotlib.figure.Figure`` of ``w`` x ``h`` inches with a constrained layout, drawn by Agg. Its text
    (our names and numbers) is in matplotlib's DejaVu Sans; model-written text, in any script, is only on the HTML
    pages, which the browser draws with the system's fonts (scripts/system_deps.sh installs them)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def integer_steps(ax) -> None:
    """Ticks at whole numbers only on the x axis (RL steps): no 1.25 on a step axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save(fig, path: Path, dpi: int) -> None:
    """Save ``fig`` as a PNG at ``path`` atomically (readers never see a half-written file)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png", bbox_inches="tight")


def no_data(ax, what: str = NO_DATA) -> None:
    """Write ``what`` in the middle of an empty axes and hide its ticks."""
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
