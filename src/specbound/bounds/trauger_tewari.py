"""A (1,1)-norm proxy in the spirit of Trauger & Tewari (AISTATS 2024).

Trauger & Tewari, "Sequence Length Independent Norm-Based Generalization Bounds for
Transformers", AISTATS 2024 (arXiv:2310.13088), bound the covering numbers of the linear maps in a
transformer with entrywise (1,1)-norm constraints (a Zhang 2002-style covering, dimension only in a
log, independent of sequence length).  We use that norm in the chain structure of the Edelman-style
proxy (docs/spec.md section 5), with the same weights and downstream factors:

    xi11_l = sum_h [(c_out c_in c(OV_h) ||QK_h||_{1,1})^(2/3) + (c_out c_in ||OV_h||_{1,1})^(2/3)]
             + (c_out ||FF_in||_{1,1})^(2/3) + ||FF_out||_{1,1}^(2/3)
    B_11 = (1 + sum_l alpha_l^(2/3) xi11_l)^(3/2)

This is a proxy, not Trauger & Tewari's theorem: their architecture (single layer per bound term,
their own norm placement) differs, and we keep the (2,1)-proxy's structure so that the two differ
only in the norm.  Since ``||W||_{2,1} <= ||W||_{1,1}`` entry for entry, ``B_11 >= B_edelman``.
Margin-bound form: leading term times ``ln(2W) ln n``, as the (2,1) proxy.
"""

from __future__ import annotations

import numpy as np

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .edelman import chain_result, covering_log_factor, xi_per_layer


def _compute(measures: ModelMeasures) -> BoundResult:
    xi = xi_per_layer(measures, np.array([mm.target.norm_1_1 for mm in measures.matrices]))
    return chain_result(measures, xi, {"xi_1_1": xi})


BOUNDS = (
    Bound(
        name="l11_proxy",
        title="(1,1)-norm proxy (Trauger & Tewari style)",
        reference="after Trauger & Tewari, AISTATS 2024 ((1,1)-norm covering), in the chain of docs/spec.md section 5",
        compute=_compute,
        group="baselines",
        needs=("lipschitz_factor", "norm_1_1", "alpha"),
        log_factor=covering_log_factor,
    ),
)
