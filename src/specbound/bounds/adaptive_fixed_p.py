"""The adaptivity gain: the spectrum-adaptive bound with one Schatten index fixed for every matrix.

    B_p = sum_matrices C(p) + sqrt(L),   p in {0, 1, 2}

(``C`` as in :mod:`~specbound.bounds.adaptive`).  Each fixed p lies on the post-hoc grid ``P_m``,
so ``B_spectral <= B_p`` for every one of them; the ratio ``B_p / B_spectral`` is what choosing p
per matrix after training buys.  A fixed p is chosen before seeing the data: its margin-bound form
pays no union bound over the grid.  ``B_0 = sum sqrt(r N) + sqrt(L)`` counts ranks only;
``B_2`` is the Frobenius-norm end of the family.
"""

from __future__ import annotations

import math

import numpy as np

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .adaptive import matrix_terms
from .schatten import ContributionCurve, log_sum, safe_exp

FIXED_P = (0, 1, 2)


def fixed_p_log_contributions(measures: ModelMeasures, p: float) -> np.ndarray:
    """``ln C(p)`` of every matrix, shape (#matrices,)."""
    n = measures.dims.N
    return np.array(
        [
            ContributionCurve(mm.target, log_scale=mm.log_scale, n=n, rank_tol=measures.rank_tol).log_at(float(p))
            for mm in measures.matrices
        ]
    )


def fixed_p_contributions(measures: ModelMeasures, p: float) -> np.ndarray:
    """``C(p)`` of every matrix, shape (#matrices,); ``inf`` where one exceeds float64."""
    return np.array([safe_exp(x) for x in fixed_p_log_contributions(measures, p)])


def _compute_for(p: int):
    def compute(measures: ModelMeasures) -> BoundResult:
        logs = fixed_p_log_contributions(measures, p)
        c = np.array([safe_exp(x) for x in logs])
        with np.errstate(over="ignore"):
            value = float(np.sum(c) + math.sqrt(measures.dims.L))
        log_value = None if value < math.inf else log_sum(np.append(logs, 0.5 * math.log(measures.dims.L)))
        return BoundResult(value=value, log_value=log_value, per_layer={f"adaptive_p{p}": measures.per_layer_sum(c)})

    return compute


BOUNDS = tuple(
    Bound(
        name=f"spectral_fixed_p{_p}",
        title=f"Spectrum-adaptive with p = {_p} for every matrix",
        reference="Sakai & Imaizumi, arXiv:2605.07297, Theorem 3.1 with a single a-priori Schatten index",
        compute=_compute_for(_p),
        group="adaptive_variants",
        needs=("singular_values", "rank", "Lambda", "alpha", "gamma*"),
        covering_terms=lambda measures, _p=_p: matrix_terms(measures, np.array([float(_p)])),
    )
    for _p in FIXED_P
)
