"""The theory's matrix types: QK, OV and *one* feed-forward matrix per layer.

The paper's theorem has three matrix types per layer; BERT's feed-forward block
``x -> phi(x FF_in) FF_out`` has two matrices, which the paper's experiment (and
:mod:`~specbound.bounds.adaptive`) count as two types.  Here both enter as a single parameter
matrix, the block-diagonal

    F_l = diag(FF_in^l, FF_out^l),      acting on the stacked input (x, z),

whose singular values are the union of both spectra, so ``S_p(F) = S_p(FF_in) + S_p(FF_out)`` and
``rank F = rank FF_in + rank FF_out``.  Sensitivity (same assumptions and convention as SPEC
section 3: each matrix's input in the unit ball, ``L_phi`` not in ``gamma*``): a perturbation
``(U_in, U_out)`` moves the block's output by at most

    c_out |x U_in| + |z U_out| <= max(c_out, 1) sqrt(2) |(x U_in, z U_out)|
                               =  max(c_out, 1) sqrt(2) |(x, z) diag(U_in, U_out)|,

and ``(x, z)`` has norm up to ``sqrt(2)``: rescaled into the unit ball this is
``gamma*_F = 2 max(c_out, 1)`` (= ``2 max(gamma*_in, gamma*_out)``).  A gated block has ``k = 3``
feed-forward matrices (gate, up, down) and the same argument gives ``gamma*_F = k max_i gamma*_i``
(``sqrt(k)`` from the sum, ``sqrt(k)`` from the stacked input).  One Schatten index per block:

    C_F(p) = (S_p(FF_in) + S_p(FF_out))^(1/(p+2)) (gamma*_F alpha_l L)^(p/(p+2)) N^((p+1)/(p+2))
    B_3 = sum_{QK, OV} min_p C(p) + sum_l min_p C_F(p) + sqrt(L)

Because ``min_p C_F(p) <= C_F(0) = sqrt((r_in + r_out) N) <= sqrt(r_in N) + sqrt(r_out N)``, ``B_3``
never exceeds the fixed ``p = 0`` bound; against the four-type bound it trades a factor 2 in the
sensitivity for a shared index and a subadditive root.  Union cost: ``L (2H + 1) ln(2m + 1)``.
"""

from __future__ import annotations

import math

import numpy as np

from ..compute.measures import LOG_TINY, ModelMeasures
from .base import Bound, BoundResult
from .adaptive import index_choices_cost
from .covering import CoveringTerm, matrix_term, rank_class_dimension
from .schatten import ContributionCurve, grid_minimum, kept_singular_values, schatten_grid

TINY = np.finfo(np.float64).tiny


def _is_ff(role: str) -> bool:
    return role.startswith("FF_")


def feed_forward_blocks(measures: ModelMeasures) -> list[CoveringTerm]:
    """Each layer's feed-forward block (``diag(FF_in, FF_out)``, or the gated block's three matrices)
    as one covering term on the grid ``P_m``: the union of the matrices' kept values, ``scale_F``, and
    the sum of the matrices' rank-class dimensions (a block-diagonal matrix is covered block by block)."""
    grid = schatten_grid(measures.grid_m)
    out = []
    for layer in range(measures.dims.L):
        ff = [mm for mm in measures.matrices if mm.layer == layer and _is_ff(mm.role)]
        kept = [kept_singular_values(mm.target, measures.rank_tol) for mm in ff]
        # scale_F = k max_i scale_i (docs/bounds.md), from the product where it is a normal float
        top = max(ff, key=lambda mm: mm.log_scale)
        scale = len(ff) * top.scale
        log_scale = math.log(scale) if TINY <= scale < math.inf else max(math.log(len(ff)) + top.log_scale, LOG_TINY)
        curve = ContributionCurve.from_kept(np.concatenate(kept), log_scale=log_scale, n=measures.dims.N)
        dimension = sum(rank_class_dimension(*mm.target.shape, k.size) for mm, k in zip(ff, kept))
        shape = (sum(mm.target.shape[0] for mm in ff), sum(mm.target.shape[1] for mm in ff))
        dense = sum(mm.target.shape[0] * mm.target.shape[1] for mm in ff)
        out.append(CoveringTerm(curve, grid, dimension, shape, dense, measures.dims.L))
    return out


def feed_forward_block_terms(measures: ModelMeasures) -> tuple[np.ndarray, np.ndarray]:
    """``(p*_F, min_p C_F(p))`` of each layer's feed-forward block, each shape (L,)."""
    minima = [grid_minimum(term.curve, term.grid) for term in feed_forward_blocks(measures)]
    return np.array([m[0] for m in minima]), np.array([m[1] for m in minima])


def covering_terms(measures: ModelMeasures) -> list[CoveringTerm]:
    """The QK and OV matrices' terms and one term per feed-forward block (docs/bounds.md 9)."""
    attention = [mm for mm in measures.matrices if not _is_ff(mm.role)]
    grid = schatten_grid(measures.grid_m)
    return [
        matrix_term(
            mm.target,
            log_scale=mm.log_scale,
            n=measures.dims.N,
            rank_tol=measures.rank_tol,
            grid=grid,
            budget_parts=measures.dims.L,
        )
        for mm in attention
    ] + feed_forward_blocks(measures)


def _compute(measures: ModelMeasures) -> BoundResult:
    grid = schatten_grid(measures.grid_m)
    attention = np.array(
        [
            grid_minimum(
                ContributionCurve(mm.target, log_scale=mm.log_scale, n=measures.dims.N, rank_tol=measures.rank_tol),
                grid,
            )[1]
            if not _is_ff(mm.role)
            else 0.0
            for mm in measures.matrices
        ]
    )
    ff_p, ff_value = feed_forward_block_terms(measures)
    per_layer = measures.per_layer_sum(attention) + ff_value
    value = float(np.sum(per_layer) + math.sqrt(measures.dims.L))
    return BoundResult(
        value=value,
        per_layer={"adaptive_three_type": per_layer, "three_type_ff": ff_value, "three_type_ff_p_star": ff_p},
    )


def _union_cost(measures: ModelMeasures, n: int) -> float:
    attention = sum(not _is_ff(mm.role) for mm in measures.matrices)
    return index_choices_cost(measures, attention + measures.dims.L)


BOUNDS = (
    Bound(
        name="spectral_three_type",
        title="Spectrum-adaptive, theory's 3 types (FF block)",
        reference="Sakai & Imaizumi, arXiv:2605.07297, Theorem 3.1 with one FF matrix per layer "
        "(FF_in, FF_out as diag block; docs/bounds.md)",
        compute=_compute,
        group="adaptive_variants",
        needs=("singular_values", "rank", "Lambda", "alpha", "gamma*"),
        covering_terms=covering_terms,
        union_cost=_union_cost,
    ),
)
