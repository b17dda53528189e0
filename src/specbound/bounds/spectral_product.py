"""Product of spectral norms along the transformer chain: ``prod_l Lambda_l`` (docs/spec.md section 3).

The chain's Lipschitz bound: the factor every spectrally-normalised bound (Bartlett et al. 2017,
Neyshabur et al. 2018) multiplies by its correction term.  Reported as a measure (Jiang et al.,
ICLR 2020, "prod-of-spec"), without a margin-bound form of its own and without a from-init version.
"""

from __future__ import annotations

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .chain import log_lipschitz
from .schatten import safe_exp


def _compute(measures: ModelMeasures) -> BoundResult:
    log_value = log_lipschitz(measures)
    return BoundResult(value=safe_exp(log_value), log_value=log_value)


BOUNDS = (
    Bound(
        name="spectral_product",
        title="Spectral-norm product over the chain",
        reference="prod_l Lambda_l (docs/spec.md section 3); Jiang et al., ICLR 2020 (measure only)",
        compute=_compute,
        group="baselines",
        needs=("Lambda",),
        distance=False,
    ),
)
