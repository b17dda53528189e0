"""Figures of one analysis, drawn from its tables: ``result.plot.spectra()``,
``result.plot.contributions()``, ``result.plot.p_star()`` in a notebook, and the one-model figures of
``specbound plot`` / ``report`` (which pass a stored record's tables to the same functions).

Every function takes tables (never a checkpoint, never a store) and returns a matplotlib ``Figure``
built without pyplot (no global state, no display); matplotlib is imported only when a figure is
drawn.  :func:`save_figure` writes PNG at print resolution and PDF with TrueType fonts.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np

from .compute.measures import ROLE_ORDER
from .errors import SpecboundError

ROLE_COLORS = {"QK": "#d62728", "OV": "#1f77b4", "FF_in": "#556b2f", "FF_out": "#8fbc8f",
               "FF_gate": "#9467bd", "FF_up": "#bcbd22"}
ROLE_LABELS = {"QK": "QK (per head)", "OV": "OV (per head)", "FF_in": "FF_in", "FF_out": "FF_out",
               "FF_gate": "FF_gate", "FF_up": "FF_up"}
# TrueType (Type 42) fonts in PDF and PostScript: journals refuse Type 3, and text stays editable.
PRINT_RC = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}
PRINT_DPI = 200
MAX_WIDTH = 7.5  # inches: a page's text width; no figure is wider
LEGEND_LAYERS = 12  # up to this many layers get one legend entry each; more get a colour bar


def new_figure(figsize=(7.0, 4.6), **kwargs):
    """A constrained-layout Figure, no wider than :data:`MAX_WIDTH`."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SpecboundError("plots need matplotlib: pip install -e '.[plot]' in the specbound checkout") from None
    width, height = figsize
    return Figure(figsize=(min(width, MAX_WIDTH), height), layout="constrained", **kwargs)


# matplotlib places log-axis ticks in float64: data beyond ~10^250 puts a tick past the float64 range
# and drawing fails.  Values beyond this limit (a deep model's Edelman-style bound, 10^600) are left
# out of log-scale figures, and the figure says how many; the tables keep them (as 10^k).
DRAWABLE_LOG10 = 200


def drawable(values) -> tuple[np.ndarray, int]:
    """``(values as float with NaN where a log axis cannot show them, how many finite positive
    values beyond 10^DRAWABLE_LOG10 were left out)``: zero, negative, NaN, infinite or out of range."""
    v = np.asarray(values, dtype=float)
    with np.errstate(invalid="ignore"):
        shown = (v > 0) & (np.abs(np.log10(np.where(v > 0, v, 1.0))) <= DRAWABLE_LOG10) & np.isfinite(v)
        beyond = int(np.count_nonzero((v > 0) & ~shown))
    return np.where(shown, v, np.nan), beyond


def note_left_out(ax, count: int) -> None:
    """Say on ``ax`` how many values :func:`drawable` left out (nothing when none)."""
    if count:
        ax.text(0.99, 0.01, f"{count} value(s) beyond 10^{DRAWABLE_LOG10} not drawn (see the tables)",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=6, color="dimgrey")


def style_grid(ax) -> None:
    """Light grid lines; small minor tick labels (a log axis spanning under two decades labels its
    minor ticks, which would crowd a small panel at full size)."""
    ax.tick_params(which="minor", labelsize=6)
    ax.grid(True, which="major", linewidth=0.5, alpha=0.3)
    ax.grid(True, which="minor", linewidth=0.3, alpha=0.12)


def roles_of(frame) -> list[str]:
    present = list(dict.fromkeys(frame["role"]))
    return [r for r in ROLE_ORDER if r in present] + [r for r in present if r not in ROLE_ORDER]


def layer_colors(n_layers: int) -> list:
    """One colour per layer, from the first layer (dark) to the last (light), all distinct."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(0.05 + 0.85 * i / max(n_layers - 1, 1)) for i in range(n_layers)]


def _layer_key(fig, axes, n_layers: int, colors) -> None:
    """Which colour is which layer: a legend up to :data:`LEGEND_LAYERS` layers, else a colour bar."""
    from matplotlib.lines import Line2D

    if n_layers <= LEGEND_LAYERS:
        handles = [Line2D([0], [0], color=colors[i], linewidth=2, label=f"layer {i}") for i in range(n_layers)]
        fig.legend(handles=handles, loc="outside lower center", frameon=False, fontsize=8,
                   ncol=min(n_layers, 6), title="colour = layer (0 = input)", title_fontsize=8)
    else:
        from matplotlib import colormaps
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        mappable = ScalarMappable(Normalize(0, n_layers - 1), colormaps["viridis"])
        fig.colorbar(mappable, ax=list(axes), label="layer (0 = input)", fraction=0.04)


def _panels(fig, n: int):
    cols = 2 if n > 1 else 1
    rows = int(np.ceil(n / cols))
    axes = fig.subplots(rows, cols, squeeze=False, sharex=False)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return list(axes.flat)[:n]


def sv_index_column(sv) -> str:
    """The singular values' index column: ``sv_index`` (``index`` in records written before 0.2)."""
    return "sv_index" if "sv_index" in sv.columns else "index"


def figure_spectra(singular_values, title: str, *, n_layers: int | None = None):
    """Raw singular values against their index, one panel per role, one colour per layer (every
    head of a layer in its colour); log scale, exact zeros left out.

    Parameters
    ----------
    singular_values : DataFrame
        ``Analysis.singular_values`` (``matrix, layer, role, sv_index, sigma``).
    title : str
    n_layers : int, optional
        The model's depth (default: from the table).
    """
    sv = singular_values
    idx = sv_index_column(sv)
    roles = roles_of(sv)
    L = int(n_layers if n_layers is not None else sv["layer"].max() + 1)
    colors = layer_colors(L)
    fig = new_figure((MAX_WIDTH, 2.4 * int(np.ceil(len(roles) / 2)) + 0.7))
    axes = _panels(fig, len(roles))
    for ax, role in zip(axes, roles):
        left_out = 0
        for (layer, _), g in sv[sv["role"] == role].groupby(["layer", "matrix"], sort=True):
            sigma, beyond = drawable(g["sigma"])  # exact zeros have no place on a log axis
            left_out += beyond
            ax.plot(g[idx].to_numpy(), sigma, color=colors[int(layer)], linewidth=0.9,
                    alpha=0.45 if role in ("QK", "OV") else 0.95)
        note_left_out(ax, left_out)
        ax.set_yscale("log")
        ax.set_title(ROLE_LABELS.get(role, role), fontsize=9)
        ax.set_xlabel("singular value index i")
        ax.set_ylabel("singular value σ_i")
        ax.tick_params(labelsize=8)
        style_grid(ax)
    _layer_key(fig, axes, L, colors)
    fig.suptitle(f"Spectral decay: {title}", fontsize=10)
    return fig


def figure_contributions(curves, matrices, title: str, *, grid_m: int, n_layers: int | None = None):
    """``C(p)/C(0)`` over the post-hoc grid, one panel per role, one colour per layer; dots mark each
    matrix's grid minimiser ``p*``.

    Parameters
    ----------
    curves : DataFrame
        From :func:`specbound.records_curves.contribution_curves` (``matrix, layer, role, p, c_over_c0``).
    matrices : DataFrame
        ``Analysis.matrices`` (``p_star``), in the order of ``curves``' ``matrix`` index.
    title : str
    grid_m : int
    n_layers : int, optional
    """
    roles = roles_of(curves)
    L = int(n_layers if n_layers is not None else curves["layer"].max() + 1)
    colors = layer_colors(L)
    fig = new_figure((MAX_WIDTH, 2.4 * int(np.ceil(len(roles) / 2)) + 0.7))
    axes = _panels(fig, len(roles))
    p_star = matrices["p_star"].to_numpy(float)
    for ax, role in zip(axes, roles):
        part = curves[curves["role"] == role]
        left_out = 0
        for (layer, matrix), g in part.groupby(["layer", "matrix"], sort=True):
            ratio, beyond = drawable(g["c_over_c0"])
            left_out += beyond
            ax.plot(g["p"], ratio, color=colors[int(layer)], linewidth=0.9,
                    alpha=0.4 if role in ("QK", "OV") else 0.95)
        chosen = part[np.isclose(part["p"].to_numpy(float), p_star[part["matrix"].to_numpy(int)])]
        ax.plot(chosen["p"], drawable(chosen["c_over_c0"])[0], "k.", markersize=4, label="p* (grid minimiser)")
        note_left_out(ax, left_out)
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
        ax.set_yscale("log")
        ax.set_title(ROLE_LABELS.get(role, role), fontsize=9)
        ax.set_xlabel("Schatten index p")
        ax.set_ylabel("C(p) / C(0)")
        ax.tick_params(labelsize=8)
        style_grid(ax)
        ax.legend(frameon=False, fontsize=7, loc="best")
    _layer_key(fig, axes, L, colors)
    fig.suptitle(f"Contribution curves on P_m (m={grid_m}): {title}", fontsize=10)
    return fig


def figure_p_star(matrices, title: str, *, n_layers: int):
    """Mean ``p*`` over each layer's matrices of each role (heads averaged), annotated."""
    roles = roles_of(matrices)
    L = int(n_layers)
    grid = np.full((len(roles), L), np.nan)
    for i, role in enumerate(roles):
        means = matrices[matrices["role"] == role].groupby("layer")["p_star"].mean()
        grid[i, means.index.to_numpy(int)] = means.to_numpy()
    fig = new_figure((max(4.5, 0.5 * L + 2.5), 0.5 * len(roles) + 1.8))
    ax = fig.add_subplot()
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0.0, vmax=2.0)
    step = max(1, int(np.ceil(L / 16)))  # at most 16 layer ticks
    ax.set_xticks(range(0, L, step), [str(l) for l in range(0, L, step)])
    ax.set_yticks(range(len(roles)), roles)
    ax.set_xlabel("layer")
    ax.set_ylabel("role")
    if L <= 24:
        for i in range(len(roles)):
            for j in range(L):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7 if L <= 12 else 5,
                            color="white" if grid[i, j] < 1.2 else "black")
    fig.colorbar(image, ax=ax, label="p* (mean over heads)")
    ax.set_title(f"Chosen Schatten index p* (mean over heads)\n{title}", fontsize=10)
    return fig


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


def png_base64(fig, *, dpi: int = 80) -> str:
    """The figure as base64 PNG data (for a notebook or a self-contained page)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return base64.b64encode(buf.getvalue()).decode()


class AnalysisPlots:
    """``result.plot``: the one-model figures of an analysis, without a results store.

    Each method returns a matplotlib ``Figure`` (``fig.savefig(...)`` to keep it; a notebook shows it).
    """

    def __init__(self, analysis):
        self._a = analysis

    def _title(self) -> str:
        from .records_view import short_name

        m = self._a.model
        return f"{short_name(self._a.source)} (L={m['L']}, N={m['N']}, H={m['H']})"

    def spectra(self):
        """Singular values of every matrix, one panel per role, one colour per layer."""
        return figure_spectra(self._a.singular_values, self._title(), n_layers=self._a.model["L"])

    def contributions(self):
        """``C(p)/C(0)`` on the post-hoc grid for every matrix, with each matrix's ``p*``."""
        from .records_curves import contribution_curves

        a = self._a
        curves = contribution_curves(a.matrices, a.singular_values, n=a.model["N"], grid_m=a.options["grid_m"],
                                     rank_tol=a.options["rank_tol"])
        return figure_contributions(curves, a.matrices, self._title(), grid_m=a.options["grid_m"],
                                    n_layers=a.model["L"])

    def p_star(self):
        """The chosen Schatten index ``p*`` over layers and roles (mean over heads)."""
        return figure_p_star(self._a.matrices, self._title(), n_layers=self._a.model["L"])

    def __repr__(self) -> str:
        return "<specbound plots: .spectra(), .contributions(), .p_star()>"
