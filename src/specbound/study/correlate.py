"""How well a measure predicts the generalisation gap: Kendall's tau overall and granulated per
hyper-parameter, the conditional-mutual-information score ``K`` of Jiang et al. (2020), and the
robust sign-error of Dziugaite et al. (2020); each with a bootstrap interval.

* **overall tau**: Kendall's tau-b between the measure and the gap over a task's runs (``all``:
  runs of every task ranked together).
* **granulated psi_i** (Jiang, Neyshabur, Mobahi, Krishnan & Bengio, *Fantastic Generalization
  Measures and Where to Find Them*, ICLR 2020, eq. 4): runs that agree in every hyper-parameter but
  ``theta_i`` (and in task and seed) form a group; ``psi_i`` is the mean of the groups' taus;
  ``Psi`` the mean of the ``psi_i``.  In the one-at-a-time design a group is a base point's three
  values of ``theta_i`` for one seed.
* **K** (Jiang et al., section 5): over ordered pairs of runs ``(a, b)`` of a task with different
  gaps, ``V_g = sign(g_a - g_b)``, ``V_mu = sign(mu_a - mu_b)`` and ``U_S`` the values of the
  hyper-parameters in ``S`` for both runs; ``K = min over |S| <= 2 of I(V_mu; V_g | U_S) /
  H(V_g | U_S)`` (plug-in estimates from the pair counts).  In [0, 1]: 1 when, whatever the other
  hyper-parameters, the measure's order determines the gap's; K ignores the sign (a measure that
  orders every pair backwards also scores 1), so read it beside tau.  ``K_set`` says which ``S``
  attained the minimum.  Per task only (pooling pairs across tasks adds nothing the tasks lack).
* **sign-error** (Dziugaite, Drouin, Neal, Rajkumar, Caballero, Wang, Mitliagkas & Roy, *In search
  of robust measures of generalization*, NeurIPS 2020): an *environment* is a pair of
  configurations that differ in exactly one hyper-parameter's value, coupled over seeds (same seed,
  hence the same sample draw and initialisation stream).  A coupled pair's sign-error is
  ``(1 - sign(d mu) sign(d g)) / 2`` (0 right, 1 wrong, 1/2 for a tie in the measure); pairs whose
  gap difference is within the test set's noise (``|d g| <= 2 sqrt(sum e(1-e)/n_test)``, error
  gap only) are left out, as Dziugaite et al. do.  An environment's sign-error is the mean over its
  pairs; ``sign_error_max`` (the *robust* sign-error) is the worst environment's, ``sign_error_mean``
  the mean over environments.  0 is perfect, 0.5 is chance.

**Intervals**: 95% percentile bootstrap (``BOOTSTRAP`` replicates, fixed seed) that resamples
*clusters*, not runs (:func:`clusters`).  Runs of one seed share the training sample and the
initialisation stream, and the runs around one base point share that base run (it sits in every one
of the base point's groups and environments), so they are not independent draws; a cluster is one
task's runs of one seed around one base point, and every statistic of a replicate (tau, each psi_i
and Psi, K, the mean sign-error) is computed from the same draw of clusters, drawn within each task
for ``all``.  With fewer than two clusters to draw from there is no interval (NaN).  The robust
sign-error is a maximum over environments: a resample can only drop environments, so its bootstrap
never exceeds the observed value and says nothing about it; it has no interval, and the table says
how many environments (and coupled pairs) it rests on.  ``value_lo`` / ``value_hi`` in the table,
``clusters`` the number resampled.

Degenerate cases: a tau is NaN when the gap is constant, 0 when the measure is constant and the gap
is not (:func:`kendall`).  Positive tau: a larger measure goes with a larger gap.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from .grid import HPARAMS

GROUP_FIXED = ("task", "seed")  # besides the other hyper-parameters, always held fixed within a group
BOOTSTRAP = 200
BOOTSTRAP_K = 50  # K costs ~4 ms a replicate on ~90 runs (8,000 pairs x 29 sets)
LEVEL = 0.95
MAX_SET = 2  # |S| <= 2, as Jiang et al.


def kendall(x, y) -> float:
    """Kendall's tau-b of a measure ``x`` against a gap ``y``, over the entries where both are finite.

    Over all pairs ``i < j`` with ``sx = sign(x_i - x_j)`` and ``sy = sign(y_i - y_j)``:
    ``tau_b = sum(sx sy) / sqrt(sum(sx^2) sum(sy^2))`` (equals ``scipy.stats.kendalltau``).
    NaN when there is nothing to rank (fewer than two entries, or the gap constant); **0** when the
    gap varies but the measure is constant (a measure that cannot tell the runs apart predicts nothing).
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


def group_taus(runs: pd.DataFrame, measure: str, gap: str, groups: list[np.ndarray]) -> np.ndarray:
    """Kendall's tau within each group, NaN for the groups that cannot be ranked: ``(len(groups),)``."""
    m, g = runs[measure].to_numpy(dtype=float), runs[gap].to_numpy(dtype=float)
    return np.array([kendall(m[rows], g[rows]) for rows in groups], dtype=float)


def granulated(
    runs: pd.DataFrame,
    measure: str,
    gap: str,
    hparam: str,
    hparams: tuple[str, ...] = HPARAMS,
    *,
    groups: list[np.ndarray] | None = None,
) -> tuple[float, int]:
    """``(psi, groups)``: the mean of the taus of the groups that differ only in ``hparam`` and
    could be ranked, and how many there were."""
    if groups is None:
        groups = groups_differing_in(runs, hparam, hparams)
    taus = group_taus(runs, measure, gap, groups)
    taus = taus[~np.isnan(taus)]
    return (float(taus.mean()) if taus.size else math.nan), int(taus.size)


# --- Jiang et al.'s K ----------------------------------------------------------------------------------


def _codes(runs: pd.DataFrame, hparams: tuple[str, ...]) -> dict[tuple[str, ...], np.ndarray]:
    """For each ``S`` with ``|S| <= MAX_SET``: each run's code of its values on ``S`` (0 for S empty)."""
    out = {}
    for size in range(MAX_SET + 1):
        for subset in itertools.combinations(hparams, size):
            if subset:
                out[subset] = runs.groupby(list(subset), sort=True, dropna=False).ngroup().to_numpy()
            else:
                out[subset] = np.zeros(len(runs), dtype=np.int64)
    return out


def _pairs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ordered pairs of distinct positions of ``rows`` (a bootstrap resample may repeat a run: its
    pairs with its own copies are dropped)."""
    i, j = np.meshgrid(np.arange(rows.size), np.arange(rows.size), indexing="ij")
    keep = rows[i.ravel()] != rows[j.ravel()]
    return rows[i.ravel()[keep]], rows[j.ravel()[keep]]


def normalised_cmi(v_mu: np.ndarray, v_g: np.ndarray, cells: np.ndarray, n_cells: np.ndarray) -> np.ndarray:
    """``I(V_mu; V_g | cell) / H(V_g | cell)`` from plug-in frequencies, for several conditionings at
    once: ``cells`` ``(k, pairs)`` holds each conditioning's cell code (``0 <= code < n_cells[k]``);
    ``v_mu`` in {-1, 0, 1} and ``v_g`` in {-1, 1}, ``(pairs,)``.  Returns ``(k,)``, NaN where
    ``H(V_g | cell) = 0``."""
    offsets = np.concatenate([[0], np.cumsum(n_cells)[:-1]])
    total = int(np.sum(n_cells))
    flat = (cells + offsets[:, None]) * 6 + ((v_mu + 1) * 2 + (v_g > 0))[None, :]
    joint = np.bincount(flat.ravel(), minlength=6 * total).reshape(total, 3, 2) / v_g.size
    p_cell = joint.sum(axis=(1, 2))
    p_mu, p_g = joint.sum(axis=2), joint.sum(axis=1)  # (cells, 3), (cells, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = joint * p_cell[:, None, None] / (p_mu[:, :, None] * p_g[:, None, :])
        info = np.where(joint > 0, joint * np.log(ratio), 0.0).sum(axis=(1, 2))
        entropy = -np.where(p_g > 0, p_g * np.log(p_g / p_cell[:, None]), 0.0).sum(axis=1)
    owner = np.repeat(np.arange(len(n_cells)), n_cells)
    info_k = np.bincount(owner, weights=info, minlength=len(n_cells))
    entropy_k = np.bincount(owner, weights=entropy, minlength=len(n_cells))
    with np.errstate(divide="ignore", invalid="ignore"):
        # max(0, .): the plug-in information is >= 0 up to round-off
        return np.where(entropy_k > 1e-15, np.maximum(info_k, 0.0) / entropy_k, np.nan)


def k_score(
    measure: np.ndarray, gap: np.ndarray, codes: dict, rows: np.ndarray | None = None
) -> tuple[float, tuple[str, ...]]:
    """``(K, S)``: Jiang et al.'s ``min over |S| <= 2`` of the normalised conditional mutual
    information between the measure's and the gap's sign over pairs of runs (positions ``rows``,
    default all; runs with a non-finite measure or gap are left out)."""
    rows = np.arange(len(measure)) if rows is None else np.asarray(rows)
    rows = rows[np.isfinite(measure[rows]) & np.isfinite(gap[rows])]
    a, b = _pairs(rows)
    v_g = np.sign(gap[a] - gap[b]).astype(np.int64)
    keep = v_g != 0
    a, b, v_g = a[keep], b[keep], v_g[keep]
    if a.size == 0:
        return math.nan, ()
    v_mu = np.sign(measure[a] - measure[b]).astype(np.int64)
    subsets = list(codes)
    widths = np.array([int(codes[s].max()) + 1 for s in subsets])
    cells = np.stack([codes[s][a] * w + codes[s][b] for s, w in zip(subsets, widths)])
    values = normalised_cmi(v_mu, v_g, cells, widths**2)
    if np.all(np.isnan(values)):
        return math.nan, ()
    best = int(np.nanargmin(values))
    return float(values[best]), subsets[best]


# --- Dziugaite et al.'s sign-error --------------------------------------------------------------------


def environments(
    runs: pd.DataFrame, gap: str, hparams: tuple[str, ...] = HPARAMS, *, noise_filter: bool = True
) -> list[list[tuple[int, int]]]:
    """Each environment's coupled pairs ``(a, b)`` (row positions; ``a`` has the smaller value of the
    hyper-parameter that differs), keeping pairs whose gap difference exceeds the test noise."""
    runs = runs.reset_index(drop=True)
    g = runs[gap].to_numpy(dtype=float)
    if noise_filter and {"test_error", "n_test"} <= set(runs.columns):
        e, nt = runs["test_error"].to_numpy(dtype=float), runs["n_test"].to_numpy(dtype=float)
        var = e * (1 - e) / nt
    else:
        var = np.zeros(len(runs))
    envs: dict[tuple, list] = {}
    for h in hparams:
        others = [o for o in hparams if o != h] + (["task"] if "task" in runs.columns else [])
        for rows in groups_differing_in(runs, h, hparams):
            for a, b in itertools.combinations(rows, 2):
                if runs[h].iloc[a] > runs[h].iloc[b]:
                    a, b = b, a
                if not np.isfinite(g[a] - g[b]) or abs(g[a] - g[b]) <= 2 * math.sqrt(var[a] + var[b]):
                    continue
                key = (h, runs[h].iloc[a], runs[h].iloc[b], *runs[others].iloc[a].tolist())
                envs.setdefault(key, []).append((int(a), int(b)))
    return list(envs.values())


def pair_errors(runs: pd.DataFrame, measure: str, gap: str, envs: list[list[tuple[int, int]]]) -> list[np.ndarray]:
    """Each environment's coupled pairs' sign-errors ``(1 - sign(d mu) sign(d g)) / 2`` (NaN where
    the measure is not finite): one array per environment, ``(pairs,)``."""
    m, g = runs[measure].to_numpy(dtype=float), runs[gap].to_numpy(dtype=float)
    out = []
    for pairs in envs:
        a, b = np.array(pairs).T
        out.append((1 - np.sign(m[b] - m[a]) * np.sign(g[b] - g[a])) / 2)
    return out


def environment_errors(runs: pd.DataFrame, measure: str, gap: str, envs: list[list[tuple[int, int]]]) -> np.ndarray:
    """Mean sign-error of each environment (NaN where the measure is not finite): ``(len(envs),)``."""
    with np.errstate(all="ignore"):
        return np.array(
            [float(np.nanmean(e)) if np.isfinite(e).any() else math.nan for e in pair_errors(runs, measure, gap, envs)],
            dtype=float,
        )


# --- clusters: what the bootstrap resamples -------------------------------------------------------------


def clusters(runs: pd.DataFrame, hparams: tuple[str, ...] = HPARAMS) -> tuple[np.ndarray, np.ndarray]:
    """``(base, cluster)``: two labels per run, ``(len(runs),)`` each.

    Runs of one task and seed that differ in exactly one hyper-parameter are linked; a cluster is a
    connected set of linked runs.  In the one-at-a-time design (:mod:`.grid`) that is one base
    point's runs of one task and seed, because two base points' changes differ in at least
    ``7 - 2`` hyper-parameters.  ``base`` names the cluster's base point, the run linked to the most
    others, as ``A``, ``B``, ... in the order its hyper-parameters first appear; ``cluster`` is
    ``"<task>/<seed>/<base>"``.  Pass every run trained (before leaving out those that missed the
    criterion): without its base run a star falls apart into single runs.
    """
    runs = runs.reset_index(drop=True)
    n = len(runs)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return int(i)

    degree = np.zeros(n, dtype=np.int64)
    for h in hparams:
        for rows in groups_differing_in(runs, h, hparams):
            degree[rows] += len(rows) - 1
            for r in rows[1:]:
                parent[find(int(r))] = find(int(rows[0]))
    roots = np.array([find(i) for i in range(n)], dtype=np.int64)
    letters: dict[tuple, str] = {}
    base = np.empty(n, dtype=object)
    for root in dict.fromkeys(roots.tolist()):  # components in the order of their first run
        members = np.flatnonzero(roots == root)
        hub = members[int(np.argmax(degree[members]))]
        point = tuple(runs[list(hparams)].iloc[hub].tolist())
        base[members] = letters.setdefault(point, _letter(len(letters)))
    prefix = [runs[c].astype(str).to_numpy() for c in GROUP_FIXED if c in runs.columns]
    cluster = np.array(["/".join([*(p[i] for p in prefix), base[i]]) for i in range(n)], dtype=object)
    return base, cluster


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"B{i + 1}"


def cluster_draws(labels, strata, bootstrap: int, rng) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(codes, draws)``: each run's cluster code ``(runs,)``, and per replicate the codes of the
    clusters drawn (with replacement, as many as each stratum holds, within each stratum).  No
    draws when no stratum holds two clusters: one cluster cannot show its own variability."""
    codes, _ = pd.factorize(np.asarray(labels, dtype=object))
    strata = np.asarray(strata, dtype=object)
    per = [np.unique(codes[strata == s]) for s in pd.unique(strata)]
    if not per or max(p.size for p in per) < 2:
        return codes, []
    return codes, [np.concatenate([rng.choice(p, size=p.size, replace=True) for p in per]) for _ in range(bootstrap)]


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    """Mean of the finite ``values`` weighted by ``weights`` (a cluster drawn twice counts twice);
    NaN when no finite value has weight."""
    ok = np.isfinite(values) & (weights > 0)
    return float(np.sum(values[ok] * weights[ok]) / np.sum(weights[ok])) if ok.any() else math.nan


# --- the table ----------------------------------------------------------------------------------------


def _interval(samples) -> tuple[float, float]:
    s = np.asarray(samples, dtype=float)
    s = s[np.isfinite(s)]
    if s.size < 2:
        return math.nan, math.nan
    q = (1 - LEVEL) / 2
    return float(np.quantile(s, q)), float(np.quantile(s, 1 - q))


CORRELATION_COLUMNS = [
    "gap",
    "measure",
    "kind",
    "scope",
    "statistic",
    "value",
    "value_lo",
    "value_hi",
    "groups",
    "clusters",
    "environments",
    "pairs",
    "note",
]


def correlations(
    runs: pd.DataFrame,
    measures: pd.DataFrame,
    *,
    gaps: tuple[str, ...],
    hparams: tuple[str, ...] = HPARAMS,
    bootstrap: int = BOOTSTRAP,
    bootstrap_k: int = BOOTSTRAP_K,
    seed: int = 0,
) -> pd.DataFrame:
    """Long table with :data:`CORRELATION_COLUMNS`.

    ``scope``: each task, and ``"all"`` (overall tau ranks every run together; ``psi`` pools the
    tasks' groups, never mixing tasks; no K or sign-error).  ``statistic``: ``"overall"``, a
    hyper-parameter name (``psi_i``), ``"Psi"``, ``"K"`` (``note``: the minimising ``S``),
    ``"sign_error_max"``, ``"sign_error_mean"``.  ``groups``: runs, groups or environments used;
    ``clusters``: the clusters the interval resamples; ``environments`` and ``pairs`` (sign-errors
    only): the environments with a usable pair and their coupled pairs.  Pass ``runs`` already
    restricted to the runs that met the training criterion, with a ``cluster`` column from
    :func:`clusters` over every run trained (computed from ``runs`` when absent).
    """
    runs = runs.reset_index(drop=True)
    labels = runs["cluster"].to_numpy(dtype=object) if "cluster" in runs.columns else clusters(runs, hparams)[1]
    tasks = sorted(runs["task"].unique())
    scopes = [(t, np.flatnonzero((runs["task"] == t).to_numpy())) for t in tasks] + [("all", np.arange(len(runs)))]
    sub = {scope: runs.iloc[rows].reset_index(drop=True) for scope, rows in scopes}
    groups = {(s, h): groups_differing_in(sub[s], h, hparams) for s, _ in scopes for h in hparams}
    codes = {t: _codes(sub[t], hparams) for t in tasks}
    envs = {
        (t, gap): environments(sub[t], gap, hparams, noise_filter=gap == "error_gap") for t in tasks for gap in gaps
    }
    rng = np.random.default_rng(seed)
    # one draw of clusters per replicate and scope, shared by every statistic of that replicate
    cl, draws, members = {}, {}, {}
    for scope, rows in scopes:  # drawn within each task: the pooled scope keeps every task's share
        cl[scope], draws[scope] = cluster_draws(labels[rows], sub[scope]["task"].to_numpy(), bootstrap, rng)
        members[scope] = [np.flatnonzero(cl[scope] == c) for c in range(int(cl[scope].max()) + 1)]
    n_clusters = {scope: len(members[scope]) for scope, _ in scopes}
    weights = {scope: [np.bincount(d, minlength=n_clusters[scope]) for d in draws[scope]] for scope, _ in scopes}
    boot_rows = {scope: [np.concatenate([members[scope][c] for c in d]) for d in draws[scope]] for scope, _ in scopes}
    group_cluster = {
        (s, h): np.array([cl[s][g[0]] for g in groups[s, h]], dtype=np.int64) for s, _ in scopes for h in hparams
    }
    pair_cluster = {k: [cl[k[0]][np.array(p)[:, 0]] for p in v] for k, v in envs.items()}
    rows = []
    for gap in gaps:
        for m in measures.itertuples():
            for scope, _ in scopes:
                data = sub[scope]
                base = {"gap": gap, "measure": m.column, "kind": m.kind, "scope": scope, "clusters": n_clusters[scope]}
                x, y = data[m.column].to_numpy(dtype=float), data[gap].to_numpy(dtype=float)

                def add(statistic, value, samples, count, note="", **extra):
                    lo, hi = _interval(samples)
                    rows.append(
                        {
                            **base,
                            "statistic": statistic,
                            "value": value,
                            "value_lo": lo,
                            "value_hi": hi,
                            "groups": count,
                            "note": note,
                            **extra,
                        }
                    )

                add(
                    "overall", kendall(x, y), [kendall(x[r], y[r]) for r in boot_rows[scope]], int(np.isfinite(x).sum())
                )
                psis, psi_samples = [], []
                for h in hparams:
                    taus = group_taus(data, m.column, gap, groups[scope, h])
                    ok = ~np.isnan(taus)
                    psi = float(taus[ok].mean()) if ok.any() else math.nan
                    samples = [weighted_mean(taus, w[group_cluster[scope, h]]) for w in weights[scope]]
                    add(h, psi, samples, int(ok.sum()))
                    psis.append(psi)
                    psi_samples.append(samples if samples else [math.nan] * len(draws[scope]))
                finite = [p for p in psis if not math.isnan(p)]
                psi_matrix = np.array(psi_samples, dtype=float)  # (hparams, replicates)
                psi_boot = (
                    [np.nanmean(col) if np.isfinite(col).any() else math.nan for col in psi_matrix.T]
                    if draws[scope]
                    else []
                )
                add("Psi", float(np.mean(finite)) if finite else math.nan, psi_boot, len(finite))
                if scope == "all":
                    continue
                k, kset = k_score(x, y, codes[scope])
                add(
                    "K",
                    k,
                    [k_score(x, y, codes[scope], r)[0] for r in boot_rows[scope][:bootstrap_k]],
                    len(data),
                    note="S = {" + ", ".join(kset) + "}",
                )
                per_pair = pair_errors(data, m.column, gap, envs[scope, gap])
                used = [e for e in per_pair if np.isfinite(e).any()]
                errors = np.array([float(np.nanmean(e)) for e in used], dtype=float)
                counts = {"environments": len(used), "pairs": int(sum(np.isfinite(e).sum() for e in used))}
                add(
                    "sign_error_max",
                    float(errors.max()) if errors.size else math.nan,
                    [],
                    len(used),
                    note="a maximum over environments: no bootstrap interval",
                    **counts,
                )
                clusters_of = pair_cluster[scope, gap]
                samples = []
                for w in weights[scope]:
                    env_values = np.array([weighted_mean(e, w[c]) for e, c in zip(per_pair, clusters_of)], dtype=float)
                    samples.append(float(np.nanmean(env_values)) if np.isfinite(env_values).any() else math.nan)
                add("sign_error_mean", float(errors.mean()) if errors.size else math.nan, samples, len(used), **counts)
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)
