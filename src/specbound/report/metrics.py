"""Every bound against your own metrics (``metric_<name>`` columns of a store's table, from
``metrics.json`` beside each checkpoint or ``sweep --metrics FILE``): Kendall's tau with its p-value
over the records that have both, a table for ``specbound scaling`` and ``report``, and a figure.

Kendall's tau is a rank correlation, so it is the same for a bound and for its logarithm, and a
bound beyond float64 (stored as null with a finite ``log10``) is ranked by its ``log10``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..bounds import in_group
from ..records.style import MAX_WIDTH, bound_color, drawable, new_figure, note_left_out, style_grid

PREFIX = "metric_"


def metric_names(table) -> list[str]:
    """The metrics a store's table carries (``metric_<name>`` columns with a value in two or more records)."""
    return [c[len(PREFIX) :] for c in table.columns if c.startswith(PREFIX) and table[c].notna().sum() >= 2]


def _log10_column(table, bound: str) -> np.ndarray:
    column = f"log10_{bound}"
    if column in table:
        return table[column].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(table[bound].to_numpy(float))


def metric_correlations(table, bounds: list[str]) -> pd.DataFrame:
    """One row per (bound, metric): ``bound, metric, records`` (with both values), ``kendall_tau`` and
    its two-sided ``p_value`` (scipy's, the tau-b variant; NaN under three records or a constant column)."""
    from scipy.stats import kendalltau

    rows = []
    for metric in metric_names(table):
        values = table[PREFIX + metric].to_numpy(float)
        for bound in bounds:
            logs = _log10_column(table, bound)
            both = np.isfinite(values) & np.isfinite(logs)
            n = int(both.sum())
            tau = p = math.nan
            if n >= 3 and np.ptp(values[both]) > 0 and np.ptp(logs[both]) > 0:
                result = kendalltau(logs[both], values[both])
                tau, p = float(result.statistic), float(result.pvalue)
            rows.append({"bound": bound, "metric": metric, "records": n, "kendall_tau": tau, "p_value": p})
    return pd.DataFrame(rows, columns=["bound", "metric", "records", "kendall_tau", "p_value"])


def figure_metrics(store, *, bounds: list[str] | None = None):
    """Each headline bound (or each of ``bounds``, up to three) against each metric (up to four), one
    panel per pair, Kendall's tau in its title; None when the store has no metric."""
    table = store.table()
    metrics = metric_names(table)[:4]
    if not metrics:
        return None
    names = [b for b in (bounds or in_group("bounds")) if b in table][:3]
    taus = metric_correlations(table, names).set_index(["bound", "metric"])["kendall_tau"]
    fig = new_figure((MAX_WIDTH, 1.0 + 2.3 * len(metrics)))
    axes = fig.subplots(len(metrics), len(names), squeeze=False)
    left_out = 0
    for i, metric in enumerate(metrics):
        for j, bound in enumerate(names):
            ax = axes[i][j]
            y, beyond = drawable(10.0 ** np.clip(_log10_column(table, bound), -300, 300))
            left_out += beyond
            ax.plot(table[PREFIX + metric].to_numpy(float), y, "o", color=bound_color(bound), markersize=4)
            ax.set_yscale("log")
            tau = taus.get((bound, metric), math.nan)
            ax.set_title(f"{bound}: tau = {tau:+.2f}" if math.isfinite(tau) else f"{bound}: tau undefined", fontsize=8)
            ax.set_xlabel(metric, fontsize=8)
            style_grid(ax)
    note_left_out(axes[-1][-1], left_out)
    fig.suptitle("Every headline bound against your metrics (Kendall's tau over the records)", fontsize=9)
    return fig
