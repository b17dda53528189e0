"""Bartlett-Foster-Telgarsky spectral complexity, adapted to the transformer chain (docs/spec.md section 7).

Bartlett, Foster & Telgarsky, "Spectrally-normalized margin bounds for neural networks",
NeurIPS 2017, Theorem 1.1: for a feed-forward network with matrices ``A_i``, activations
``rho_i``-Lipschitz and reference matrices ``M_i``,

    R_A = (prod_i rho_i ||A_i||_2) (sum_i (||A_i - M_i||_{2,1} / ||A_i||_2)^(2/3))^(3/2).

On the transformer chain the product of ``rho_i ||A_i||_2`` becomes the product of the layers'
Lipschitz factors ``Lambda_l`` (docs/spec.md section 3, ``L_phi`` included), and the sum runs over every
analysed matrix, each query-key and value-output head separately (as in the Edelman-style proxy):

    B_BFT = (prod_l Lambda_l) (sum_W (||W - W0||_{2,1} / ||W||_2)^(2/3))^(3/2),   W0 = 0 by default.

Assumptions: unit-norm token rows, normalisation as projection onto the unit ball, biases ignored.
This is an adaptation, not a theorem for transformers: per-head sensitivities are those of the
chain's product, not ``gamma* alpha`` (see docs/bounds.md).  Invariant under a rescaling of a
layer's feed-forward pair ``(t FF_in, FF_out / t)``, and of ``FF_in^l`` against ``FF_in^{l+1}``.
Margin-bound form: leading term times ``ln(2W) ln n`` (``W`` the widest matrix dimension).
"""

from __future__ import annotations

import numpy as np

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .chain import log_lipschitz, relative_norms
from .schatten import safe_exp
from .edelman import covering_log_factor


def _compute(measures: ModelMeasures) -> BoundResult:
    terms = relative_norms(measures, lambda s: s.norm_2_1) ** (2 / 3)
    correction = float(np.sum(terms)) ** 1.5
    if not correction > 0:
        return BoundResult(value=0.0, per_layer={"bft_terms": measures.per_layer_sum(terms)})
    log_value = log_lipschitz(measures) + float(np.log(correction))
    return BoundResult(
        value=safe_exp(log_value), log_value=log_value, per_layer={"bft_terms": measures.per_layer_sum(terms)}
    )


BOUNDS = (
    Bound(
        name="bft",
        title="Bartlett-Foster-Telgarsky spectral complexity",
        reference="Bartlett, Foster & Telgarsky, NeurIPS 2017, Theorem 1.1 (R_A on the transformer chain)",
        compute=_compute,
        group="baselines",
        needs=("spectral_norm", "norm_2_1", "Lambda"),
        log_factor=covering_log_factor,
    ),
)
