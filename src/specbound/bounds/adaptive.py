"""The spectrum-adaptive proxy: Sakai & Imaizumi (arXiv:2605.07297), Theorem 3.1, leading term
(docs/spec.md section 4).

For a matrix with Schatten powers ``S_p`` and ``scale = gamma* alpha L``,

    C(p) = S_p^(1/(p+2)) * scale^(p/(p+2)) * N^((p+1)/(p+2)),   p in P_m = {0, 1/m, ..., 2},

each matrix takes its own minimiser (ties to the smallest p) and
``B_spectral = sum_matrices min_p C(p) + sqrt(L)``.

Margin-bound form (docs/spec.md section 7, :mod:`specbound.bounds.gap`): the margin inside each term and
each term's entropy integral (:mod:`.covering`, :func:`matrix_terms`), and the post-hoc choice of one of
``2m + 1`` indices for each matrix costs ``#matrices * ln(2m + 1)`` in the confidence term.  Measured from initial
weights, ``S_p`` is that
of ``W - W0`` while ``scale`` keeps the trained network's propagation factors (docs/bounds.md).
"""

from __future__ import annotations

import math

import numpy as np

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .covering import CoveringTerm, matrix_term
from .schatten import ContributionCurve, continuous_minima, schatten_grid


def optimise_matrices(measures: ModelMeasures) -> dict[str, np.ndarray]:
    """Per-matrix grid minimiser, its value, C(0), C(2) and the continuous diagnostic."""
    grid = schatten_grid(measures.grid_m)
    cols = {
        k: []
        for k in ("p_star", "contribution", "c_p0", "c_p1", "c_p2", "p_continuous", "contribution_continuous", "scale")
    }
    curves = [
        ContributionCurve(mm.target, log_scale=mm.log_scale, n=measures.dims.N, rank_tol=measures.rank_tol)
        for mm in measures.matrices
    ]
    p_conts, c_conts = continuous_minima(curves)
    for mm, curve, p_cont, c_cont in zip(measures.matrices, curves, p_conts, c_conts):
        values = curve.on_grid(grid)
        best = int(np.argmin(values))  # first minimum: ties go to the smallest p
        for key, val in (
            ("p_star", grid[best]),
            ("contribution", values[best]),
            ("c_p0", values[0]),
            ("c_p1", values[measures.grid_m]),
            ("c_p2", values[-1]),
            ("p_continuous", p_cont),
            ("contribution_continuous", c_cont),
            ("scale", mm.scale),
        ):
            cols[key].append(val)
    return {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}


def _compute(measures: ModelMeasures) -> BoundResult:
    per_matrix = optimise_matrices(measures)
    value = float(np.sum(per_matrix["contribution"]) + math.sqrt(measures.dims.L))
    return BoundResult(
        value=value, per_matrix=per_matrix, per_layer={"adaptive": measures.per_layer_sum(per_matrix["contribution"])}
    )


def matrix_terms(measures: ModelMeasures, grid: np.ndarray | None = None) -> list[CoveringTerm]:
    """One covering term per matrix, each on ``grid`` (default the post-hoc grid ``P_m``): the terms
    of the gap form (:mod:`.covering`; docs/bounds.md section 9)."""
    grid = schatten_grid(measures.grid_m) if grid is None else grid
    return [
        matrix_term(
            mm.target,
            log_scale=mm.log_scale,
            n=measures.dims.N,
            rank_tol=measures.rank_tol,
            grid=grid,
            budget_parts=measures.dims.L,
        )
        for mm in measures.matrices
    ]


def index_choices_cost(measures: ModelMeasures, choices: int) -> float:
    """``choices * ln(2m + 1)``: the union over ``choices`` Schatten indices, each one of the
    ``2m + 1`` grid values picked after training."""
    return choices * math.log(2 * measures.grid_m + 1)


def grid_union_cost(measures: ModelMeasures, n: int) -> float:
    """``#matrices * ln(2m + 1)``: one of ``2m + 1`` Schatten indices chosen per matrix after training."""
    return index_choices_cost(measures, len(measures.matrices))


SPECTRAL_ADAPTIVE = Bound(
    name="spectral_adaptive",
    title="Spectrum-adaptive (Sakai & Imaizumi 2026)",
    reference="Sakai & Imaizumi, arXiv:2605.07297, Theorem 3.1 (leading term, post-hoc grid P_m)",
    compute=_compute,
    needs=("singular_values", "rank", "Lambda", "alpha", "gamma*"),
    covering_terms=matrix_terms,
    union_cost=grid_union_cost,
)

BOUNDS = (SPECTRAL_ADAPTIVE,)
