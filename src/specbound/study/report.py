"""The study's report: tables (Markdown and CSV) and figures, read from the records.

Reports never recompute a statistic: they read the runs table, the correlations and the p* table.
Files written into the study folder::

    report.md            setup, runs that missed the criterion, per-task tables with intervals, pooled
                         table, loss gap, vacuity, p* by depth, timing
    runs.csv             one row per run (every run, ``converged`` says which met the criterion)
    correlations.csv     tau / psi / Psi / K / sign-errors with ``value_lo`` / ``value_hi`` (converged runs)
    scaling.csv          every bound's growth exponent in depth and in width, per task and pooled
    pstar.csv            one row per analysed matrix: its p* and log10 downstream factor
    study.json           timing and the command
    figures/bounds_vs_gap_<task>.png   every bound, gap bound and reference predictor against the gap
    figures/psi_per_axis.png           psi per hyper-parameter with its interval, per task
    figures/bounds_vs_depth_width.png  each headline bound against depth and against width, log-log
    figures/pstar_by_depth.png         p* over matrices along each base point's depth axis, per task

Every figure is written as PNG at print resolution (200 dpi) and as PDF beside it, at most a page's
text width (7.5 in) wide.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..records.style import MAX_WIDTH, PRINT_DPI, bound_color, save_figure
from ..records.view import markdown_table
from .correlate import kendall
from .grid import HPARAMS
from .scaling import SCALING_AXES, axis_groups
from .table import PRIMARY_GAP

HPARAM_LABELS = {
    "depth": "depth",
    "width": "width",
    "train_size": "n",
    "lr": "lr",
    "batch_size": "batch",
    "weight_decay": "wd",
    "dropout": "dropout",
}
HEADLINE = (
    "spectral_adaptive",
    "edelman",
    "bft",
    "spectral_product",
    "frobenius_product",
    "gap:spectral_adaptive",
    "pacbayes_flatness",
    "inverse_margin",
)
# the scaling figure's bounds: the paper's two, the norm products, and the parameter count (pure counting)
SCALING_FIGURE = ("spectral_adaptive", "edelman", "bft", "spectral_product", "frobenius_product", "param_count")


def _converged(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["converged"].astype(bool)]


def _ci(v, lo, hi, signed: bool = True) -> str:
    """``value [lo, hi]`` with two decimals (signed for taus; K and sign-errors lie in [0, 1])."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    f = "{:+.2f}" if signed else "{:.2f}"
    if math.isnan(lo) or math.isnan(hi):
        return f.format(v)
    return f"{f.format(v)} [{f.format(lo)}, {f.format(hi)}]"


# --- tables ---------------------------------------------------------------------------------------


def _lookup(corr: pd.DataFrame, gap: str) -> dict:
    sub = corr[corr["gap"] == gap]
    return {(r.measure, r.scope, r.statistic): r for r in sub.itertuples()}


def task_table(corr: pd.DataFrame, measures: pd.DataFrame, task: str, gap: str = PRIMARY_GAP) -> pd.DataFrame:
    """One row per measure for one task: overall tau, Psi, K (with its set S) and the sign-errors,
    each ``value [lo, hi]``."""
    get = _lookup(corr, gap)
    rows = []
    for m in measures.itertuples():
        row = {"measure": m.column, "kind": m.kind}
        for stat, label in (
            ("overall", "tau"),
            ("Psi", "Psi"),
            ("K", "K"),
            ("sign_error_max", "robust sign-error"),
            ("sign_error_mean", "mean sign-error"),
        ):
            r = get.get((m.column, task, stat))
            row[label] = _ci(r.value, r.value_lo, r.value_hi, stat in ("overall", "Psi")) if r is not None else "n/a"
        r = get.get((m.column, task, "sign_error_max"))
        row["sign-error environments (pairs)"] = _count(r)
        r = get.get((m.column, task, "K"))
        row["K set"] = r.note.replace("S = ", "") if r is not None and isinstance(r.note, str) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def _count(r) -> str:
    """``environments (pairs)`` behind a sign-error row; ``n/a`` without one."""
    env = getattr(r, "environments", math.nan) if r is not None else math.nan
    if env is None or (isinstance(env, float) and math.isnan(env)):
        return "n/a"
    return f"{int(env)} ({int(r.pairs)})"


def psi_table(corr: pd.DataFrame, measures: pd.DataFrame, scope: str, gap: str = PRIMARY_GAP) -> pd.DataFrame:
    """One row per measure: psi per hyper-parameter ``value [lo, hi]`` for one scope."""
    get = _lookup(corr, gap)
    rows = []
    for m in measures.itertuples():
        row = {"measure": m.column}
        for h in HPARAMS:
            r = get.get((m.column, scope, h))
            row[HPARAM_LABELS[h]] = _ci(r.value, r.value_lo, r.value_hi) if r is not None else "n/a"
        rows.append(row)
    return pd.DataFrame(rows)


def pooled_table(corr: pd.DataFrame, measures: pd.DataFrame, gap: str = PRIMARY_GAP) -> pd.DataFrame:
    get = _lookup(corr, gap)
    rows = []
    for m in measures.itertuples():
        row = {"measure": m.column}
        for stat, label in (("overall", "tau (all runs ranked together)"), ("Psi", "Psi (tasks' groups pooled)")):
            r = get.get((m.column, "all", stat))
            row[label] = _ci(r.value, r.value_lo, r.value_hi) if r is not None else "n/a"
        rows.append(row)
    return pd.DataFrame(rows)


def vacuity_table(runs: pd.DataFrame, measures: pd.DataFrame) -> pd.DataFrame:
    """For each gap bound over the given runs: how often it is vacuous (>= 1), its smallest and
    median value, and the median ratio to the measured error gap (runs with a positive gap)."""
    rows = []
    positive = runs[PRIMARY_GAP] > 0
    for m in measures[measures["kind"].str.startswith("gap_bound")].itertuples():
        flag = m.column.replace("gap:", "vacuous:", 1)
        values = runs[m.column]
        vacuous = runs[flag].fillna(True).astype(bool) if flag in runs else pd.Series(True, index=runs.index)
        rows.append(
            {
                "gap bound": m.column,
                "vacuous in": f"{int(vacuous.sum())}/{len(runs)} runs",
                "min": float(values.min()),
                "median": float(values.median()),
                "median bound / gap": float((values[positive] / runs.loc[positive, PRIMARY_GAP]).median()),
            }
        )
    return pd.DataFrame(rows)


def scaling_summary(scaling: pd.DataFrame, axis: str) -> pd.DataFrame:
    """One row per bound: its growth exponent along ``axis`` per task and over all tasks, each as
    ``median [lo, hi] (groups)``, then the pooled within-group exponent over all tasks
    (``pooled [lo, hi]``; older scaling.csv files without it: the column is left out)."""
    sub = scaling[scaling["axis"] == axis]
    scopes = [t for t in sorted(set(sub["task"])) if t != "all"] + (["all"] if "all" in set(sub["task"]) else [])
    get = {(r.bound, r.task): r for r in sub.itertuples()}
    rows = []
    for bound in dict.fromkeys(sub["bound"]):
        row = {"bound": bound}
        for scope in scopes:
            r = get.get((bound, scope))
            row[scope] = f"{_ci(r.slope, r.slope_lo, r.slope_hi, signed=False)} ({int(r.groups)})" if r else "n/a"
        r = get.get((bound, "all"))
        if r is not None and "pooled" in sub.columns:
            row["all, pooled within-group"] = _ci(r.pooled, r.pooled_lo, r.pooled_hi, signed=False)
        rows.append(row)
    return pd.DataFrame(rows)


def task_summary(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for task, sub in runs.groupby("task"):
        ok = _converged(sub)
        row = {
            "task": task,
            "runs": len(sub),
            "met the criterion": len(ok),
            "test examples": int(sub["n_test"].iloc[0]),
        }
        for col in ("steps", "train_error", "test_error", "error_gap", "margin", "row_norm_max"):
            v = ok[col] if len(ok) else sub[col]
            row[col + " (min / median / max)"] = f"{v.min():.3g} / {v.median():.3g} / {v.max():.3g}"
        rows.append(row)
    return pd.DataFrame(rows)


def excluded_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that missed the criterion, with what they reached."""
    missed = runs[~runs["converged"].astype(bool)]
    cols = ["run", "task", *HPARAMS, "seed", "steps", "train_loss", "train_error", "test_error"]
    return missed[cols].reset_index(drop=True)


def depth_axis_pstar(pstar: pd.DataFrame, runs: pd.DataFrame | None) -> tuple[pd.DataFrame, list[str]]:
    """The matrices of runs that met the criterion, and the keys to compare depths by.

    With ``runs`` (holding ``base``): only the runs of each base point's depth axis (runs that differ
    from another run in depth alone), keyed by ``task, base, depth``, so that depth is not mixed with
    the base point (in the one-at-a-time design most depth-2 runs belong to one base and most deeper
    ones to the other).  Without: every run, by ``task, depth``."""
    ok = pstar[pstar["converged"].astype(bool)] if len(pstar) else pstar
    if runs is None or "base" not in runs.columns or ok.empty:
        return ok, ["task", "depth"]

    conv = runs[runs["converged"].astype(bool)].reset_index(drop=True)
    on_axis = conv.loc[axis_groups(conv, "depth") >= 0, ["run", "base"]]
    return ok.merge(on_axis, on="run"), ["task", "base", "depth"]


def pstar_summary(pstar: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per task, base point and depth (:func:`depth_axis_pstar`; runs that met the criterion): how
    many matrices chose each p*."""
    ok, keys = depth_axis_pstar(pstar, runs)
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "matrices"])
    ok = ok.assign(bin=pstar_bin(ok["p_star"]))
    table = ok.groupby([*keys, "bin"]).size().unstack(fill_value=0)
    table = table[[label for _, _, label in PSTAR_BINS if label in table.columns]]
    table.columns = [f"p* {c}" for c in table.columns]
    table.insert(0, "runs", ok.groupby(keys)["run"].nunique())
    table.insert(1, "matrices", table.drop(columns="runs").sum(axis=1))
    table.insert(2, "median p*", ok.groupby(keys)["p_star"].median())
    return table.reset_index()


PSTAR_BINS = (
    (0.0, 0.0, "0 (rank)"),
    (0.0, 0.5, "(0, 1/2]"),
    (0.5, 1.0, "(1/2, 1]"),
    (1.0, 2.0 - 1e-12, "(1, 2)"),
    (2.0 - 1e-12, math.inf, "2"),
)


def pstar_bin(p: np.ndarray) -> np.ndarray:
    """The label of each p*'s bin (:data:`PSTAR_BINS`: 0, (0, 1/2], (1/2, 1], (1, 2), 2)."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, "", dtype=object)
    for lo, hi, label in PSTAR_BINS:
        out[(p == 0) if hi == 0 else ((p > lo) & (p <= hi))] = label
    return out


def _cell(column, v) -> str:
    """A study table's entry: booleans as yes/no, NaN as ``n/a``, numbers to three digits."""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "n/a"
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"
    return str(v)


def markdown(df: pd.DataFrame) -> str:
    """A Markdown table of a study table (the one writer, :func:`specbound.records.view.markdown_table`)."""
    return markdown_table(df, _cell)


# --- figures --------------------------------------------------------------------------------------


def _save(fig, path: Path, dpi: int = PRINT_DPI) -> Path:
    """``path`` (PNG) and the PDF beside it, in the one figure style; the pyplot figure is closed."""
    import matplotlib.pyplot as plt

    save_figure(fig, path, dpi=dpi)
    plt.close(fig)
    return path


def plot_against_gap(
    runs: pd.DataFrame,
    columns: list[str],
    path: Path,
    *,
    title: str,
    gap: str = PRIMARY_GAP,
    ncols: int = 4,
    panel_size: tuple[float, float] = (1.9, 1.75),
) -> Path:
    """One panel per measure: log10 of its value (the value itself if not all positive) against the
    measured gap over one task's runs that met the criterion, coloured by depth; the title carries
    Kendall's tau.  Gap bounds get a dashed line at 1 (vacuous to the right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows = max(1, math.ceil(len(columns) / ncols))
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(min(panel_size[0] * ncols, MAX_WIDTH), panel_size[1] * nrows + 0.9), squeeze=False
    )
    depths = sorted(runs["depth"].unique())
    cmap = plt.get_cmap("viridis")
    colours = {d: cmap(i / max(len(depths) - 1, 1) * 0.9) for i, d in enumerate(depths)}
    for ax, col in zip(axes.flat, columns):
        values = runs[col].to_numpy(dtype=float)
        finite = values[np.isfinite(values)]
        positive = bool(finite.size and np.all(finite > 0))
        x = np.log10(values) if positive else values
        for d in depths:
            sel = (runs["depth"] == d).to_numpy()
            ax.scatter(x[sel], runs.loc[sel, gap], s=9, color=colours[d], label=f"depth {d}", linewidths=0)
        if col.startswith("gap:") and positive:
            ax.axvline(0.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{col}\n$\\tau$ {kendall(values, runs[gap]):+.2f}", fontsize=6)
        ax.set_xlabel("log10 value" if positive else "value", fontsize=6, labelpad=1)
        ax.set_ylabel(gap.replace("_", " "), fontsize=6, labelpad=1)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[len(columns) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=8)
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.07, right=0.99, top=1 - 0.75 / height, bottom=0.55 / height, wspace=0.45, hspace=0.75)
    return _save(fig, path)


def plot_psi(corr: pd.DataFrame, measures: list[str], path: Path, *, gap: str = PRIMARY_GAP) -> Path:
    """psi per hyper-parameter with its bootstrap interval, a panel per task, a marker per measure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = corr[(corr["gap"] == gap) & corr["statistic"].isin(HPARAMS) & corr["measure"].isin(measures)]
    scopes = [s for s in sorted(sub["scope"].unique()) if s != "all"] + (["all"] if "all" in set(sub["scope"]) else [])
    fig, axes = plt.subplots(len(scopes), 1, figsize=(MAX_WIDTH, 1.7 * len(scopes) + 0.8), squeeze=False, sharex=True)
    cmap = plt.get_cmap("tab10")
    width = 0.8 / max(len(measures), 1)
    for ax, scope in zip(axes[:, 0], scopes):
        for k, m in enumerate(measures):
            rows = sub[(sub["scope"] == scope) & (sub["measure"] == m)].set_index("statistic").reindex(list(HPARAMS))
            x = np.arange(len(HPARAMS)) - 0.4 + width * (k + 0.5)
            v, lo, hi = (rows[c].to_numpy(dtype=float) for c in ("value", "value_lo", "value_hi"))
            err = np.vstack([np.where(np.isnan(lo), 0, v - lo), np.where(np.isnan(hi), 0, hi - v)])
            ax.errorbar(x, v, yerr=err, fmt="o", ms=2.5, lw=0.8, color=cmap(k % 10), label=m)
        if not np.isfinite(sub.loc[sub["scope"] == scope, "value"].to_numpy(dtype=float)).any():
            ax.text(
                0.5,
                0.5,
                "no group of runs that met the criterion could be ranked",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=7,
                color="grey",
            )
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_ylim(-1.05, 1.05)
        ax.set_ylabel(rf"$\psi$ ({scope})", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xticks(np.arange(len(HPARAMS)), [HPARAM_LABELS[h] for h in HPARAMS])
    axes[-1, 0].set_xlim(-0.5, len(HPARAMS) - 0.5)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=6, frameon=False)
    fig.suptitle(
        rf"granulated Kendall $\tau$ ($\psi$) against the {gap.replace('_', ' ')}, 95% bootstrap intervals over "
        rf"clusters",
        fontsize=8,
    )
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.09, right=0.99, top=1 - 0.35 / height, bottom=0.75 / height, hspace=0.15)
    return _save(fig, path)


def plot_pstar(pstar: pd.DataFrame, path: Path, runs: pd.DataFrame | None = None) -> Path:
    """Share of matrices choosing each p*, by depth along each base point's depth axis
    (:func:`depth_axis_pstar`), a panel per task (runs that met the criterion)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok, keys = depth_axis_pstar(pstar, runs)
    ok = ok.assign(bin=pstar_bin(ok["p_star"]))
    tasks = sorted(ok["task"].unique()) or ["(none)"]
    values = [label for _, _, label in PSTAR_BINS]
    cmap = plt.get_cmap("plasma")
    colours = {p: cmap(i / max(len(values) - 1, 1) * 0.9) for i, p in enumerate(values)}
    fig, axes = plt.subplots(
        1, len(tasks), figsize=(min(max(2.4 * len(tasks), 5.0), MAX_WIDTH), 2.8), squeeze=False, sharey=True
    )
    for ax, task in zip(axes[0], tasks):
        t = ok[ok["task"] == task]
        bars = sorted(set(map(tuple, t[keys[1:]].to_numpy().tolist())))  # (base, depth) or (depth,)
        select = [np.all(t[keys[1:]].to_numpy() == np.array(b, dtype=object), axis=1) for b in bars]
        bottom = np.zeros(len(bars))
        for p in values:
            share = np.array([(t.loc[sel, "bin"] == p).mean() for sel in select])
            ax.bar(np.arange(len(bars)), share, bottom=bottom, color=colours[p], label=f"p* {p}")
            bottom += share
        ax.set_xticks(np.arange(len(bars)), ["/".join(map(str, b)) for b in bars], fontsize=6)
        ax.set_xlabel("base point / depth" if len(keys) == 3 else "depth", fontsize=7)
        ax.set_title(task, fontsize=8)
        ax.tick_params(labelsize=6)
    axes[0, 0].set_ylabel("share of matrices", fontsize=7)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(len(labels), 1), fontsize=6, frameon=False)
    where = "along each base point's depth axis" if len(keys) == 3 else "as depth grows"
    fig.suptitle(f"the spectrum-adaptive bound's chosen p* {where}\n(share of analysed matrices)", fontsize=8)
    fig.subplots_adjust(left=0.1, right=0.99, top=0.8, bottom=0.3, wspace=0.1)
    return _save(fig, path)


def _spread(ends: dict, ax, gap: float = 0.07) -> dict:
    """Label heights (log10) for the lines ending at ``ends`` (``bound -> (slope, log10 end)``), moved
    apart to at least ``gap`` of the panel's log range so that labels of equal slopes do not overlap."""
    if not ends:
        return {}
    low, high = np.log10(ax.get_ylim())
    step = gap * max(high - low, 1e-9)
    order = sorted(ends, key=lambda b: ends[b][1])
    blocks = [[b] for b in order]  # runs of labels placed together, centred on their lines' mean end

    def place(block):
        centre = float(np.mean([ends[b][1] for b in block]))
        return [centre + step * (k - (len(block) - 1) / 2) for k in range(len(block))]

    merged = True
    while merged:
        merged = False
        for i in range(len(blocks) - 1):
            if place(blocks[i])[-1] + step > place(blocks[i + 1])[0]:
                blocks[i : i + 2] = [blocks[i] + blocks[i + 1]]
                merged = True
                break
    return {b: (ends[b][0], y) for block in blocks for b, y in zip(block, place(block))}


def plot_scaling(runs: pd.DataFrame, scaling: pd.DataFrame, bounds: list[str], path: Path) -> Path:
    """The paper's scaling figure on trained runs: each bound against depth (top row) and against
    width (bottom row), log-log, a column per task.  Thin lines: each group of runs that differ only
    in that axis, divided by its value at the group's smallest depth (width), so that groups from
    different base points and seeds start together; thick dashed line: the median exponent of
    ``scaling`` (label: its value)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    tasks = sorted(runs["task"].unique())
    get = {(r.task, r.bound, r.axis): r.slope for r in scaling.itertuples()}
    colours = {b: bound_color(b) for b in bounds}
    # an axis along which no task has a group (a depth-only grid) gets no row of empty panels
    drawn_axes = [
        a
        for a in SCALING_AXES
        if any((axis_groups(runs[runs["task"] == t].reset_index(drop=True), a) >= 0).any() for t in tasks)
    ] or list(SCALING_AXES)
    fig, axes = plt.subplots(
        len(drawn_axes),
        len(tasks),
        figsize=(min(max(2.45 * len(tasks), 5.0), MAX_WIDTH), 2.6 * len(drawn_axes)),
        squeeze=False,
    )
    for i, axis in enumerate(drawn_axes):
        for j, task in enumerate(tasks):
            ax = axes[i, j]
            sub = runs[runs["task"] == task].reset_index(drop=True)
            label = axis_groups(sub, axis)
            grid = np.array(sorted(sub.loc[label >= 0, axis].unique()), dtype=float)
            ends = {}
            for z, bound in enumerate(reversed(bounds)):  # the first bound drawn last, on top
                for g in np.unique(label[label >= 0]):
                    rows = sub[label == g].sort_values(axis)
                    x, v = rows[axis].to_numpy(dtype=float), rows[bound].to_numpy(dtype=float)
                    ok = np.isfinite(v) & (v > 0)
                    if ok.sum() >= 2:
                        ax.plot(
                            x[ok],
                            v[ok] / v[ok][0],
                            color=colours[bound],
                            lw=0.5,
                            alpha=0.4,
                            marker="o",
                            ms=1.5,
                            zorder=2 + z,
                        )
                slope = get.get((task, bound, axis), math.nan)
                if grid.size >= 2 and np.isfinite(slope):
                    ax.plot(grid, (grid / grid[0]) ** slope, color=colours[bound], lw=1.4, ls="--", zorder=20 + z)
                    ends[bound] = (slope, slope * math.log10(grid[-1] / grid[0]))
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())  # a panel spanning under a decade labels minor ticks
            for bound, (slope, y) in _spread(ends, ax).items():
                ax.annotate(
                    f"{slope:.1f}",
                    (grid[-1], 10**y),
                    fontsize=5,
                    color=colours[bound],
                    xytext=(2, 0),
                    textcoords="offset points",
                    va="center",
                )
            if grid.size:
                ax.set_xticks(grid, [f"{v:g}" for v in grid])
                ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set_xlim(grid[0] * 0.93, grid[-1] * 1.25)
            ax.set_title(f"{task}: against {axis}", fontsize=7)
            ax.set_xlabel(axis, fontsize=6, labelpad=1)
            ax.tick_params(labelsize=6)
            ax.grid(True, which="major", lw=0.4, alpha=0.3)
        axes[i, 0].set_ylabel(f"B / B at the group's smallest {axis}", fontsize=6)
    handles = [Line2D([], [], color=colours[b], lw=1.4, label=b) for b in bounds]
    wide = fig.get_figwidth() >= 6
    fig.legend(handles=handles, loc="lower center", ncol=min(len(bounds), 6 if wide else 3), fontsize=6, frameon=False)
    fig.suptitle(
        f"each bound against {' and '.join(drawn_axes)}, trained runs, log-log\nthin: groups of runs differing "
        f"only in that axis; dashed: the median exponent (value at the right)",
        fontsize=7,
    )
    one = len(drawn_axes) == 1
    fig.subplots_adjust(
        left=0.12,
        right=0.96,
        top=0.78 if one else 0.89,
        bottom=(0.24 if one else 0.12) if wide else (0.3 if one else 0.15),
        wspace=0.35,
        hspace=0.45,
    )
    return _save(fig, path)


# --- the report -----------------------------------------------------------------------------------


def write_report(
    out: Path,
    runs: pd.DataFrame,
    measures: pd.DataFrame,
    corr: pd.DataFrame,
    pstar: pd.DataFrame,
    *,
    timing: dict,
    scaling: pd.DataFrame | None = None,
    command: str | None = None,
    figures: bool = True,
) -> dict[str, Path]:
    out = Path(out)
    scaling = (
        pd.DataFrame(columns=["task", "bound", "axis", "slope", "slope_lo", "slope_hi", "groups"])
        if scaling is None
        else scaling
    )
    names = ["runs.csv", "correlations.csv", "scaling.csv", "study.json", "report.md"]
    if len(pstar) or not timing.get("reported_from"):  # a re-report without pstar.csv writes none
        names.append("pstar.csv")
    files = {name: out / name for name in names}
    runs.to_csv(files["runs.csv"], index=False)
    corr.to_csv(files["correlations.csv"], index=False)
    scaling.to_csv(files["scaling.csv"], index=False)
    if "pstar.csv" in files:
        pstar.to_csv(files["pstar.csv"], index=False)
    files["study.json"].write_text(json.dumps({"command": command, **timing}, indent=1))
    ok = _converged(runs)
    if figures and len(ok):
        fig_dir = out / "figures"
        columns = [c for c in measures["column"] if not c.endswith("]") and c != "param_count"]
        for task, sub in ok.groupby("task"):
            files[f"bounds_vs_gap_{task}.png"] = plot_against_gap(
                sub.reset_index(drop=True),
                columns,
                fig_dir / f"bounds_vs_gap_{task}.png",
                title=f"{task}: every bound, gap bound and reference predictor against the {PRIMARY_GAP} "
                f"({len(sub)} runs that met the criterion)",
            )
        headline = [c for c in HEADLINE if c in set(measures["column"])]
        files["psi_per_axis.png"] = plot_psi(corr, headline, fig_dir / "psi_per_axis.png")
        drawn = [b for b in SCALING_FIGURE if b in set(scaling["bound"])]
        if drawn:
            files["bounds_vs_depth_width.png"] = plot_scaling(ok, scaling, drawn, fig_dir / "bounds_vs_depth_width.png")
        if len(pstar):
            files["pstar_by_depth.png"] = plot_pstar(pstar, fig_dir / "pstar_by_depth.png", runs)
    files["report.md"].write_text(
        format_report(
            runs,
            measures,
            corr,
            pstar,
            scaling=scaling,
            timing=timing,
            command=command,
            figures=[p.name for k, p in files.items() if k.endswith(".png")],
        )
    )
    return files


def format_report(
    runs: pd.DataFrame,
    measures: pd.DataFrame,
    corr: pd.DataFrame,
    pstar: pd.DataFrame,
    *,
    timing: dict,
    command: str | None,
    figures: list[str],
    scaling: pd.DataFrame | None = None,
) -> str:
    ok = _converged(runs)
    tasks = sorted(runs["task"].unique())
    n_clusters = ok["cluster"].nunique() if "cluster" in ok.columns else "n/a"
    if timing.get("reported_from"):
        done = (
            f"rebuilt from the stored {timing['reported_from']} alone (no run folder read, nothing trained or analysed)"
        )
    else:
        done = (
            f"{timing['trained']} trained and {timing['analysed']} analysed now, {timing['skipped']} reused; "
            f"{timing['seconds_training_and_analysis']:.0f} s of training and analysis in this invocation"
        )
    parts = [
        "# Does the bound track generalization? Study report",
        "",
        f"Command: `{command or 'specbound study'}`  ",
        f"Grid `{timing['grid']}`: {len(runs)} runs ({', '.join(timing['tasks'])}), {len(ok)} met the training "
        f"criterion; {done}. Recorded in "
        f"the runs: {runs['cpu_seconds'].sum():.0f} CPU s of training and measuring summed over runs "
        f"(at most {runs['cpu_seconds'].max():.0f} s for one run). Bootstrap: {timing.get('bootstrap')} replicates "
        f"over {n_clusters} clusters.",
        "",
        "Definitions (docs/study.md): every run trains until train cross-entropy <= 0.01 or train error <= 1% "
        "(step cap in `runs.csv`: `max_steps`); runs that miss it are listed below and **left out of every "
        "statistic**. **error gap** = test error - train error. Gap bounds use the margin gamma = 10th percentile "
        "of the training logit margins / (head Lipschitz constant x the largest observed norm of the rows the head "
        "reads), the unstated constants = 1, delta = 0.05. tau: Kendall's tau-b, > 0 when a larger measure goes "
        "with a larger gap; Psi: mean of the granulated psi (Jiang et al. 2020); K: Jiang et al.'s conditional "
        "mutual information score, min over |S| <= 2 (sign-blind, in [0, 1]); robust sign-error: the worst "
        "environment's sign-error (Dziugaite et al. 2020; 0 perfect, 0.5 chance), beside how many environments "
        "(and coupled pairs) survive the criterion and the noise filter: a sign-error resting on a few environments "
        "says little. Brackets: 95% bootstrap intervals that resample **clusters**, not runs: a cluster is one base "
        "point's runs of one task and seed (they share the training sample, the initialisation stream and the base "
        "run), drawn within each task for the pooled scope; one draw per replicate serves every statistic. The "
        "robust sign-error is a maximum (a resample can only drop environments, so its bootstrap cannot exceed the "
        "observed value): it has no interval.",
        "",
        "## Runs",
        "",
        markdown(task_summary(runs)),
        "",
        "### Runs that missed the criterion (excluded)",
        "",
    ]
    missed = excluded_table(runs)
    parts += [markdown(missed) if len(missed) else "None: every run met it.", ""]
    for task in tasks:
        parts += [
            f"## {task}: each measure against the error gap",
            "",
            markdown(task_table(corr, measures, task).drop(columns="kind")),
            "",
            f"### {task}: granulated psi per hyper-parameter",
            "",
            markdown(psi_table(corr, measures, task)),
            "",
        ]
    parts += [
        "## All tasks pooled (read the per-task tables first)",
        "",
        markdown(pooled_table(corr, measures)),
        "",
        "## Against the loss gap (test - train cross-entropy), per task",
        "",
    ]
    for task in tasks:
        t = task_table(corr, measures, task, "loss_gap")[["measure", "tau", "Psi", "K"]]
        parts += [f"### {task}", "", markdown(t), ""]
    parts += [
        "## Are the gap bounds vacuous? (runs that met the criterion)",
        "",
        markdown(vacuity_table(ok, measures)) if len(ok) else "No run met the criterion.",
        "",
    ]
    if scaling is not None and len(scaling):
        parts += scaling_section(scaling)
    parts += ["## p* along each base point's depth axis (matrices of runs that met the criterion)", ""]
    if len(pstar):
        parts += [
            "Only the runs that differ from another run in depth alone, by base point: pooling every run "
            "of a depth would compare base points (in the one-at-a-time design most depth-2 runs belong "
            "to one base and most deeper ones to the other).",
            "",
            markdown(pstar_summary(pstar, runs)),
            "",
        ]
    else:
        parts += [
            "No per-matrix table (`pstar.csv`) in this study folder, so no p* table: it is written by a "
            "study that analyses its runs.",
            "",
        ]
    if figures:
        parts += ["## Figures", "", "PNG at 200 dpi; each also as PDF beside it (`figures/*.pdf`).", ""]
        parts += [f"![{name}](figures/{name})" for name in figures] + [""]
    return "\n".join(parts)


def scaling_section(scaling: pd.DataFrame) -> list[str]:
    """The report's growth-exponent section: the reading, then a table per axis."""
    parts = [
        "## How each bound grows with depth and width (the paper's scaling claim, on trained runs)",
        "",
        "Each entry: the median over groups of runs that differ only in that axis (same task, seed and every "
        "other hyper-parameter) of the group's least-squares slope of log B on log depth (log width), with a "
        "95% bootstrap interval over clusters and the number of groups; `all` pools every task's groups, "
        "and `all, pooled within-group` is one least-squares slope over every group's runs at once with an "
        "intercept per group (`scaling.csv`; the fit is `specbound scaling`'s, `report.scaling.group_slopes`). For "
        "contrast, "
        "the same fit on random checkpoints of the BERT Miniatures' shapes: `specbound miniatures`, "
        "`specbound sweep`, `specbound scaling --detail` (its `median over` rows; docs/study-results.md).",
        "",
        "A slope is the growth rate of a complexity term in this grid's range, not a generalisation "
        "guarantee: the bounds multiply it by log n / (margin sqrt n), and how it ranks the measured gaps is "
        "the tables above. Where the adaptive bound chooses p* = 0 (the rank count) each matrix contributes "
        "about sqrt(rank x N) (docs/bounds.md), so it grows like the number of matrices in depth and, for "
        "full-rank matrices, like N in width, whatever the training did; the Edelman-style proxy multiplies "
        "Lipschitz factors through the depth.",
        "",
    ]
    for axis in ("depth", "width"):
        table = scaling_summary(scaling, axis)
        if len(table):
            parts += [f"### growth exponent in {axis}", "", markdown(table), ""]
    return parts


def format_study(result) -> str:
    """What ``specbound study`` prints: the runs, those excluded, and per task the headline
    measures' tau, Psi, K and robust sign-error with intervals."""
    runs, measures, corr, timing = result.runs, result.measures, result.correlations, result.timing
    ok = _converged(runs)
    head = measures[measures["column"].isin(HEADLINE)]
    lines = [
        f"study '{timing['grid']}': {len(runs)} runs ({timing['trained']} trained now, {timing['skipped']} reused) "
        f"in {timing['seconds']:.0f} s; {len(ok)} met the training criterion, {len(runs) - len(ok)} excluded"
    ]
    if timing["grid"] == "quick":  # too few runs per task for its correlations to mean anything
        lines.append(
            "a smoke test: the quick grid checks that training, analysis and statistics run; with this few "
            "runs per task its correlations say nothing (the default grid: specbound study)"
        )
    lines.append("")
    for task in sorted(runs["task"].unique()):
        table = task_table(corr, head, task)[["measure", "tau", "Psi", "K", "robust sign-error"]]
        lines += [
            f"{task} (error gap, {int(ok['task'].eq(task).sum())} runs; 95% bootstrap intervals over clusters):",
            table.to_string(index=False),
            "",
        ]
    scaling = getattr(result, "scaling", None)
    if scaling is not None and len(scaling):
        pooled = scaling[(scaling["task"] == "all") & scaling["bound"].isin(("spectral_adaptive", "edelman"))]
        lines.append(
            "growth exponents, all tasks (median over groups [95% interval], groups; pooled within-group fit):"
        )
        for r in pooled.itertuples():
            extra = f"; pooled {_ci(r.pooled, r.pooled_lo, r.pooled_hi, signed=False)}" if hasattr(r, "pooled") else ""
            lines.append(
                f"  {r.bound} in {r.axis}: {_ci(r.slope, r.slope_lo, r.slope_hi, signed=False)} ({r.groups})" + extra
            )
        lines.append("")
    lines.append("report: " + str(result.files.get("report.md", "")))
    return "\n".join(lines)
