"""``specbound plot``: the paper's figures and a few more, drawn from stored records only.

Every figure reads a results store (:class:`~specbound.sweep.store.Store`); nothing here opens a
checkpoint or computes a spectrum.  Each ``figure_*`` function returns a matplotlib ``Figure``
(built without pyplot, so no global state and no display), and :func:`render_all` saves them as
PNG and PDF.

Figures (after Sakai & Imaizumi 2026, Section 5):

* ``spectral_decay``: raw singular values of every matrix of one model, by role;
* ``bounds_vs_width`` / ``bounds_vs_depth``: each bound against ``N`` at fixed ``L`` (against ``L`` at
  fixed ``N``), divided by its value at the smallest ``N`` (``L``), log scale;
* ``norms_vs_width``: (2,1)-, (1,1)- and spectral norms of every matrix against ``N`` at fixed ``L``;
* ``contribution_curves``: ``C(p)/C(0)`` on the grid, every matrix of one model, one panel per role;
* ``p_star_heatmap``: the chosen Schatten index ``p*`` over layers and roles (mean over heads);
* ``bounds_side_by_side``: every bound of every checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..bounds import in_group
from ..errors import SpecboundError
from ..compute.measures import ordered_roles
from ..records.plot import figure_contributions, figure_p_star, figure_spectra
from ..records.style import (
    MARKERS,
    MAX_WIDTH,
    ROLE_COLORS,
    ROLE_LABELS,
    bound_color,
    bound_label,
    drawable,
    natural_order,
    new_figure,
    note_left_out,
    save_figure,
    style_grid,
)
from ..records.view import short_name
from .distance import figure_from_init
from .metrics import figure_metrics
from .trajectory import ORDER, figure_trajectory, trajectory_axis

__all__ = ["build_figures", "render_all", "pick_record"]


def _integer_ticks(ax, values) -> None:
    """Ticks at the family's own widths or depths, on a log axis, and no others."""
    from matplotlib.ticker import NullLocator

    ax.set_xticks(list(values), [str(v) for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def _model_title(meta) -> str:
    m = meta["model"]
    return f"{short_name(meta['source'])} (L={m['L']}, N={m['N']}, H={m['H']})"


def pick_record(store, model: str | None = None) -> str:
    """The key of the record named by ``model`` (a key prefix or a source); default the largest model,
    or the last checkpoint of a run (a store of one shape, ordered along its label)."""
    table = store.table()
    if table.empty:
        raise SpecboundError(f"the results store {store.root} holds no records; run `specbound sweep` first")
    if model is None:  # the largest model; of a run's checkpoints (one shape), the last along the run
        along = trajectory_axis(table)
        if along is not None:
            ordered = natural_order(table) if along == ORDER else table.sort_values(along, kind="stable")
            return ordered.iloc[-1]["key"]
        return table.sort_values(["L", "N"], kind="stable").iloc[-1]["key"]
    hits = table[(table["source"] == model) | table["key"].str.startswith(model)]
    if hits.empty:
        hits = table[table["source"].str.contains(model, regex=False)]
    if len(hits) != 1:
        shown = ", ".join(table["source"].head(8))
        raise SpecboundError(
            f"--model {model!r} names {len(hits)} records; name one by source or key "
            f"(the store has {shown}{', ...' if len(table) > 8 else ''})"
        )
    return hits.iloc[0]["key"]


# --- one model (drawn by specbound.records.plot, which result.plot uses too) ---------------------


def figure_spectral_decay(store, key: str):
    """Raw singular values against their index, every matrix of one model, one panel per role."""
    record = store.load(key, tables=("singular_values",))
    return figure_spectra(record.tables["singular_values"], _model_title(record.meta), n_layers=int(record.model["L"]))


def figure_contribution_curves(store, key: str):
    """``C(p)/C(0)`` over the post-hoc grid, every matrix of one model; one panel per role."""
    record = store.load(key, tables=("curves", "matrices"))
    return figure_contributions(
        record.tables["curves"],
        record.tables["matrices"],
        _model_title(record.meta),
        grid_m=record.meta["analysis"]["options"]["grid_m"],
        n_layers=int(record.model["L"]),
    )


def figure_p_star_heatmap(store, key: str):
    """Mean ``p*`` over each layer's matrices of each role (heads averaged), annotated."""
    record = store.load(key, tables=("matrices",))
    return figure_p_star(record.tables["matrices"], _model_title(record.meta), n_layers=int(record.model["L"]))


# --- the family --------------------------------------------------------------------------------


def _bounds_long(store, bounds, *, headline_only: bool = True):
    """The family table and the bounds to draw: those asked for, else the headline ones (the
    paper's comparison: spectrum-adaptive and Edelman-style), else every stored bound."""
    table = store.table()
    stored = store.bound_names()
    headline = [n for n in stored if n in in_group("bounds")]
    names = bounds or (headline if headline_only and headline else stored)
    return table, names


def _axes(ax, figsize=None):
    """The caller's Axes (``ax=``: the figure composes into theirs), else a new figure's one Axes."""
    if ax is not None:
        return ax
    return (new_figure(figsize) if figsize else new_figure()).add_subplot()


def figure_bound_scaling(store, *, x: str = "N", bounds: list[str] | None = None, ax=None):
    """Each bound against ``x`` (``"N"`` or ``"L"``) with the other dimension fixed, divided by its
    value at the smallest ``x`` of its group; log scale (the paper's two scaling figures).  ``ax``:
    draw into this matplotlib Axes (returns its Figure) instead of a new figure."""
    from matplotlib.lines import Line2D

    other = "L" if x == "N" else "N"
    table, names = _bounds_long(store, bounds)
    colors = [bound_color(n) for n in names]
    ax = _axes(ax)
    fig = ax.figure
    groups = sorted(table[other].unique())
    drawn = left_out = 0
    for gi, value in enumerate(groups):
        part = table[table[other] == value].sort_values(x)
        if part[x].nunique() < 2:
            continue
        for bi, name in enumerate(names):
            log10 = _log10_column(part, name)
            if not np.isfinite(log10[0]):
                continue
            with np.errstate(over="ignore", invalid="ignore"):  # from the logs: finite where B overflows
                ratio, beyond = drawable(10.0 ** np.clip(log10 - log10[0], -400, 400))
            left_out += beyond
            ax.plot(part[x], ratio, color=colors[bi], marker=MARKERS[gi % len(MARKERS)], linewidth=1.6, markersize=5)
            drawn += 1
    if not drawn:
        raise SpecboundError(f"no {other} value has records at two or more {x} values: nothing to plot")
    note_left_out(ax, left_out)
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    xs = sorted(table[x].unique())
    _integer_ticks(ax, xs)
    ax.set_xlabel("hidden size N" if x == "N" else "depth L")
    ax.set_ylabel(f"bound / bound at smallest {x}")
    ax.set_title(f"Growth with {'width N at fixed depth L' if x == 'N' else 'depth L at fixed width N'}", fontsize=11)
    style_grid(ax)
    bound_handles = [Line2D([0], [0], color=colors[i], linewidth=2, label=bound_label(n)) for i, n in enumerate(names)]
    group_handles = [
        Line2D([0], [0], color="dimgrey", marker=MARKERS[i % len(MARKERS)], linestyle="", label=f"{other}={v}")
        for i, v in enumerate(groups)
    ]
    # every curve starts at (smallest x, 1): the upper left is where no data goes
    legend = ax.legend(handles=bound_handles, loc="upper left", frameon=False, fontsize=8)
    ax.add_artist(legend)
    ax.legend(
        handles=group_handles,
        loc="upper left",
        bbox_to_anchor=(0.0, 0.98 - 0.065 * len(names)),
        frameon=False,
        fontsize=8,
        ncol=min(len(groups), 6),
        handletextpad=0.2,
        columnspacing=0.8,
        title=f"fixed {other}",
        title_fontsize=8,
        alignment="left",
    )
    return fig


NORMS = (("norm_2_1", "(2,1)-norm"), ("norm_1_1", "(1,1)-norm"), ("spectral_norm", "spectral norm"))


def figure_norms_vs_width(store, *, L: int | None = None):
    """(2,1)-, (1,1)- and spectral norm of every matrix against ``N``, at fixed depth ``L`` (default
    the smallest); one line per matrix position (layer, head, role) across the widths it exists at."""
    from matplotlib.lines import Line2D

    table = store.table()
    L = int(table["L"].min()) if L is None else int(L)
    part = table[table["L"] == L].sort_values("N")
    if part.empty:
        raise SpecboundError(f"no records with L={L}; the store has L in {sorted(table['L'].unique())}")
    frames = []
    for _, rec in part.iterrows():
        mats = store.load(rec["key"], tables=("matrices",)).tables["matrices"]
        frames.append(mats.assign(N=rec["N"]))
    mats = pd.concat(frames, ignore_index=True)
    roles = ordered_roles(mats["role"])
    fig = new_figure((MAX_WIDTH, 3.4))
    axes = fig.subplots(1, len(NORMS))
    for ax, (column, title) in zip(axes, NORMS):
        for (role, layer, head), g in mats.groupby(["role", "layer", "head"], dropna=False, sort=True):
            g = g.sort_values("N")
            ax.plot(
                g["N"],
                g[column],
                color=ROLE_COLORS.get(role, "grey"),
                marker="o",
                markersize=3,
                linewidth=0.9,
                alpha=0.35 if role in ("QK", "OV") else 0.9,
            )
        ax.set_xscale("log", base=2)
        _integer_ticks(ax, sorted(mats["N"].unique()))
        ax.set_yscale("log")
        ax.set_xlabel("hidden size N")
        ax.set_ylabel(title)
        ax.set_title(title, fontsize=10)
        style_grid(ax)
    axes[0].legend(
        handles=[Line2D([0], [0], color=ROLE_COLORS.get(r, "grey"), label=ROLE_LABELS.get(r, r)) for r in roles],
        frameon=False,
        fontsize=8,
    )
    fig.suptitle(f"Norms of every matrix against N at depth L={L}", fontsize=11)
    return fig


def _log10_column(table, name: str) -> np.ndarray:
    """``log10`` of bound ``name`` per record: the store's ``log10_<name>`` column (finite where the
    bound overflows float64), else the logs of the values."""
    if f"log10_{name}" in table:
        return table[f"log10_{name}"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(table[name].to_numpy(float))


def _overflowed(table, name: str) -> int:
    """Records whose bound ``name`` is beyond float64 (stored null, its log10 known)."""
    if f"log10_{name}" not in table:
        return 0
    return int((table[name].isna() & table[f"log10_{name}"].notna()).sum())


HEADLINE = "spectral_adaptive"  # the paper's bound: drawn last, as a ring no other bound uses
HEADLINE_STYLE = {
    "marker": "o",
    "markersize": 11,
    "markerfacecolor": "none",
    "markeredgecolor": "black",
    "markeredgewidth": 1.8,
    "color": "black",
}


def figure_bounds_side_by_side(store, *, bounds: list[str] | None = None, ax=None):
    """Every bound of every checkpoint, as a dot plot: one row per checkpoint (short name, depth,
    width), one distinct colour and marker per bound, the values on a log axis.  The headline
    spectrum-adaptive bound is drawn last as a large open black ring (first in the legend), so a
    variant equal to it (the shared-weights bound without sharing, a fixed p equal to p*) shows
    inside the ring instead of hiding it.  The width is a page's; the height grows with the
    checkpoints (up to a page).  ``ax``: draw into this matplotlib Axes (the legend inside it;
    returns its Figure) instead of a new figure."""
    from matplotlib.lines import Line2D

    table, names = _bounds_long(store, bounds, headline_only=False)
    names = sorted(names, key=lambda n: n != HEADLINE)  # the headline first in the legend
    table = natural_order(table).iloc[::-1].reset_index(drop=True)  # the first checkpoint at the top
    labels = [f"L{l} N{n}" for l, n in zip(table["L"], table["N"])]
    if len(set(labels)) < len(labels):
        labels = [f"{short_name(src, 28)}  ({lab})" for lab, src in zip(labels, table["source"])]
    others = [n for n in names if n != HEADLINE]
    colors = {n: bound_color(n) for n in others}
    markers = {n: MARKERS[1:][i % (len(MARKERS) - 1)] for i, n in enumerate(others)}  # "o" is the headline's
    styles = {n: {"marker": markers[n], "markersize": 5, "color": colors[n], "alpha": 0.9} for n in others}
    styles[HEADLINE] = HEADLINE_STYLE
    height = min(9.5, 1.9 + 0.24 * len(table) + 0.16 * ((len(names) + 2) // 3))
    given = ax is not None
    ax = _axes(ax, (MAX_WIDTH, height))
    fig = ax.figure
    ys = np.arange(len(table))
    left_out = 0
    for name in others + [n for n in names if n == HEADLINE]:  # the headline on top of everything
        values, beyond = drawable(table[name])
        left_out += beyond + _overflowed(table, name)
        ax.plot(values, ys, linestyle="", zorder=4 if name == HEADLINE else 2, **styles[name])
    note_left_out(ax, left_out)
    ax.set_xscale("log")
    ax.set_yticks(ys, labels, fontsize=7 if len(table) > 16 else 8)
    ax.set_ylim(-0.7, len(table) - 0.3)
    ax.set_ylabel("checkpoint (depth L, hidden size N)")
    ax.set_xlabel("bound value (log scale)")
    ax.set_title("Every bound of every checkpoint", fontsize=11)
    style_grid(ax)
    ax.grid(True, axis="y", linewidth=0.4, alpha=0.25)
    handles = [
        Line2D([0], [0], linestyle="", label=bound_label(n) + (" [headline]" if n == HEADLINE else ""), **styles[n])
        for n in names
    ]
    if given:
        ax.legend(handles=handles, loc="best", frameon=False, fontsize=6)
    else:
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncol=2 if len(names) > 4 else len(names),
            frameon=False,
            fontsize=7,
        )
    return fig


# --- all of them -------------------------------------------------------------------------------


def build_figures(
    store, *, model: str | None = None, fixed_L: int | None = None, bounds: list[str] | None = None
) -> dict[str, object]:
    """Every figure the store supports, by name (the family figures need two or more widths or depths)."""
    key = pick_record(store, model)
    figures = {"spectral_decay": figure_spectral_decay(store, key)}
    table = store.table()
    if trajectory_axis(table) is not None:  # one shape: a run's checkpoints, drawn along their label
        figures["trajectory"] = figure_trajectory(store, x=trajectory_axis(table), bounds=bounds)
    for x, name in (("N", "bounds_vs_width"), ("L", "bounds_vs_depth")):
        other = "L" if x == "N" else "N"
        if table.groupby(other)[x].nunique().max() >= 2:
            figures[name] = figure_bound_scaling(store, x=x, bounds=bounds)
    if table["N"].nunique() >= 2:
        figures["norms_vs_width"] = figure_norms_vs_width(store, L=fixed_L)
    figures["contribution_curves"] = figure_contribution_curves(store, key)
    figures["p_star_heatmap"] = figure_p_star_heatmap(store, key)
    figures["bounds_side_by_side"] = figure_bounds_side_by_side(store, bounds=bounds)

    correlated = figure_metrics(store, bounds=bounds)
    if correlated is not None:  # the records carry the user's own metrics
        figures["metrics"] = correlated

    distance = figure_from_init(store)
    if distance is not None:  # records measured from initial weights (--init, LoRA adapters)
        figures["from_init"] = distance
    return figures


def render_all(store, out_dir: str | Path, **kwargs) -> list[Path]:
    """Build every figure and save it as PNG and PDF in ``out_dir``; returns the files written."""
    out = Path(out_dir)
    written = []
    for name, fig in build_figures(store, **kwargs).items():
        written += save_figure(fig, out / name)
    return written
