"""How a perturbation of one matrix propagates through the network (SPEC section 3).

Under the paper's assumptions (unit-norm token rows, normalisation as projection onto the unit
ball, biases ignored), a BERT-style layer ``x -> FF(Attn(x))`` is Lipschitz with constant

    Lambda_k = L_phi * c(FF_in^k) * c(FF_out^k) * sum_h c(OV^{k,h}) * (1 + 4 c(QK^{k,h}))

where ``c`` is the observed spectral norm; the downstream factor of layer ``l`` is
``alpha_l = prod_{k>l} Lambda_k`` and a matrix's within-layer sensitivity is ``gamma*``.  As in the
reference code, ``L_phi`` enters ``Lambda`` but not ``gamma*``.  See docs/theory.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Lipschitz constants of the activations named in config.json's hidden_act.  GELU's is 1.1289...,
# the paper rounds it up to 1.13; SiLU's is 1.0998...; ReLU's is 1.
ACTIVATION_LIPSCHITZ = {
    "gelu": 1.13, "gelu_new": 1.13, "gelu_fast": 1.13, "gelu_pytorch_tanh": 1.13,
    "quick_gelu": 1.13, "relu": 1.0, "silu": 1.0998, "swish": 1.0998,
}
DEFAULT_L_PHI = 1.13


@dataclass(frozen=True)
class LayerNorms:
    """Observed spectral norms of one layer's matrices.

    Attributes
    ----------
    qk, ov : ndarray, shape (H,)
        ``c(QK^{l,h})`` and ``c(OV^{l,h})`` per query head.
    ff_in, ff_out : float
        ``c(FF_in^l)`` and ``c(FF_out^l)``.
    """

    qk: np.ndarray
    ov: np.ndarray
    ff_in: float
    ff_out: float


def activation_lipschitz(activation: str | None) -> tuple[float, str]:
    """``L_phi`` for a config's ``hidden_act`` and where the value came from."""
    if activation in ACTIVATION_LIPSCHITZ:
        return ACTIVATION_LIPSCHITZ[activation], f"hidden_act={activation}"
    return DEFAULT_L_PHI, f"default (hidden_act={activation!r} not in the table)"


def layer_lipschitz(norms: LayerNorms, l_phi: float) -> float:
    """``Lambda_k`` of one layer (SPEC section 3, multi-head form)."""
    attention = float(np.sum(norms.ov * (1.0 + 4.0 * norms.qk)))
    return l_phi * norms.ff_in * norms.ff_out * attention


def downstream_factors(lambdas: np.ndarray) -> np.ndarray:
    """``alpha_l = prod_{k=l+1}^{L-1} Lambda_k`` (``alpha_{L-1} = 1``), shape (L,)."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    alphas = np.ones_like(lambdas)
    for l in range(lambdas.size - 2, -1, -1):
        alphas[l] = alphas[l + 1] * lambdas[l + 1]
    return alphas


def sensitivities(norms: LayerNorms) -> dict[str, np.ndarray | float]:
    """``gamma*`` per role: arrays over heads for ``QK``/``OV``, floats for feed-forward."""
    ff = norms.ff_out * norms.ff_in
    return {
        "QK": 2.0 * norms.ov * ff,
        "OV": np.full_like(norms.ov, ff),
        "FF_in": norms.ff_out,
        "FF_out": 1.0,
    }
