"""Neyshabur-Bhojanapalli-Srebro PAC-Bayes spectral bound, adapted to the transformer chain.

Neyshabur, Bhojanapalli & Srebro, "A PAC-Bayesian Approach to Spectrally-Normalized Margin Bounds
for Neural Networks", ICLR 2018, Theorem 1: for a depth-``d`` network of width ``h`` and inputs of
norm at most ``B``, the gap is

    O( sqrt( (B^2 d^2 h ln(dh) prod_i ||W_i||_2^2 sum_i ||W_i||_F^2 / ||W_i||_2^2 + ln(d n / delta))
             / (margin^2 n) ) ).

The ``d^2`` counts the terms of the perturbation sum ``sum_i ||U_i||_2 / ||W_i||_2`` (one per
perturbed matrix) and ``h ln(dh)`` comes from the spectral norm of a Gaussian ``h x h`` perturbation
with a union bound over the ``d`` matrices.  On the transformer chain (docs/bounds.md):

* the product of spectral norms becomes ``prod_l Lambda_l`` (docs/spec.md section 3);
* the perturbed matrices are every analysed matrix, heads separately: ``D = #matrices``;
* ``h = max(N, d_ff)``, the widest matrix; ``B = 1`` (unit-norm token rows);
* a rotary head's stable rank is its bound over every relative offset (:func:`stable_ranks`).

We report the quantity that takes the place of ``B`` in ``B / (margin sqrt(n))``:

    B_NBS = D sqrt(h ln(D h)) (prod_l Lambda_l) sqrt(sum_W ||W - W0||_F^2 / ||W||_2^2)

(its square is the SPEC's ``prod ||W||_2^2 sum ||W||_F^2 / ||W||_2^2`` times ``D^2 h ln(D h)``).  Its
margin-bound form has log factor 1 (``ln(Dh)`` is inside) and union cost ``ln(D n)``, the source's
grid over the spectral-norm scale.
"""

from __future__ import annotations

import math

import numpy as np

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .chain import log_lipschitz, relative_norms
from .schatten import safe_exp
from .edelman import widest


def depth_width_factor(measures: ModelMeasures) -> float:
    """``D sqrt(h ln(D h))`` with ``D = #matrices``, ``h = max(N, d_ff)``."""
    d, h = len(measures.matrices), widest(measures)
    return d * math.sqrt(h * math.log(d * h))


def stable_ranks(measures: ModelMeasures) -> np.ndarray:
    """``||W - W0||_F^2 / ||W||_2^2`` per matrix, shape (#matrices,): the spectrum's own stable rank
    when measured from 0, which for a rotary head is its bound over every offset (``stable_rank_sup``).

    A rotary head's term is then valid at every offset: the NBS sum at offset ``delta`` is
    ``(prod_l Lambda_l(delta))^2 sum_W sr_W(delta)``; ``Lambda_l`` grows with every ``c(QK)``, so
    ``Lambda_l(delta) <= Lambda_l`` (which reads the maxima), and ``sr_W(delta) <= stable_rank_sup``.
    Dividing a bound on ``||X||_F`` by the maximum of ``||X||_2`` would not be (docs/bounds.md 6)."""
    from_init = relative_norms(measures, lambda s: s.frobenius_norm) ** 2
    return np.array(
        [mm.spectrum.stable_rank if mm.delta is None else r for mm, r in zip(measures.matrices, from_init)],
        dtype=np.float64,
    )


def _compute(measures: ModelMeasures) -> BoundResult:
    stable = stable_ranks(measures)
    total = float(np.sum(stable))
    if total == 0:
        return BoundResult(value=0.0, per_layer={"nbs_stable_ranks": measures.per_layer_sum(stable)})
    log_value = math.log(depth_width_factor(measures)) + log_lipschitz(measures) + 0.5 * math.log(total)
    return BoundResult(
        value=safe_exp(log_value), log_value=log_value, per_layer={"nbs_stable_ranks": measures.per_layer_sum(stable)}
    )


def _union_cost(measures: ModelMeasures, n: int) -> float:
    return math.log(len(measures.matrices) * n)


BOUNDS = (
    Bound(
        name="nbs",
        title="Neyshabur-Bhojanapalli-Srebro PAC-Bayes",
        reference="Neyshabur, Bhojanapalli & Srebro, ICLR 2018, Theorem 1 (on the transformer chain)",
        compute=_compute,
        group="baselines",
        needs=("spectral_norm", "frobenius_norm", "Lambda"),
        log_factor=lambda measures, n: 1.0,
        union_cost=_union_cost,
    ),
)
