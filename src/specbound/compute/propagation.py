"""How a perturbation of one matrix propagates through the network (docs/spec.md section 3).

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
class LayerSpectralNorms:
    """Observed spectral norms of one layer's matrices.

    Attributes
    ----------
    qk, ov : ndarray, shape (H,)
        ``c(QK^{l,h})`` and ``c(OV^{l,h})`` per query head.
    ff : dict[str, float]
        ``c`` of each feed-forward matrix by role (``FF_in``/``FF_out`` or ``FF_gate``/``FF_up``/``FF_out``).
    block : str
        ``sequential`` (attention, then feed-forward) or ``parallel`` (both on the same input).
    """

    qk: np.ndarray
    ov: np.ndarray
    ff: dict[str, float]
    block: str = "sequential"


def activation_lipschitz(activation: str | None) -> tuple[float, str]:
    """``L_phi`` for a config's ``hidden_act`` and where the value came from."""
    if activation in ACTIVATION_LIPSCHITZ:
        return ACTIVATION_LIPSCHITZ[activation], f"hidden_act={activation}"
    return DEFAULT_L_PHI, f"default (hidden_act={activation!r} not in the table)"


def attention_lipschitz(norms: LayerSpectralNorms) -> float:
    """``sum_h c(OV_h) (1 + 4 c(QK_h))`` (multi-head attention on unit-norm rows)."""
    return float(np.sum(norms.ov * (1.0 + 4.0 * norms.qk)))


def split_role(role: str) -> tuple[str, str | None]:
    """``"FF_gate[e3]"`` -> ``("FF_gate", "e3")``, ``"FF_up[shared]"`` -> ``("FF_up", "shared")``,
    ``"FF_out"`` -> ``("FF_out", None)``: a matrix's kind and the expert it belongs to."""
    if role.endswith("]") and "[" in role:
        kind, _, branch = role[:-1].partition("[")
        return kind, branch
    return role, None


def feed_forward_branches(ff: dict) -> dict[str | None, dict]:
    """A layer's feed-forward values grouped by expert: ``{None: {"FF_in": .., "FF_out": ..}}`` for a
    dense block; ``{"e0": {...}, "e1": {...}, ..., "shared": {...}}`` for a mixture of experts."""
    branches: dict[str | None, dict] = {}
    for role, value in ff.items():
        kind, branch = split_role(role)
        branches.setdefault(branch, {})[kind] = value
    return branches


def _branch_lipschitz(ff: dict, l_phi: float, c_phi: float) -> float:
    if "FF_gate" in ff:
        return (l_phi + c_phi) * ff["FF_gate"] * ff["FF_up"] * ff["FF_out"]
    return l_phi * ff["FF_in"] * ff["FF_out"]


def feed_forward_lipschitz(ff: dict[str, float], l_phi: float, c_phi: float = 1.0) -> float:
    """Plain ``act(x W_in) W_out``: ``L_phi c_in c_out``.  Gated
    ``(phi(x W_g) * (x W_u)) W_d`` with ``|phi(t)| <= c_phi |t|``: ``(L_phi + c_phi) c_g c_u c_d``
    (split ``phi(a)b - phi(a')b' = (phi(a) - phi(a'))b + phi(a')(b - b')``; docs/theory.md).

    A mixture of experts (roles ``FF_gate[e3]``, ...): the largest routed expert's constant plus the
    shared expert's, since the top-k gates are non-negative and sum to at most 1 and the shared
    expert's sigmoid gate is at most 1, with the routing held fixed (docs/theory.md 3f)."""
    if not any(role.endswith("]") for role in ff):  # a dense block (the LLaMA path: no grouping)
        return _branch_lipschitz(ff, l_phi, c_phi)
    branches = feed_forward_branches(ff)
    routed = [_branch_lipschitz(b, l_phi, c_phi) for key, b in branches.items() if key != "shared"]
    shared = _branch_lipschitz(branches["shared"], l_phi, c_phi) if "shared" in branches else 0.0
    return max(routed) + shared


def layer_lipschitz(norms: LayerSpectralNorms, l_phi: float) -> float:
    """``Lambda_k``: attention then feed-forward multiply (docs/spec.md section 3); parallel blocks add."""
    attention, ff = attention_lipschitz(norms), feed_forward_lipschitz(norms.ff, l_phi)
    return attention + ff if norms.block == "parallel" else attention * ff


def downstream_factors(lambdas: np.ndarray) -> np.ndarray:
    """``alpha_l = prod_{k=l+1}^{L-1} Lambda_k`` (``alpha_{L-1} = 1``), shape (L,); ``inf`` where the
    product exceeds float64 (every bound reads :func:`log_downstream_factors` instead)."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    alphas = np.ones_like(lambdas)
    with np.errstate(over="ignore"):
        for l in range(lambdas.size - 2, -1, -1):
            alphas[l] = alphas[l + 1] * lambdas[l + 1]
    return alphas


def log_downstream_factors(lambdas: np.ndarray) -> np.ndarray:
    """``ln alpha_l = sum_{k>l} ln Lambda_k``, shape (L,): exact whatever the depth (``-inf`` after a
    zero factor).  Where ``alpha_l`` itself is a normal float, its ``ln`` is taken directly, so the
    numbers of models that do not overflow are those of the product form to the last bit."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logs = np.log(lambdas)
    tail = np.concatenate([np.cumsum(logs[:0:-1])[::-1], [0.0]]) if lambdas.size else np.zeros(0)
    direct = downstream_factors(lambdas)
    normal = (direct >= np.finfo(np.float64).tiny) & np.isfinite(direct)
    with np.errstate(divide="ignore"):
        return np.where(normal, np.log(np.where(normal, direct, 1.0)), tail)


def sensitivities(norms: LayerSpectralNorms) -> dict[str, np.ndarray | float]:
    """``gamma*`` per role: arrays over heads for ``QK``/``OV``, floats for feed-forward.

    As in the reference code, activation constants are set to 1 here (they enter ``Lambda`` only):
    BERT's ``FF_in`` gets ``c(FF_out)``, not ``L_phi c(FF_out)``.  The feed-forward factor that an
    attention matrix's perturbation passes through is the feed-forward Lipschitz constant with
    ``L_phi = c_phi = 1`` in a sequential block, and 1 in a parallel block (the feed-forward does
    not see the attention's output).
    """
    ff = norms.ff
    after_attention = 1.0 if norms.block == "parallel" else feed_forward_lipschitz(ff, 1.0, 1.0)
    gamma: dict[str, np.ndarray | float] = {
        "QK": 2.0 * norms.ov * after_attention,
        "OV": np.full_like(norms.ov, after_attention),
    }
    if not any(role.endswith("]") for role in ff):
        gamma.update(_branch_sensitivities(ff))
        return gamma
    # a mixture of experts: each expert's matrices as in a dense block, its gate (<= 1) dropped
    for branch, values in feed_forward_branches(ff).items():
        gamma.update({f"{kind}[{branch}]": g for kind, g in _branch_sensitivities(values).items()})
    return gamma


def _branch_sensitivities(ff: dict) -> dict[str, float]:
    if "FF_gate" in ff:
        return {"FF_gate": ff["FF_up"] * ff["FF_out"], "FF_up": ff["FF_gate"] * ff["FF_out"], "FF_out": 1.0}
    return {"FF_in": ff["FF_out"], "FF_out": 1.0}


# The first round's name (it holds spectral norms, not LayerNorm parameters); kept working.
LayerNorms = LayerSpectralNorms
