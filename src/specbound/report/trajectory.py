"""A training trajectory: a store whose records all have one shape (the checkpoints of one run).

Depth and width do not vary there, so the scaling fits of :mod:`specbound.report.scaling` have
nothing to fit against them; what varies is a pattern label (``label_step`` for
``run/step-{step=1000..9000..1000}``).  This module finds that label and draws every bound and the
share of each chosen Schatten index ``p*`` against it, from stored records only.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from ..errors import SpecboundError
from ..records.style import (
    MARKERS,
    MAX_WIDTH,
    bound_color,
    bound_label,
    drawable,
    natural_order,
    new_figure,
    note_left_out,
    style_grid,
)
from ..records.view import short_name

ORDER = "checkpoint"  # the x column when no label varies: the records in source-name order


def is_same_shape(table) -> bool:
    """Whether the store holds two or more records and every one has the same depth and width."""
    return len(table) >= 2 and table["L"].nunique() == 1 and table["N"].nunique() == 1


def varying_labels(table) -> list[str]:
    """The ``label_*`` columns that take two or more values, numeric ones first, ``label_step`` first."""
    labels = [c for c in table.columns if c.startswith("label_") and table[c].nunique(dropna=True) >= 2]
    numeric = [c for c in labels if np.issubdtype(table[c].dtype, np.number)]
    ranked = sorted(numeric, key=lambda c: (c != "label_step", labels.index(c)))
    return ranked + [c for c in labels if c not in numeric]


def trajectory_axis(table) -> str | None:
    """The column a same-shape store's records vary along: the first of :func:`varying_labels`, else
    :data:`ORDER` (the records in source-name order); None when the store is not same-shape."""
    if not is_same_shape(table):
        return None
    labels = varying_labels(table)
    return labels[0] if labels else ORDER


def no_variation_message(table) -> str:
    """The one-line explanation for a scaling fit over a store whose depth and width do not vary."""
    labels = varying_labels(table)
    L, N = int(table["L"].iloc[0]), int(table["N"].iloc[0])
    hint = (
        f"fit against the label that varies: --against {labels[0]}"
        if labels
        else "no pattern label varies either: name the checkpoints with a pattern such as "
        "'run/step-{step=1000..9000..1000}' and fit with --against label_step"
    )
    return (
        f"all {len(table)} records have L={L} and N={N}: depth and width do not vary, so there is no "
        f"scaling in L or N to fit; {hint} (`specbound plot` draws the trajectory)"
    )


def trajectory_frame(store, *, x: str | None = None, bounds: list[str] | None = None):
    """One row per record, sorted along ``x``: ``x, source, key``, every (or each named) bound, the
    records' own metrics (``metric_<name>``: a training callback's loss and evaluation metrics, a
    sweep's ``metrics.json``), and the share of the matrices choosing each ``p*`` (columns ``p*=k/m``).

    Parameters
    ----------
    store : Store
    x : str, optional
        The column to order by (default :func:`trajectory_axis`).
    bounds : list of str, optional
    """
    table = store.table()
    x = x or trajectory_axis(table)
    if x is None:
        raise SpecboundError(
            f"the store {store.root} is not a trajectory: its records have more than one "
            f"shape (L in {sorted(set(table['L']))}, N in {sorted(set(table['N']))})"
        )
    names = bounds or store.bound_names()
    if x == ORDER:
        table = natural_order(table)
        table[ORDER] = np.arange(len(table))
    elif x not in table.columns:
        raise SpecboundError(
            f"no column {x!r} in the store; its labels are "
            f"{', '.join(c for c in table.columns if c.startswith('label_')) or 'none'}"
        )
    table = table.sort_values(x, kind="stable").reset_index(drop=True)
    shares = []
    for key, grid_m in zip(table["key"], table["grid_m"]):
        p_star = store.load(key, tables=("matrices",)).tables["matrices"]["p_star"].to_numpy(float)
        labels = [str(Fraction(round(p * grid_m), int(grid_m))) for p in p_star]
        counts = pd.Series(labels).value_counts(normalize=True)
        shares.append({f"p*={k}": float(v) for k, v in counts.items()})
    share = pd.DataFrame(shares).fillna(0.0)
    share = share[sorted(share.columns, key=lambda c: Fraction(c[3:]))]
    metrics = [c for c in table.columns if c.startswith("metric_") and table[c].notna().any()]
    return pd.concat([table[[x, "source", "key", *names, *metrics]], share], axis=1)


HEADLINE = "spectral_adaptive"


def same_as_headline(frame, names: list[str]) -> list[str]:
    """The bounds among ``names`` whose value equals the headline's at every checkpoint (to the last
    digit but rounding: a variant that coincides, such as ``spectral_fixed_p0`` when every matrix
    chooses ``p* = 0``, or ``spectral_shared`` on a model without shared weights)."""
    if HEADLINE not in names:
        return []
    head = frame[HEADLINE].to_numpy(float)
    return [n for n in names if n != HEADLINE and np.allclose(frame[n].to_numpy(float), head, rtol=1e-12, atol=0)]


def figure_trajectory(store, *, x: str | None = None, bounds: list[str] | None = None):
    """The bounds along a run (log scale), the headline ``spectral_adaptive`` drawn last and thickest, a
    variant or baseline only where it differs from the headline (those that coincide are named in a
    note); below it, on the same axis, the records' training loss and evaluation metrics when they carry
    them; at the bottom, the share of the matrices choosing each Schatten index ``p*`` as one compact
    strip (p* up, the share as shade)."""
    frame = trajectory_frame(store, x=x, bounds=bounds)
    x = frame.columns[0]
    names = bounds or store.bound_names()
    hidden = same_as_headline(frame, names)
    drawn = [n for n in names if n not in hidden and n != HEADLINE] + ([HEADLINE] if HEADLINE in names else [])
    metrics = [c for c in frame.columns if c.startswith("metric_")]
    panels = ["bounds", *(["metrics"] if metrics else []), "p_star"]
    fig = new_figure((MAX_WIDTH, 4.2 + 1.6 * len(metrics[:1]) + 1.0))
    axes = dict(
        zip(panels, fig.subplots(len(panels), 1, sharex=True, height_ratios=[3.0, 1.5, 0.8][: len(panels) - 1] + [0.8]))
    )
    top = axes["bounds"]
    xs = frame[x].to_numpy(float)
    left_out = 0
    for i, name in enumerate(drawn):
        y, beyond = drawable(frame[name])
        left_out += beyond
        headline = name == HEADLINE
        top.plot(
            xs,
            y,
            color="black" if headline else bound_color(name),
            marker=MARKERS[i % len(MARKERS)],
            markersize=5 if headline else 3.5,
            linewidth=2.6 if headline else 1.0,
            alpha=1.0 if headline else 0.8,
            zorder=3 if headline else 2,
            label=bound_label(name) + (" (headline)" if headline else ""),
        )
    note_left_out(top, left_out)
    if hidden:
        top.text(
            0.99,
            0.01,
            f"equal to {HEADLINE} at every checkpoint, not drawn: {', '.join(hidden)}",
            transform=top.transAxes,
            fontsize=6.5,
            va="bottom",
            ha="right",
            color="0.3",
        )
    top.set_yscale("log")
    top.set_ylabel("bound value (log scale)")
    top.set_title(f"Bounds along the trajectory ({len(frame)} checkpoints of one shape)", fontsize=11)
    style_grid(top)
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside lower center", ncol=2, frameon=False, fontsize=6.5)
    if metrics:
        _draw_metrics(axes["metrics"], xs, frame, metrics)
    _draw_p_star_strip(fig, axes["p_star"], xs, frame)
    bottom = axes["p_star"]
    bottom.set_xlim(*_edges(xs)[[0, -1]])
    x_name = x[len("label_") :] if x.startswith("label_") else x
    bottom.set_xlabel(x_name if x != ORDER else "checkpoint (in source-name order)")
    if x == ORDER:
        bottom.set_xticks(xs, [short_name(s, 24) for s in frame["source"]], rotation=45, ha="right", fontsize=7)
    return fig


def _draw_metrics(ax, xs, frame, metrics: list[str]) -> None:
    """The records' own numbers (training loss, evaluation metrics) on the bounds' x axis, one line each."""
    for i, column in enumerate(metrics):
        values = frame[column].to_numpy(float)
        shown = np.isfinite(values)
        ax.plot(
            xs[shown],
            values[shown],
            marker=MARKERS[i % len(MARKERS)],
            markersize=3.5,
            linewidth=1.2,
            label=column[len("metric_") :],
        )
    ax.set_ylabel("metric")
    ax.set_title("The run's own numbers (training loss, evaluation metrics)", fontsize=9)
    style_grid(ax)
    ax.legend(frameon=False, fontsize=6.5, ncol=min(3, len(metrics)), loc="best")


def _draw_p_star_strip(fig, ax, xs, frame) -> None:
    """The share of the matrices at each chosen ``p*``: one cell per checkpoint and grid value, shaded
    by the share (a colour bar, not a legend entry per value)."""
    share_cols = [c for c in frame.columns if c.startswith("p*=")]
    values = np.array([float(Fraction(c[3:])) for c in share_cols])
    shares = frame[share_cols].to_numpy(float).T  # (p* values, checkpoints)
    x_edges = _edges(xs)
    y_edges = _edges(values) if len(values) > 1 else np.array([values[0] - 0.5, values[0] + 0.5])
    mesh = ax.pcolormesh(x_edges, y_edges, shares, cmap="Greys", vmin=0.0, vmax=1.0, shading="flat")
    ax.set_ylim(min(-0.05, y_edges[0]), max(2.05, y_edges[-1]))
    ax.set_yticks([0, 1, 2])
    ax.set_ylabel("p*")
    ax.set_title("Chosen Schatten index p* (shade: share of the matrices)", fontsize=9)
    bar = fig.colorbar(mesh, ax=ax, pad=0.01, aspect=8, fraction=0.04)
    bar.set_label("share", fontsize=7)
    bar.ax.tick_params(labelsize=6)


def _edges(centres: np.ndarray) -> np.ndarray:
    """Cell edges around sorted centres: halfway between neighbours, the end cells reaching 3% of the
    whole range beyond the first and last centre (one value: a unit cell)."""
    centres = np.asarray(centres, float)
    if len(centres) == 1:
        return np.array([centres[0] - 0.5, centres[0] + 0.5])
    margin = 0.03 * (centres[-1] - centres[0])
    mids = (centres[1:] + centres[:-1]) / 2
    return np.concatenate([[centres[0] - margin], mids, [centres[-1] + margin]])
