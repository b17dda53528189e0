"""How each bound grows with depth and width on the trained runs: the paper's scaling claim
(Sakai & Imaizumi 2026, Section 5: its proxy grows much more slowly in depth ``L`` and width ``N``
than the Edelman-style proxy), measured on models trained to the criterion instead of random ones.

For an axis (``depth`` or ``width``) a *group* is a set of runs that differ only in that axis
(:func:`.correlate.groups_differing_in`: same task, seed and every other hyper-parameter; in the
one-at-a-time design, a base point's values on the axis for one seed).  A group's growth exponent
is the least-squares slope of ``log B`` on ``log x`` over its runs
(:func:`specbound.report.scaling.group_slopes`, the fitter of ``specbound scaling``); a task's
exponent is the **median over its groups**, and ``all`` the median over every task's groups.
Beside it, the **pooled within-group exponent** (``pooled``): one least-squares slope of ``log B``
on ``log x`` over every group's runs at once, with one intercept per group (the fixed-effects fit
of :func:`specbound.report.scaling.loglog_fit`), so that every run counts and a group of three is
not summarised by its own slope first.  Intervals: 95% percentile bootstrap that resamples clusters
(:func:`.correlate.clusters`: one base point's runs of one task and seed), within each task for
``all``; NaN with fewer than two clusters.

What a slope is: the growth rate, in this grid's range (depth 2-6, width 32-128), of a complexity
term that the bounds multiply by ``log n / (margin sqrt n)``; it is not a generalisation guarantee
and says nothing by itself about the measured gap.  In the ``p* = 0`` regime (the rank count) a
matrix's spectrum-adaptive term is about ``sqrt(rank)`` times a norm ratio, so the adaptive bound
grows about linearly in the number of matrices (``L``) and like ``sqrt(rank) <= sqrt(N)`` per
matrix; the Edelman-style proxy multiplies Lipschitz factors through the depth.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..report.scaling import group_slopes
from .correlate import LEVEL, cluster_draws, clusters, groups_differing_in
from .grid import HPARAMS

SCALING_AXES = ("depth", "width")
SCALING_COLUMNS = [
    "task",
    "bound",
    "axis",
    "slope",
    "slope_lo",
    "slope_hi",
    "pooled",
    "pooled_lo",
    "pooled_hi",
    "groups",
    "clusters",
]


def axis_groups(runs: pd.DataFrame, axis: str, hparams: tuple[str, ...] = HPARAMS) -> np.ndarray:
    """Each run's group along ``axis`` (an index into :func:`groups_differing_in`), -1 for a run in
    none: ``(len(runs),)``."""
    label = np.full(len(runs), -1, dtype=np.int64)
    for k, rows in enumerate(groups_differing_in(runs.reset_index(drop=True), axis, hparams)):
        label[rows] = k
    return label


def slopes_by_group(runs: pd.DataFrame, bound: str, axis: str, hparams: tuple[str, ...] = HPARAMS) -> pd.DataFrame:
    """One row per group along ``axis``: ``task, cluster, group, runs, slope`` (the group's own
    log-log slope of ``bound``; NaN where fewer than two of its values are positive and finite)."""
    runs = runs.reset_index(drop=True)
    label = axis_groups(runs, axis, hparams)
    inside = label >= 0
    if not inside.any():
        return pd.DataFrame(columns=["task", "cluster", "group", "runs", "slope"])
    levels, slopes = group_slopes(
        runs.loc[inside, axis].to_numpy(float), runs.loc[inside, bound].to_numpy(float), label[inside]
    )
    first = {k: int(np.flatnonzero(label == k)[0]) for k in levels}
    return pd.DataFrame(
        {
            "task": [runs["task"].iloc[first[k]] for k in levels],
            "cluster": [runs["cluster"].iloc[first[k]] for k in levels],
            "group": levels,
            "runs": [int((label == k).sum()) for k in levels],
            "slope": slopes,
        }
    )


def median_with_interval(slopes: pd.DataFrame, bootstrap: int, rng) -> tuple[float, float, float, int]:
    """``(median, lo, hi, clusters)`` of the groups' finite slopes, the interval from resampling
    clusters within each task (a cluster drawn twice counts its groups twice)."""
    ok = slopes[np.isfinite(slopes["slope"].to_numpy(dtype=float))]
    if ok.empty:
        return math.nan, math.nan, math.nan, 0
    values = ok["slope"].to_numpy(dtype=float)
    codes, draws = cluster_draws(ok["cluster"].to_numpy(), ok["task"].to_numpy(), bootstrap, rng)
    n_clusters = int(codes.max()) + 1
    samples = [np.median(np.repeat(values, np.bincount(d, minlength=n_clusters)[codes])) for d in draws]
    lo, hi = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]) if samples else (math.nan, math.nan)
    return float(np.median(values)), float(lo), float(hi), n_clusters


def within_group_logs(runs: pd.DataFrame, bound: str, axis: str, hparams: tuple[str, ...] = HPARAMS) -> pd.DataFrame:
    """Every run of a group along ``axis`` with ``log x`` and ``log B`` centred on its group's mean:
    ``task, cluster, dx, dy`` (one row per run; runs whose bound is not positive and finite, and
    groups left with fewer than two distinct values of ``x``, are dropped).  The pooled slope is then
    ``sum(dx dy) / sum(dx^2)``."""
    parts = []
    for task, sub in runs.groupby("task", sort=True):
        sub = sub.reset_index(drop=True)
        label = axis_groups(sub, axis, hparams)
        x = sub[axis].to_numpy(float)
        y = sub[bound].to_numpy(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            ok = (label >= 0) & (x > 0) & np.isfinite(y) & (y > 0)
        frame = pd.DataFrame(
            {
                "task": task,
                "cluster": sub["cluster"].to_numpy()[ok],
                "group": label[ok],
                "lx": np.log(x[ok]),
                "ly": np.log(y[ok]),
            }
        )
        frame = frame[frame.groupby("group")["lx"].transform(np.ptp) > 0]
        frame["dx"] = frame["lx"] - frame.groupby("group")["lx"].transform("mean")
        frame["dy"] = frame["ly"] - frame.groupby("group")["ly"].transform("mean")
        parts.append(frame[["task", "cluster", "dx", "dy"]])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["task", "cluster", "dx", "dy"])


def pooled_with_interval(logs: pd.DataFrame, bootstrap: int, rng) -> tuple[float, float, float]:
    """``(slope, lo, hi)``: the pooled within-group slope of :func:`within_group_logs`' rows and its
    cluster-bootstrap interval (clusters resampled within each task; a cluster drawn twice weighs
    its runs twice, which leaves the group means, and so ``dx, dy``, unchanged)."""
    if logs.empty or not (logs["dx"] ** 2).sum() > 0:
        return math.nan, math.nan, math.nan
    dx, dy = logs["dx"].to_numpy(float), logs["dy"].to_numpy(float)
    slope = float(dx @ dy / (dx @ dx))
    codes, draws = cluster_draws(logs["cluster"].to_numpy(), logs["task"].to_numpy(), bootstrap, rng)
    n_clusters = int(codes.max()) + 1
    samples = []
    for d in draws:
        w = np.bincount(d, minlength=n_clusters)[codes]
        den = float(w @ (dx * dx))
        if den > 0:
            samples.append(float(w @ (dx * dy)) / den)
    lo, hi = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]) if samples else (math.nan, math.nan)
    return slope, float(lo), float(hi)


def scaling_slopes(
    runs: pd.DataFrame,
    bounds: list[str],
    *,
    axes: tuple[str, ...] = SCALING_AXES,
    hparams: tuple[str, ...] = HPARAMS,
    bootstrap: int = 200,
    seed: int = 0,
) -> pd.DataFrame:
    """The table ``scaling.csv``: :data:`SCALING_COLUMNS`, one row per task (and ``all``), bound and
    axis.  ``groups``: groups with a finite slope; ``clusters``: the clusters they fall in.

    Pass the runs that met the criterion, with the ``cluster`` column of :func:`.correlate.clusters`
    over every run trained (computed from ``runs`` when absent).
    """
    runs = runs.reset_index(drop=True)
    if "cluster" not in runs.columns:
        runs = runs.assign(cluster=clusters(runs, hparams)[1])
    rng = np.random.default_rng(seed)
    rows = []
    for axis in axes:
        for bound in bounds:
            per_task = {
                task: slopes_by_group(sub, bound, axis, hparams) for task, sub in runs.groupby("task", sort=True)
            }
            logs = within_group_logs(runs, bound, axis, hparams)
            scopes = list(per_task.items()) + [("all", pd.concat(per_task.values(), ignore_index=True))]
            for scope, slopes in scopes:
                slope, lo, hi, n_clusters = median_with_interval(slopes, bootstrap, rng)
                pooled, p_lo, p_hi = pooled_with_interval(
                    logs if scope == "all" else logs[logs["task"] == scope], bootstrap, rng
                )
                rows.append(
                    {
                        "task": scope,
                        "bound": bound,
                        "axis": axis,
                        "slope": slope,
                        "slope_lo": lo,
                        "slope_hi": hi,
                        "pooled": pooled,
                        "pooled_lo": p_lo,
                        "pooled_hi": p_hi,
                        "groups": int(np.isfinite(slopes["slope"].to_numpy(float)).sum()),
                        "clusters": n_clusters,
                    }
                )
    return pd.DataFrame(rows, columns=SCALING_COLUMNS)
