"""The rotation-blind numbers of rotary models, kept comparable with the BERT-style proxies.

For a rotary family (LLaMA, Mistral, Qwen2, GPT-NeoX) the headline bounds read QK quantities that hold
at every relative position (docs/rotary.md).  These variants recompute the spectrum-adaptive bound and
the Edelman-style proxy with each head's ``W_Q^T W_K`` as if no rotation were applied, as earlier
versions (and the paper's BERT experiment) did: they understate what the model can compute (a head with
``W_Q^T W_K = 0`` may still attend by position) and are not bounds for rotary models.  For every other
family they are not computed.
"""

from __future__ import annotations

from .adaptive import SPECTRAL_ADAPTIVE, grid_union_cost, matrix_terms
from .base import Bound, BoundResult
from .edelman import EDELMAN, covering_log_factor
from ..compute.measures import ModelMeasures


def _rotary(measures: ModelMeasures) -> bool:
    return measures.rotation_blind is not None


def _rotation_blind(bound: Bound):
    def compute(measures: ModelMeasures) -> BoundResult:
        result = bound.compute(measures.rotation_blind or measures)
        return BoundResult(value=result.value, log_value=result.log_value)  # no per-matrix columns

    return compute


BOUNDS = (
    Bound(
        name="spectral_adaptive_rotation_blind",
        title="Spectrum-adaptive, QK as if unrotated (rotary models)",
        reference="Sakai & Imaizumi, arXiv:2605.07297, Theorem 3.1 on W_Q^T W_K, ignoring rotary positions "
        "(a proxy, not a bound, for rotary models; docs/rotary.md)",
        compute=_rotation_blind(SPECTRAL_ADAPTIVE),
        group="adaptive_variants",
        needs=SPECTRAL_ADAPTIVE.needs,
        covering_terms=lambda measures: matrix_terms(measures.rotation_blind or measures),
        union_cost=grid_union_cost,
        distance=False,
        applies=_rotary,
    ),
    Bound(
        name="edelman_rotation_blind",
        title="Edelman-style proxy, QK as if unrotated (rotary models)",
        reference="Edelman et al., ICML 2022 on W_Q^T W_K, ignoring rotary positions (docs/rotary.md)",
        compute=_rotation_blind(EDELMAN),
        group="baselines",
        needs=EDELMAN.needs,
        log_factor=covering_log_factor,
        distance=False,
        applies=_rotary,
    ),
)
