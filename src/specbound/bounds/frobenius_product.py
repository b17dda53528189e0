"""Product of Frobenius norms along the transformer chain (a capacity measure, not a bound here).

For feed-forward networks the product of the layers' Frobenius norms bounds the Rademacher
complexity (Neyshabur, Tomioka & Srebro, COLT 2015; Golowich, Rakhlin & Shamir, COLT 2018, for
positive-homogeneous 1-Lipschitz activations).  On the transformer chain the layer's product is
``Lambda_l`` with the Frobenius norm in place of the spectral norm (:mod:`.chain`):

    B_F = prod_l L_phi ||FF_in||_F ||FF_out||_F sum_h ||OV_h||_F (1 + 4 ||QK_h||_F)

(a QK-norm head's ``||QK_h||_F`` is ``kappa_F``, the Frobenius-side analogue of its Lipschitz factor
``kappa_h``: each row's ``lipschitz_factor_frobenius``, as ``Lambda`` reads ``lipschitz_factor``).

Softmax attention and GELU are neither homogeneous nor covered by those theorems, so no
margin-bound form is attached: it is reported as a measure (Jiang et al., ICLR 2020, "prod-of-fro").
It bounds the spectral product from above: every factor is at least its spectral counterpart
(``||W||_2 <= ||W||_F``; a QK-norm head reads ``kappa_F >= kappa``, docs/theory.md 3d) and ``Lambda``
is non-decreasing in each.  Not measured from initial
weights (a product of distances is no capacity measure).
"""

from __future__ import annotations

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .chain import log_chain_factor
from .schatten import safe_exp


def _compute(measures: ModelMeasures) -> BoundResult:
    log_value, factors = log_chain_factor(measures, lambda s: s.lipschitz_factor_frobenius)
    return BoundResult(value=safe_exp(log_value), log_value=log_value, per_layer={"lambda_frobenius": factors})


BOUNDS = (
    Bound(
        name="frobenius_product",
        title="Frobenius-norm product over the chain",
        reference="Neyshabur, Tomioka & Srebro, COLT 2015; Golowich et al., COLT 2018 (measure only)",
        compute=_compute,
        group="baselines",
        needs=("lipschitz_factor_frobenius",),
        distance=False,
    ),
)
