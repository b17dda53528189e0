"""Rank correlation between a measure and the generalisation gap: overall, and granulated per
hyper-parameter as in Jiang, Neyshabur, Mobahi, Krishnan & Bengio, "Fantastic Generalization
Measures and Where to Find Them", ICLR 2020, section 2.2 / eq. (4):

* overall: Kendall's tau (tau-b, ties allowed) between the measure and the gap over all runs;
* granulated, for hyper-parameter ``theta_i``: group the runs that agree in every other
  hyper-parameter (and the seed and task), take Kendall's tau within each group (the runs differ
  only in ``theta_i``), and average over the groups: ``psi_i``;
* ``Psi``: the mean of ``psi_i`` over the hyper-parameters;
* ``twins`` (ours): the same score over the twin pairs of the grid, (fewest examples, most epochs)
  against (most examples, fewest epochs) with everything else equal, which take the same number of
  optimiser steps in both grids: +1 if the measure orders every pair as the gap does.  A measure
  that ignores the data it was trained on cannot do better than chance here.

A positive tau means a larger measure goes with a larger gap.  Groups where the gap is constant
give no tau and are skipped; a measure constant over a group whose gap varies scores 0 there (see
:func:`kendall`); the number of groups used is reported.  Values lie in [-1, 1]; NaN means no
group could be ranked.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .grid import HPARAMS

GROUP_FIXED = ("task", "seed")  # besides the other hyper-parameters, always held fixed within a group


def kendall(x, y) -> float:
    """Kendall's tau-b of a measure ``x`` against a gap ``y``, over the entries where both are finite.

    Over all pairs ``i < j`` with ``sx = sign(x_i - x_j)`` and ``sy = sign(y_i - y_j)``:
    ``tau_b = sum(sx sy) / sqrt(sum(sx^2) sum(sy^2))`` (concordant minus discordant pairs over the
    geometric mean of the pairs untied in x and in y; equals ``scipy.stats.kendalltau``).  Direct
    O(n^2) numpy: the study has at most a few hundred runs and calls this thousands of times.

    Degenerate cases, as a score of "does the measure rank the gaps": NaN when there is nothing to
    rank (fewer than two entries, or the gap constant), and **0** when the gap varies but the
    measure is constant (tau-b is undefined there, but a measure that cannot tell the runs apart
    predicts nothing; e.g. the parameter count along training length).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 2:
        return math.nan
    i, j = np.triu_indices(x.size, k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    ties_free_y = float(np.sum(sy * sy))
    if ties_free_y == 0:
        return math.nan
    ties_free_x = float(np.sum(sx * sx))
    if ties_free_x == 0:
        return 0.0
    return float(np.sum(sx * sy)) / math.sqrt(ties_free_x * ties_free_y)


def groups_differing_in(runs: pd.DataFrame, hparam: str, hparams: tuple[str, ...] = HPARAMS) -> list[np.ndarray]:
    """Row positions of each group of runs that agree in every hyper-parameter but ``hparam`` (and
    in task and seed) and take at least two values of ``hparam``."""
    keys = [h for h in hparams if h != hparam] + [k for k in GROUP_FIXED if k in runs.columns]
    groups = []
    for rows in runs.reset_index(drop=True).groupby(keys, sort=False, dropna=False).indices.values():
        if runs[hparam].iloc[rows].nunique() >= 2:
            groups.append(rows)
    return groups


def granulated(runs: pd.DataFrame, measure: str, gap: str, hparam: str,
               hparams: tuple[str, ...] = HPARAMS, *, groups: list[np.ndarray] | None = None) -> tuple[float, int]:
    """``(psi, groups)``: Kendall's tau within each group of runs that differ only in ``hparam``,
    averaged over the groups that could be ranked (``groups``: precomputed
    :func:`groups_differing_in`)."""
    if groups is None:
        groups = groups_differing_in(runs, hparam, hparams)
    m, g = runs[measure].to_numpy(dtype=float), runs[gap].to_numpy(dtype=float)
    taus = [t for t in (kendall(m[rows], g[rows]) for rows in groups) if not math.isnan(t)]
    return (float(np.mean(taus)) if taus else math.nan), len(taus)


def twin_pairs(runs: pd.DataFrame) -> list[tuple[int, int]]:
    """Row positions ``(a, b)``: ``a`` trained on the task's fewest examples for the most epochs,
    ``b`` on the most examples for the fewest epochs, equal in depth, width, weight decay, seed."""
    runs = runs.reset_index(drop=True)
    pairs = []
    for _, sub in runs.groupby("task", sort=False):
        a = sub[(sub["train_size"] == sub["train_size"].min()) & (sub["epochs"] == sub["epochs"].max())]
        b = sub[(sub["train_size"] == sub["train_size"].max()) & (sub["epochs"] == sub["epochs"].min())]
        keys = ["depth", "width", "weight_decay", "seed"]
        index_b = {tuple(row): i for i, row in zip(b.index, b[keys].itertuples(index=False))}
        pairs += [(i, index_b[tuple(row)]) for i, row in zip(a.index, a[keys].itertuples(index=False))
                  if tuple(row) in index_b]
    return pairs


def twin_agreement(runs: pd.DataFrame, measure: str, gap: str, pairs: list[tuple[int, int]] | None = None
                   ) -> tuple[float, int]:
    """``(score, pairs)``: mean over twin pairs with different gaps of
    ``sign(m_a - m_b) sign(g_a - g_b)`` (Kendall's tau of each two-run pair, averaged)."""
    if pairs is None:
        pairs = twin_pairs(runs)
    m, g = runs[measure].to_numpy(dtype=float), runs[gap].to_numpy(dtype=float)
    taus = [t for t in (kendall(m[[a, b]], g[[a, b]]) for a, b in pairs) if not math.isnan(t)]
    return (float(np.mean(taus)) if taus else math.nan), len(taus)


def correlations(runs: pd.DataFrame, measures: pd.DataFrame, *, gaps: tuple[str, ...],
                 hparams: tuple[str, ...] = HPARAMS) -> pd.DataFrame:
    """Long table ``gap, measure, kind, scope, statistic, tau, groups``.

    ``scope`` is each task and ``"all"``; ``statistic`` is ``"overall"``, a hyper-parameter name
    (granulated ``psi_i``), ``"Psi"`` or ``"twins"`` (:func:`twin_agreement`).  For ``"all"`` the overall tau ranks runs of both tasks
    together, and the granulated groups are the tasks' groups pooled (a group never mixes tasks).
    """
    rows = []
    scopes = [(task, runs[runs["task"] == task]) for task in sorted(runs["task"].unique())] + [("all", runs)]
    groups = {(scope, h): groups_differing_in(sub, h, hparams) for scope, sub in scopes for h in hparams}
    twins = {scope: twin_pairs(sub) for scope, sub in scopes}
    for gap in gaps:
        for m in measures.itertuples():
            for scope, sub in scopes:
                base = {"gap": gap, "measure": m.column, "kind": m.kind, "scope": scope}
                rows.append({**base, "statistic": "overall", "tau": kendall(sub[m.column], sub[gap]),
                             "groups": len(sub)})
                psis = []
                for h in hparams:
                    psi, n = granulated(sub, m.column, gap, h, hparams, groups=groups[scope, h])
                    rows.append({**base, "statistic": h, "tau": psi, "groups": n})
                    psis.append(psi)
                finite = [p for p in psis if not math.isnan(p)]
                rows.append({**base, "statistic": "Psi", "tau": float(np.mean(finite)) if finite else math.nan,
                             "groups": len(finite)})
                score, n = twin_agreement(sub.reset_index(drop=True), m.column, gap, twins[scope])
                rows.append({**base, "statistic": "twins", "tau": score, "groups": n})
    return pd.DataFrame(rows)
