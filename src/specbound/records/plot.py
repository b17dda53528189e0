"""Figures of one analysis, drawn from its tables: ``result.plot.spectra()``,
``result.plot.contributions()``, ``result.plot.p_star()`` in a notebook, and the one-model figures of
``specbound plot`` / ``report`` (which pass a stored record's tables to the same functions).

Every function takes tables (never a checkpoint, never a store).  The ``plot_*`` functions draw one
panel into ``ax=`` (default a new figure's) and return that Axes, matplotlib's convention, so they
compose into figures of your own; the ``figure_*`` functions put them together and return a
``Figure``, built without pyplot (no global state, no display).  matplotlib is imported only when a
figure is drawn; :func:`.style.save_figure` writes them for print.
"""

from __future__ import annotations

import numpy as np

from ..compute.measures import ordered_roles, with_role_groups
from ..errors import SpecboundError
from .curves import contribution_curves
from .schema import sv_kinds
from .style import (
    LEGEND_LAYERS,
    MAX_WIDTH,
    ROLE_LABELS,
    drawable,
    layer_colors,
    new_figure,
    note_left_out,
    require_matplotlib,
    style_grid,
)
from .view import short_name


def _layer_key(fig, axes, n_layers: int, colors) -> None:
    """Which colour is which layer: a legend up to :data:`LEGEND_LAYERS` layers, else a colour bar."""
    from matplotlib.lines import Line2D

    if n_layers <= LEGEND_LAYERS:
        handles = [Line2D([0], [0], color=colors[i], linewidth=2, label=f"layer {i}") for i in range(n_layers)]
        fig.legend(
            handles=handles,
            loc="outside lower center",
            frameon=False,
            fontsize=8,
            ncol=min(n_layers, 6),
            title="colour = layer (0 = input)",
            title_fontsize=8,
        )
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


def _axes(ax, figsize=(MAX_WIDTH / 2, 2.8)):
    """``ax``, or the one Axes of a new figure (a panel drawn on its own)."""
    return ax if ax is not None else new_figure(figsize).add_subplot()


def _depth(table, n_layers: int | None) -> int:
    return int(n_layers if n_layers is not None else table["layer"].max() + 1)


def plot_spectra(singular_values, role: str, *, ax=None, n_layers: int | None = None):
    """One role's raw singular values against their index, one colour per layer (every head of a
    layer in its colour), log scale, exact zeros left out; a rotary QK head's per-index bounds over
    every offset (``kind = sigma_bound``), never its Horn envelope.  Returns the Axes.

    Parameters
    ----------
    singular_values : DataFrame
        ``Analysis.singular_values`` (``matrix, layer, role, kind, sv_index, sigma``).
    role : str
        ``QK``, ``OV``, ``FF_in``, ... (routed experts grouped: ``FF_gate[experts]``).
    ax : matplotlib Axes, optional
        Where to draw (default: a new figure's).
    n_layers : int, optional
        The model's depth, for the layer colours (default: from the table).
    """
    sv = with_role_groups(singular_values[sv_kinds(singular_values) != "horn_envelope"])
    colors = layer_colors(_depth(sv, n_layers))
    ax = _axes(ax)
    left_out = 0
    for (layer, _), g in sv[sv["role"] == role].groupby(["layer", "matrix"], sort=True):
        sigma, beyond = drawable(g["sigma"])  # exact zeros have no place on a log axis
        left_out += beyond
        ax.plot(
            g["sv_index"].to_numpy(),
            sigma,
            color=colors[int(layer)],
            linewidth=0.9,
            alpha=0.45 if role in ("QK", "OV") else 0.95,
        )
    note_left_out(ax, left_out)
    ax.set_yscale("log")
    ax.set_title(ROLE_LABELS.get(role, role), fontsize=9)
    ax.set_xlabel("singular value index i")
    ax.set_ylabel(r"singular value $\sigma_i$")
    ax.tick_params(labelsize=8)
    style_grid(ax)
    return ax


def figure_spectra(singular_values, title: str, *, n_layers: int | None = None):
    """:func:`plot_spectra` of every role, one panel each, with the layer key and the model's name."""
    sv = with_role_groups(
        singular_values[sv_kinds(singular_values) != "horn_envelope"]
    )  # routed experts: one panel per role
    roles = ordered_roles(sv["role"])
    L = _depth(sv, n_layers)
    fig = new_figure((MAX_WIDTH, 2.4 * int(np.ceil(len(roles) / 2)) + 0.7))
    axes = _panels(fig, len(roles))
    for ax, role in zip(axes, roles):
        plot_spectra(singular_values, role, ax=ax, n_layers=L)
    _layer_key(fig, axes, L, layer_colors(L))
    fig.suptitle(f"Spectral decay: {title}", fontsize=10)
    return fig


def plot_contributions(curves, matrices, role: str, *, ax=None, n_layers: int | None = None):
    """One role's ``C(p)/C(0)`` over the post-hoc grid, one colour per layer, a dot at each matrix's
    grid minimiser ``p*``.  Returns the Axes.

    Parameters
    ----------
    curves : DataFrame
        From :func:`specbound.records.curves.contribution_curves` (``matrix, layer, role, p, c_over_c0``).
    matrices : DataFrame
        ``Analysis.matrices`` (``p_star``), in the order of ``curves``' ``matrix`` index.
    role : str
    ax : matplotlib Axes, optional
    n_layers : int, optional
    """
    curves = with_role_groups(curves)
    colors = layer_colors(_depth(curves, n_layers))
    ax = _axes(ax)
    p_star = matrices["p_star"].to_numpy(float)
    part = curves[curves["role"] == role]
    left_out = 0
    for (layer, matrix), g in part.groupby(["layer", "matrix"], sort=True):
        ratio, beyond = drawable(g["c_over_c0"])
        left_out += beyond
        ax.plot(g["p"], ratio, color=colors[int(layer)], linewidth=0.9, alpha=0.4 if role in ("QK", "OV") else 0.95)
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
    return ax


def figure_contributions(curves, matrices, title: str, *, grid_m: int, n_layers: int | None = None):
    """:func:`plot_contributions` of every role, one panel each, with the layer key and the model's name."""
    roles = ordered_roles(with_role_groups(curves)["role"])
    L = _depth(curves, n_layers)
    fig = new_figure((MAX_WIDTH, 2.4 * int(np.ceil(len(roles) / 2)) + 0.7))
    axes = _panels(fig, len(roles))
    for ax, role in zip(axes, roles):
        plot_contributions(curves, matrices, role, ax=ax, n_layers=L)
    _layer_key(fig, axes, L, layer_colors(L))
    # the model's name as plain text: a "$" in it must not pair with the mathtext of P_m
    fig.suptitle(f"Contribution curves on $P_m$ (m={grid_m}): " + title.replace("$", r"\$"), fontsize=10)
    return fig


def plot_p_star(matrices, *, n_layers: int, ax=None, title: str | None = None):
    """Mean ``p*`` over each layer's matrices of each role (heads and routed experts averaged), a heat
    map annotated with its values, with its colour bar.  Returns the Axes."""
    matrices = with_role_groups(matrices)
    roles = ordered_roles(matrices["role"])
    L = int(n_layers)
    grid = np.full((len(roles), L), np.nan)
    for i, role in enumerate(roles):
        means = matrices[matrices["role"] == role].groupby("layer")["p_star"].mean()
        grid[i, means.index.to_numpy(int)] = means.to_numpy()
    ax = _axes(ax, (max(4.5, 0.5 * L + 2.5), 0.5 * len(roles) + 1.8))
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0.0, vmax=2.0)
    step = max(1, int(np.ceil(L / 16)))  # at most 16 layer ticks
    ax.set_xticks(range(0, L, step), [str(l) for l in range(0, L, step)])
    ax.set_yticks(range(len(roles)), roles)
    ax.set_xlabel("layer")
    ax.set_ylabel("role")
    if L <= 24:
        # as large as a cell allows: a cell is at least (7.5 in - margins) / L wide (0.25 in at L = 24)
        size = 10 if L <= 12 else 8 if L <= 16 else 6
        for i in range(len(roles)):
            for j in range(L):
                if np.isfinite(grid[i, j]):
                    ax.text(
                        j,
                        i,
                        f"{grid[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=size,
                        color="white" if grid[i, j] < 1.2 else "black",
                    )
    ax.figure.colorbar(image, ax=ax, label="p* (mean over heads)")
    ax.set_title("Chosen Schatten index p* (mean over heads)" + (f"\n{title}" if title else ""), fontsize=10)
    return ax


def figure_p_star(matrices, title: str, *, n_layers: int):
    """:func:`plot_p_star` on a figure of its own, titled with the model's name."""
    return plot_p_star(matrices, n_layers=n_layers, title=title).figure


class AnalysisPlots:
    """``result.plot``: the one-model figures of an analysis, without a results store.

    Each method returns a matplotlib ``Figure`` (``fig.savefig(...)`` to keep it; a notebook shows it).
    """

    def __init__(self, analysis):
        self._a = analysis

    def _title(self) -> str:
        m = self._a.model
        return f"{short_name(self._a.source)} (L={m['L']}, N={m['N']}, H={m['H']})"

    def _role(self, table, role: str | None) -> str:
        roles = ordered_roles(with_role_groups(table)["role"])
        if role is None:
            return roles[0]
        if role not in roles:
            raise SpecboundError(f"no role {role!r} in this model; it has {', '.join(roles)}")
        return role

    def spectra(self, role: str | None = None, *, ax=None):
        """Singular values of every matrix, one panel per role, one colour per layer (a Figure); with
        ``ax=`` or ``role=``, one role's panel (default the first, QK) drawn into ``ax`` (default a new
        figure's), and that Axes returned."""
        require_matplotlib()
        a = self._a
        if ax is None and role is None:
            return figure_spectra(a.singular_values, self._title(), n_layers=a.model["L"])
        return plot_spectra(a.singular_values, self._role(a.singular_values, role), ax=ax, n_layers=a.model["L"])

    def contributions(self, role: str | None = None, *, ax=None):
        """``C(p)/C(0)`` on the post-hoc grid for every matrix, with each matrix's ``p*`` (a Figure);
        with ``ax=`` or ``role=``, one role's panel drawn into ``ax``, and that Axes returned."""
        require_matplotlib()

        a = self._a
        curves = contribution_curves(
            a.matrices, a.singular_values, n=a.model["N"], grid_m=a.options["grid_m"], rank_tol=a.options["rank_tol"]
        )
        if ax is None and role is None:
            return figure_contributions(
                curves, a.matrices, self._title(), grid_m=a.options["grid_m"], n_layers=a.model["L"]
            )
        return plot_contributions(curves, a.matrices, self._role(curves, role), ax=ax, n_layers=a.model["L"])

    def p_star(self, *, ax=None):
        """The chosen Schatten index ``p*`` over layers and roles (mean over heads): a Figure, or with
        ``ax=`` the heat map drawn into ``ax`` and that Axes returned."""
        require_matplotlib()
        if ax is None:
            return figure_p_star(self._a.matrices, self._title(), n_layers=self._a.model["L"])
        return plot_p_star(self._a.matrices, n_layers=self._a.model["L"], ax=ax, title=self._title())

    def __repr__(self) -> str:
        return "<specbound plots: .spectra(role=, ax=), .contributions(role=, ax=), .p_star(ax=)>"
