"""One figure style for every figure specbound draws (``result.plot``, ``specbound plot`` / ``report``,
``specbound study``): page width, print resolution and fonts, colours of roles, layers and bounds,
markers, the order of family members and the bounds' labels.

matplotlib is imported only inside the functions that draw.
"""

from __future__ import annotations

import base64
import io
import re
import zlib
from pathlib import Path

import numpy as np

from ..bounds import REGISTRY
from ..errors import SpecboundError, missing_extra

ROLE_COLORS = {
    "QK": "#d62728",
    "OV": "#1f77b4",
    "FF_in": "#556b2f",
    "FF_out": "#8fbc8f",
    "FF_gate": "#9467bd",
    "FF_up": "#bcbd22",
}
ROLE_LABELS = {
    "QK": "QK (per head)",
    "OV": "OV (per head)",
    "FF_in": "FF_in",
    "FF_out": "FF_out",
    "FF_gate": "FF_gate",
    "FF_up": "FF_up",
}
# TrueType (Type 42) fonts in PDF and PostScript: journals refuse Type 3, and text stays editable.
PRINT_RC = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}
PRINT_DPI = 200
NOTEBOOK_DPI = 100  # a figure shown in a notebook: 7.5 in wide is 750 px
MAX_WIDTH = 7.5  # inches: a page's text width; no figure is wider
LEGEND_LAYERS = 12  # up to this many layers get one legend entry each; more get a colour bar
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">"]


_DISPLAY_FIGURE = None


def _display_figure_class():
    """``Figure`` with ``_repr_png_``: built without pyplot (no global state, nothing opens a window in
    a script), such a figure has no display hook in Jupyter unless pyplot's inline backend happens to
    be active, and would print as ``<Figure size ...>``; IPython shows any object with ``_repr_png_``
    as an image, so the last line of a cell shows the figure with no magic."""
    global _DISPLAY_FIGURE
    if _DISPLAY_FIGURE is None:
        from matplotlib.figure import Figure

        class DisplayFigure(Figure):
            def _repr_png_(self) -> bytes:
                buf = io.BytesIO()
                self.savefig(buf, format="png", dpi=NOTEBOOK_DPI)
                return buf.getvalue()

        _DISPLAY_FIGURE = DisplayFigure
    return _DISPLAY_FIGURE


def require_matplotlib() -> None:
    """Raise the one-line install hint before any drawing code imports matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecboundError(missing_extra("drawing figures", "matplotlib")) from None


def new_figure(figsize=(7.0, 4.6), **kwargs):
    """A constrained-layout Figure, no wider than :data:`MAX_WIDTH`, that a notebook displays."""
    try:
        figure_class = _display_figure_class()
    except ImportError:
        raise SpecboundError(missing_extra("drawing figures", "matplotlib")) from None
    width, height = figsize
    return figure_class(figsize=(min(width, MAX_WIDTH), height), layout="constrained", **kwargs)


# matplotlib places log-axis ticks in float64: data beyond ~10^250 puts a tick past the float64 range
# and drawing fails.  Values beyond this limit (a deep model's Edelman-style bound, 10^600) are left
# out of log-scale figures, and the figure says how many; the tables keep them (as 10^k).
DRAWABLE_LOG10 = 200


def drawable(values) -> tuple:
    """``(values as float with NaN where a log axis cannot show them, how many finite positive
    values beyond 10^DRAWABLE_LOG10 were left out)``: zero, negative, NaN, infinite or out of range."""
    v = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        shown = (v > 0) & np.isfinite(v) & (np.abs(np.log10(np.where(v > 0, v, 1.0))) <= DRAWABLE_LOG10)
    beyond = int(np.count_nonzero((v > 0) & ~shown))
    return np.where(shown, v, np.nan), beyond


def note_left_out(ax, count: int) -> None:
    """Say on ``ax`` how many values :func:`drawable` left out (nothing when none)."""
    if count:
        ax.text(
            0.99,
            0.01,
            f"{count} value(s) beyond 10^{DRAWABLE_LOG10} not drawn (see the tables)",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=6,
            color="dimgrey",
        )


def style_grid(ax) -> None:
    """Light grid lines; small minor tick labels (a log axis spanning under two decades labels its
    minor ticks, which would crowd a small panel at full size)."""
    ax.tick_params(which="minor", labelsize=6)
    ax.grid(True, which="major", linewidth=0.5, alpha=0.3)
    ax.grid(True, which="minor", linewidth=0.3, alpha=0.12)


def layer_colors(n_layers: int) -> list:
    """One colour per layer, from the first layer (dark) to the last (light), all distinct."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.05 + 0.85 * i / max(n_layers - 1, 1)) for i in range(n_layers)]


def save_figure(fig, base: Path, *, dpi: int = PRINT_DPI) -> list[Path]:
    """``base.png`` (``dpi``, default print resolution) and ``base.pdf`` (TrueType fonts)."""
    from matplotlib import rc_context

    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = [base.with_suffix(".png"), base.with_suffix(".pdf")]
    with rc_context(PRINT_RC):
        fig.savefig(paths[0], dpi=dpi)
        fig.savefig(paths[1])
    return paths


def optional_png(make_figure, *, dpi: int = 80) -> str | None:
    """``png_base64(make_figure())`` for a notebook view, or None without matplotlib (the view then
    shows its tables alone)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    return png_base64(make_figure(), dpi=dpi)


def png_base64(fig, *, dpi: int = 80) -> str:
    """The figure as base64 PNG data (for a notebook or a self-contained page)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return base64.b64encode(buf.getvalue()).decode()


def bound_color(name: str):
    """The one colour of bound ``name`` in every figure: the headline spectrum-adaptive bound black,
    every other registered bound its own shade of tab20 in registry order (dark shades first), and a
    name the registry does not know (the study's measures, ``gap:...``) a tab20b shade of its own."""
    from matplotlib import colormaps

    if name == "spectral_adaptive":
        return (0.0, 0.0, 0.0, 1.0)
    names = [n for n in REGISTRY if n != "spectral_adaptive"]
    if name in names:
        i = names.index(name)
        return colormaps["tab20"](2 * i if i < 10 else 2 * (i - 10) + 1)
    return colormaps["tab20b"](zlib.crc32(name.encode()) % 20)


def model_colors(n: int) -> list:
    """``n`` distinct colours for models side by side (``specbound compare``): Dark2, then evenly
    spaced hues; never a bound's colour scheme, so a model is not read as a bound."""
    from matplotlib import colormaps

    if n <= 8:
        return [colormaps["Dark2"](i) for i in range(n)]
    return [colormaps["hsv"](i / n) for i in range(n)]


def natural_order(table):
    """Records by depth, width, every pattern label, then source with its numbers compared as numbers
    (``step-200`` before ``step-1000``)."""

    def key(text: str):
        return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(text)))

    order = sorted(
        range(len(table)),
        key=lambda i: (
            int(table["L"].iloc[i]),
            int(table["N"].iloc[i]),
            *[key(table[c].iloc[i]) for c in table.columns if c.startswith("label_")],
            key(table["source"].iloc[i]),
        ),
    )
    return table.iloc[order].reset_index(drop=True)


def bound_label(name: str) -> str:
    """The registry's title of a bound (``name`` for one this version does not know)."""
    bound = REGISTRY.get(name)
    return bound.title if bound else name
