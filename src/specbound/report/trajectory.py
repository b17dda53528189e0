"""A training trajectory: a store whose records all have one shape (the checkpoints of one run).

Depth and width do not vary there, so the scaling fits of :mod:`specbound.report.scaling` have
nothing to fit against them; what varies is a pattern label (``label_step`` for
``run/step-{step=1000..9000..1000}``).  This module finds that label and draws every bound and the
share of each chosen Schatten index ``p*`` against it, from stored records only.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..errors import SpecboundError
from ..records.style import (MARKERS, MAX_WIDTH, bound_color, bound_label, drawable, natural_order, new_figure,
                             note_left_out, style_grid)
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
    hint = (f"fit against the label that varies: --against {labels[0]}" if labels else
            "no pattern label varies either: name the checkpoints with a pattern such as "
            "'run/step-{step=1000..9000..1000}' and fit with --against label_step")
    return (f"all {len(table)} records have L={L} and N={N}: depth and width do not vary, so there is no "
            f"scaling in L or N to fit; {hint} (`specbound plot` draws the trajectory)")


def trajectory_frame(store, *, x: str | None = None, bounds: list[str] | None = None):
    """One row per record, sorted along ``x``: ``x, source, key``, every (or each named) bound, and
    the share of the matrices choosing each ``p*`` (columns ``p*=k/m``).

    Parameters
    ----------
    store : Store
    x : str, optional
        The column to order by (default :func:`trajectory_axis`).
    bounds : list of str, optional
    """
    import pandas as pd

    table = store.table()
    x = x or trajectory_axis(table)
    if x is None:
        raise SpecboundError(f"the store {store.root} is not a trajectory: its records have more than one "
                             f"shape (L in {sorted(set(table['L']))}, N in {sorted(set(table['N']))})")
    names = bounds or store.bound_names()
    if x == ORDER:

        table = natural_order(table)
        table[ORDER] = np.arange(len(table))
    elif x not in table.columns:
        raise SpecboundError(f"no column {x!r} in the store; its labels are "
                             f"{', '.join(c for c in table.columns if c.startswith('label_')) or 'none'}")
    table = table.sort_values(x, kind="stable").reset_index(drop=True)
    shares = []
    for key, grid_m in zip(table["key"], table["grid_m"]):
        p_star = store.load(key, tables=("matrices",)).tables["matrices"]["p_star"].to_numpy(float)
        labels = [str(Fraction(round(p * grid_m), int(grid_m))) for p in p_star]
        counts = pd.Series(labels).value_counts(normalize=True)
        shares.append({f"p*={k}": float(v) for k, v in counts.items()})
    share = pd.DataFrame(shares).fillna(0.0)
    share = share[sorted(share.columns, key=lambda c: Fraction(c[3:]))]
    return pd.concat([table[[x, "source", "key", *names]], share], axis=1)


def figure_trajectory(store, *, x: str | None = None, bounds: list[str] | None = None):
    """Every bound against the training step (log scale), and below it the share of the matrices
    choosing each Schatten index ``p*`` at each step (stacked)."""
    from matplotlib import colormaps

    frame = trajectory_frame(store, x=x, bounds=bounds)
    x = frame.columns[0]
    names = bounds or store.bound_names()
    share_cols = [c for c in frame.columns if c.startswith("p*=")]
    fig = new_figure((MAX_WIDTH, 7.2))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2.2, 1.0))
    xs = frame[x].to_numpy(float)
    colors = [bound_color(n) for n in names]
    left_out = 0
    for i, name in enumerate(names):
        y, beyond = drawable(frame[name])
        left_out += beyond
        top.plot(xs, y, color=colors[i], marker=MARKERS[i % len(MARKERS)],
                 markersize=4, linewidth=1.3, label=bound_label(name))
    note_left_out(top, left_out)
    top.set_yscale("log")
    top.set_ylabel("bound value (log scale)")
    x_name = x[len("label_"):] if x.startswith("label_") else x
    top.set_title(f"Bounds along the trajectory ({len(frame)} checkpoints of one shape)", fontsize=11)
    style_grid(top)
    cmap = colormaps["viridis"]
    fractions = [float(Fraction(c[3:])) for c in share_cols]
    bottom.stackplot(xs, *(frame[c].to_numpy(float) for c in share_cols),
                     colors=[cmap(f / 2.0) for f in fractions], labels=share_cols, alpha=0.9)
    bottom.set_ylim(0, 1)
    bottom.set_xlim(xs.min(), xs.max())
    bottom.set_ylabel("share of matrices")
    bottom.set_xlabel(x_name if x != ORDER else "checkpoint (in source-name order)")
    bottom.set_title("Chosen Schatten index p* (share of the matrices)", fontsize=9)
    bottom.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), title="p*",
                  title_fontsize=7)
    if x == ORDER:
        bottom.set_xticks(xs, [short_name(s, 24) for s in frame["source"]], rotation=45, ha="right", fontsize=7)
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False, fontsize=7)
    return fig
