"""``specbound scaling``: how every bound grows with depth and width, from stored records.

The paper's central claim (Sakai & Imaizumi 2026, Section 5, the BERT Miniatures) is that its
proxy grows much more slowly with depth ``L`` and width ``N`` than the Edelman-style proxy.  Here
that is measured as log-log slopes: for a quantity ``B`` over a family,

    log B = b log x + c_g + e,

where ``x`` is the varied dimension (``L``) and each group ``g`` of the held-fixed one (``N``) has its
own intercept ``c_g``: ``b`` is the growth exponent "with ``L`` at fixed ``N``", pooled over every
fixed ``N``.  Ordinary least squares gives ``b`` and its confidence interval (Student t, with
``points - groups - 1`` degrees of freedom); the per-group fits are available too.

Quantities (one per bound and role):

* every bound the records carry, whatever its name (role ``all``);
* each bound restricted to the matrices of one role, where the record has the per-matrix terms:
  ``spectral_adaptive`` -> ``sum_{role} C(p*)`` (the bound is that sum over roles plus ``sqrt(L)``);
  ``edelman`` -> ``(sum_{role} alpha_l^(2/3) (w ||W||_{2,1})^(2/3))^(3/2)`` with the weights ``w`` of
  docs/spec.md section 5 (``gamma*/2`` for QK, ``gamma*`` otherwise), i.e. the bound over that role's
  matrices alone (the constant 1 left out, like ``sqrt(L)`` above).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

from ..bounds.edelman import edelman_weight, matrix_terms
from ..bounds.schatten import log_sum
from ..errors import SpecboundError
from .trajectory import is_same_shape, no_variation_message

ALL = "all"
LN10 = math.log(10)


def _adaptive_by_role(matrices) -> dict[str, float]:
    """``log10`` of each role's ``sum C(p*)`` (NaN where a contribution overflowed and was stored null)."""
    sums = matrices.groupby("role", sort=False)["contribution"].sum(min_count=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {role: float(np.log10(v)) if v > 0 else math.nan for role, v in sums.items()}


def edelman_terms(matrices) -> np.ndarray:
    """Per-matrix term of the Edelman-style proxy from a record's matrices table (the bound's own
    :func:`~specbound.bounds.edelman.matrix_terms`): ``B_edelman = (1 + sum of terms)^(3/2)``."""
    return matrix_terms(
        matrices["downstream_factor"].to_numpy(float),
        matrices["role"].to_numpy(),
        matrices["gamma"].to_numpy(float),
        matrices["norm_2_1"].to_numpy(float),
    )


def log_edelman_terms(matrices) -> np.ndarray:
    """``ln`` of :func:`edelman_terms`, from the table's ``log10_downstream_factor`` where it has one:
    finite where the downstream factor overflowed float64 (and was stored null)."""
    alpha = matrices["downstream_factor"].to_numpy(float)
    log_alpha = (
        matrices["log10_downstream_factor"].to_numpy(float) * LN10
        if "log10_downstream_factor" in matrices
        else np.full(len(alpha), np.nan)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        log_alpha = np.where(np.isfinite(log_alpha), log_alpha, np.log(alpha))
        weighted = edelman_weight(matrices["role"].to_numpy(), matrices["gamma"].to_numpy(float)) * matrices[
            "norm_2_1"
        ].to_numpy(float)
        return (2 / 3) * (log_alpha + np.log(weighted))


def _edelman_by_role(matrices) -> dict[str, float]:
    """``log10`` of each role's Edelman-style bound, summed in logs (it overflows float64 long before
    it stops being meaningful)."""
    logs = matrices.assign(_t=log_edelman_terms(matrices))
    return {role: 1.5 * log_sum(part["_t"].to_numpy(float)) / LN10 for role, part in logs.groupby("role", sort=False)}


# bound name -> log10 of its value restricted to each role, from a record's matrices table
ROLE_BREAKDOWN: dict[str, Callable] = {"spectral_adaptive": _adaptive_by_role, "edelman": _edelman_by_role}


def quantities(store, bounds: list[str] | None = None):
    """Long table of every quantity of every record: ``key, source, L, N, label_*, bound, role,
    value, log10_value``.  ``value`` is NaN where the quantity overflows float64; ``log10_value`` is
    finite wherever the quantity is positive (the fits use it).

    Parameters
    ----------
    store : Store
    bounds : list of str, optional
        Only these bounds (default: every bound found in the records).
    """
    table = store.table()
    if table.empty:
        raise SpecboundError(f"the results store {store.root} holds no records; run `specbound sweep` first")
    names = bounds or store.bound_names()
    missing = [b for b in names if b not in table.columns]
    if missing:
        raise SpecboundError(
            f"no bound named {', '.join(missing)} in the store; it holds {', '.join(store.bound_names())}"
        )
    ident = ["key", "source", "family", "L", "N"] + [c for c in table.columns if c.startswith("label_")]
    rows = []
    for _, rec in table.iterrows():
        base = {k: rec[k] for k in ident}
        for name in names:
            rows.append(
                {
                    **base,
                    "bound": name,
                    "role": ALL,
                    "value": float(rec[name]),
                    "log10_value": float(rec.get(f"log10_{name}", math.nan)),
                }
            )
        wanted = [n for n in names if n in ROLE_BREAKDOWN]
        if wanted:
            matrices = store.load(rec["key"], tables=("matrices",)).tables["matrices"]
            for name in wanted:
                for role, log10 in ROLE_BREAKDOWN[name](matrices).items():
                    value = 10.0**log10 if math.isfinite(log10) and log10 < 300 else math.nan
                    rows.append({**base, "bound": name, "role": role, "value": value, "log10_value": float(log10)})
    return pd.DataFrame(rows)


def loglog_fit(
    x: np.ndarray,
    y: np.ndarray | None,
    groups: np.ndarray | None = None,
    confidence: float = 0.95,
    *,
    log10_y: np.ndarray | None = None,
) -> dict[str, float]:
    """OLS of ``log y`` on ``log x`` with one intercept per group (``log10_y``: the logs given
    instead of ``y``, finite where ``y`` overflows).

    Returns
    -------
    dict with ``slope, ci_low, ci_high, stderr, r2`` (of the within-group fit), ``points, dof``.
    Non-positive or non-finite values are left out; the slope is NaN when no group has two values
    of ``x``, the interval NaN without degrees of freedom (:func:`summary_table` says so in words).
    """
    from scipy import stats

    x = np.asarray(x, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.asarray(log10_y, float) * LN10 if log10_y is not None else np.log(np.asarray(y, float))
    groups = np.zeros(len(x), dtype=int) if groups is None else np.asarray(groups)
    ok = (x > 0) & np.isfinite(x) & np.isfinite(logs)
    lx, ly, g = np.log(x[ok]), logs[ok], groups[ok]
    levels = list(dict.fromkeys(g.tolist()))
    # keep groups where x varies: a single-point group only fixes its own intercept
    levels = [lv for lv in levels if np.ptp(lx[g == lv]) > 0]
    keep = np.isin(g, levels)
    lx, ly, g = lx[keep], ly[keep], g[keep]
    n, k = len(lx), len(levels) + 1
    nan = float("nan")
    if not levels:
        return {"slope": nan, "ci_low": nan, "ci_high": nan, "stderr": nan, "r2": nan, "points": n, "dof": 0}
    design = np.column_stack([lx] + [(g == lv).astype(float) for lv in levels])
    beta, *_ = np.linalg.lstsq(design, ly, rcond=None)
    resid = ly - design @ beta
    dof = n - k
    slope = float(beta[0])
    # within-group variation of log x and log y (the intercepts removed)
    cx = lx - np.array([lx[g == v].mean() for v in g])
    cy = ly - np.array([ly[g == v].mean() for v in g])
    sxx, syy = float(cx @ cx), float(cy @ cy)
    r2 = 1.0 - float(resid @ resid) / syy if syy > 0 else 1.0
    if dof > 0:
        stderr = math.sqrt(float(resid @ resid) / dof / sxx)
        half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * stderr
    else:
        stderr = half = nan
    return {
        "slope": slope,
        "ci_low": slope - half,
        "ci_high": slope + half,
        "stderr": stderr,
        "r2": r2,
        "points": n,
        "dof": dof,
    }


def group_slopes(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> tuple[list, np.ndarray]:
    """Each group's own growth exponent: :func:`loglog_fit` of ``y`` on ``x`` within the group.

    Returns ``(levels, slopes)``: the groups in order of first appearance and their slopes
    ``(len(levels),)``, NaN for a group in which ``x`` does not vary (or has under two positive values).
    """
    x, y, groups = np.asarray(x, float), np.asarray(y, float), np.asarray(groups)
    levels = list(dict.fromkeys(groups.tolist()))
    slopes = np.array([loglog_fit(x[groups == lv], y[groups == lv])["slope"] for lv in levels], dtype=float)
    return levels, slopes


def scaling_fits(data, *, x: str = "L", by: str | None = "N", confidence: float = 0.95, per_group: bool = False):
    """Growth exponent of every (bound, role) in ``x`` with ``by`` held fixed.

    Parameters
    ----------
    data : DataFrame
        From :func:`quantities`.
    x : str
        The varied column (``"L"``, ``"N"`` or a label such as ``"label_step"``).
    by : str or None
        The column held fixed (one intercept per value); None: a single group.
    per_group : bool
        Also one row per fixed value (``fixed = "N=128"``) and the median of their slopes
        (``fixed = "median over N"``, :func:`group_slopes`; no interval), besides the pooled row
        (``fixed = "all N"``).

    Returns
    -------
    DataFrame: ``bound, role, against, fixed, points, dof, slope, ci_low, ci_high, stderr, r2``.
    """
    for col in (x, by):
        if col is not None and col not in data.columns:
            raise SpecboundError(
                f"no column {col!r} to fit against; the records have "
                f"{', '.join(c for c in data.columns if c not in ('bound', 'role', 'value'))}"
            )
    rows = []
    for (bound, role), part in data.groupby(["bound", "role"], sort=False):
        groups = part[by].to_numpy() if by else None
        fit = loglog_fit(part[x].to_numpy(float), None, groups, confidence, log10_y=part["log10_value"].to_numpy(float))
        rows.append({"bound": bound, "role": role, "against": x, "fixed": f"all {by}" if by else "-", **fit})
        if per_group and by:
            for value, sub in part.groupby(by, sort=True):
                fit = loglog_fit(
                    sub[x].to_numpy(float), None, None, confidence, log10_y=sub["log10_value"].to_numpy(float)
                )
                rows.append({"bound": bound, "role": role, "against": x, "fixed": f"{by}={value}", **fit})
            _, slopes = group_slopes(part[x].to_numpy(float), part["value"].to_numpy(float), part[by].to_numpy())
            finite = slopes[np.isfinite(slopes)]
            nan = float("nan")
            rows.append(
                {
                    "bound": bound,
                    "role": role,
                    "against": x,
                    "fixed": f"median over {by}",
                    "points": len(part),
                    "dof": 0,
                    "slope": float(np.median(finite)) if finite.size else nan,
                    "ci_low": nan,
                    "ci_high": nan,
                    "stderr": nan,
                    "r2": nan,
                }
            )
    cols = ["bound", "role", "against", "fixed", "points", "dof", "slope", "ci_low", "ci_high", "stderr", "r2"]
    return pd.DataFrame(rows, columns=cols)


def scaling_table(
    store,
    *,
    bounds: list[str] | None = None,
    confidence: float = 0.95,
    per_group: bool = False,
    against: list[tuple[str, str | None]] = (("L", "N"), ("N", "L")),
):
    """All fits: for each ``(x, by)`` in ``against`` (default: ``L`` at fixed ``N``, ``N`` at fixed ``L``)."""
    data = quantities(store, bounds)
    if all(x in data.columns and data[x].nunique() < 2 for x, _ in against):
        table = store.table()
        if is_same_shape(table):  # a run's checkpoints: say which label to fit against
            raise SpecboundError(no_variation_message(table))
        raise SpecboundError(
            f"{', '.join(x for x, _ in against)} take(s) one value over the store's records: nothing to fit against"
        )
    fits = pd.concat(
        [scaling_fits(data, x=x, by=by, confidence=confidence, per_group=per_group) for x, by in against],
        ignore_index=True,
    )
    # a log-log fit cannot use x <= 0 (a run's step 0): say which records it left out, never silently
    positive = {x: pd.to_numeric(data[x], errors="coerce") > 0 for x, _ in against if x in data.columns}
    fits.attrs["left_out"] = {x: sorted(set(data.loc[~ok, "source"])) for x, ok in positive.items() if not ok.all()}
    return fits


def left_out_note(fits) -> list[str]:
    """One line per fitted column whose non-positive values the fits left out (log of 0)."""
    return [
        f"left out of the fits in {x}: {len(sources)} record(s) with {x} <= 0, whose logarithm is undefined "
        f"({', '.join(str(s) for s in sources[:3])}{', ...' if len(sources) > 3 else ''})"
        for x, sources in fits.attrs.get("left_out", {}).items()
    ]


def _three_places(value: float) -> str:
    """``value`` to three decimals, never ``-0.000``."""
    text = f"{value:.3f}"
    return "0.000" if text == "-0.000" else text


def summary_table(fits):
    """One row per (bound, role): the pooled slopes ``in L`` and ``in N`` with their intervals, as text."""
    pooled = fits[fits["fixed"].str.startswith("all") | (fits["fixed"] == "-")]
    out = {}
    for _, r in pooled.iterrows():
        row = out.setdefault((r["bound"], r["role"]), {"bound": r["bound"], "role": r["role"]})
        ci = "" if not math.isfinite(r["ci_low"]) else f" [{_three_places(r['ci_low'])}, {_three_places(r['ci_high'])}]"
        held = "" if r["fixed"] == "-" else f" ({r['fixed'].replace('all ', 'fixed ')})"
        fixed = "" if r["fixed"] == "-" else f" at one fixed {r['fixed'].replace('all ', '')}"
        slope = (
            f"{_three_places(r['slope'])}{ci}"
            if math.isfinite(r["slope"])
            else f"no fit (no two positive values at two {r['against']}{fixed})"
        )
        row[f"slope in {r['against']}{held}"] = slope
        row[f"points ({r['against']})"] = int(r["points"])
    return pd.DataFrame(list(out.values()))
