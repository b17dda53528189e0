"""The spectrum-adaptive proxy with weights shared across depth counted once (ALBERT).

The headline bound counts an ALBERT as ``L`` layers whose weights happen to coincide: valid, since
tied-weight networks are a subset of free-weight ones, but every application of a stored matrix
pays its own term.  Counting each stored matrix once instead (docs/theory.md, section 3b): a
perturbation ``Delta`` of a matrix shared by the depths ``l in A(g)`` moves the output by at most
``sum_{l in A(g)} alpha_l gamma*_l ||Delta||``, and with the error budget split over the ``G``
stored groups (``L`` groups when nothing is shared, which is where SPEC's ``scale = gamma* alpha_l L``
comes from) its scale is

    scale_g = G * sum_{l in A(g)} gamma*_l alpha_l,
    B_shared = sum_{stored matrices} min_{p in P_m} C(p; scale_g) + sqrt(L).

Without sharing this *is* the headline bound (each group one depth: ``scale_g = L gamma* alpha_l``).
With sharing it never exceeds it: ``scale_g <= (L/G) G max_{l in A(g)} gamma* alpha_l``, which is at
most the largest of the group's headline scales, and ``min_p C`` grows with the scale, so one term
replaces ``|A(g)|`` terms each at least as large.  This variant rests on our derivation of how
the theorem splits its error budget, not on a statement of the paper; read it as such.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..compute.measures import LOG_TINY, ModelMeasures
from .base import Bound, BoundResult
from .adaptive import index_choices_cost
from .covering import CoveringTerm, matrix_term
from .schatten import grid_minimum, log_sum, schatten_grid

TINY = np.finfo(np.float64).tiny


def shared_groups(measures: ModelMeasures) -> dict[tuple, list[int]]:
    """Stored matrix ``(stored layer, role, head)`` -> indices of its applications in ``matrices``."""
    dims = measures.dims
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, mm in enumerate(measures.matrices):
        groups[(dims.stored_layer(mm.layer), mm.role, mm.head)].append(i)
    return dict(groups)


def covering_terms(measures: ModelMeasures) -> list[CoveringTerm]:
    """One term per stored matrix, at its summed scale ``scale_g`` (docs/bounds.md 9)."""
    grid = schatten_grid(measures.grid_m)
    groups = shared_groups(measures)
    stored = len({key[0] for key in groups})
    out = []
    for members in groups.values():
        first = measures.matrices[members[0]]
        # scale = stored * sum_i gamma*_i alpha_i, from the products where they are normal floats
        with np.errstate(over="ignore"):
            scale = stored * sum(measures.matrices[i].gamma * measures.matrices[i].alpha for i in members)
        if TINY <= scale < math.inf:
            log_scale = math.log(scale)
        else:
            with np.errstate(divide="ignore"):
                logs = [
                    math.log(measures.matrices[i].gamma) + measures.matrices[i].log_alpha
                    if measures.matrices[i].gamma > 0
                    else -math.inf
                    for i in members
                ]
            log_scale = max(math.log(stored) + log_sum(logs), LOG_TINY)
        out.append(
            matrix_term(
                first.target,
                log_scale=log_scale,
                n=measures.dims.N,
                rank_tol=measures.rank_tol,
                grid=grid,
                budget_parts=stored,
            )
        )
    return out


def _compute(measures: ModelMeasures) -> BoundResult:
    total = sum(grid_minimum(term.curve, term.grid)[1] for term in covering_terms(measures))
    return BoundResult(value=float(total + math.sqrt(measures.dims.L)))


def _union_cost(measures: ModelMeasures, n: int) -> float:
    return index_choices_cost(measures, len(shared_groups(measures)))


BOUNDS = (
    Bound(
        name="spectral_shared",
        title="Spectrum-adaptive, shared weights counted once",
        reference="Sakai & Imaizumi, arXiv:2605.07297, Theorem 3.1, each stored matrix covered once with its "
        "summed sensitivity (our derivation; docs/theory.md 3b)",
        compute=_compute,
        group="adaptive_variants",
        needs=("singular_values", "rank", "Lambda", "alpha", "gamma*"),
        covering_terms=covering_terms,
        union_cost=_union_cost,
    ),
)
