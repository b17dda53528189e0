"""How a perturbation of one matrix propagates through the network (docs/spec.md section 3).

Under the paper's assumptions (unit-norm token rows, normalisation as projection onto the unit
ball, biases ignored), a BERT-style layer ``x -> FF(Attn(x))`` is Lipschitz with constant

    Lambda_k = L_phi * c(FF_in^k) * c(FF_out^k) * sum_h c(OV^{k,h}) * (1 + 4 c(QK^{k,h}))

where ``c`` is the observed spectral norm; the downstream factor of layer ``l`` is
``alpha_l = prod_{k>l} Lambda_k`` and a matrix's within-layer sensitivity is ``gamma*``.  As in the
reference code, ``L_phi`` enters ``Lambda`` but not ``gamma*``.  See docs/theory.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SpecboundError

# Constants of the activations named in config.json's hidden_act (HF's ACT2FN names):
# ``(L_phi, c_phi)`` with ``L_phi >= sup_t |phi'(t)|`` (the Lipschitz constant, in Lambda) and
# ``c_phi >= sup_t |phi(t) / t|`` (the gated block's bound, docs/theory.md 3b; None where no finite
# one exists).  The suprema, each rounded up (tests/compute/test_activations.py checks them on a
# fine grid against HF's own implementations):
# * GELU, erf form (gelu, gelu_python, gelu_10 clipped) 1.128904; tanh form (gelu_new, gelu_fast,
#   gelu_pytorch_tanh, gelu_accurate, gelu_python_tanh) 1.128993: the paper's 1.13;
# * SiLU/swish x sigmoid(x) 1.099839, and quick_gelu x sigmoid(1.702 x) = silu(1.702 x) / 1.702 has
#   the same derivative's supremum: 1.0999;
# * mish 1.088498: 1.0885; hardswish 1.5 (slope 1/6 (2x + 3) at x -> 3); sigmoid 1/4;
# * relu, relu6, leaky_relu (slope 0.01 below 0), tanh and the identity (linear): 1.
# Every one but sigmoid has |phi(t)| <= |t|, so c_phi = 1.  relu2 = relu(x)^2 has no global constant
# (phi' = 2x): it is refused unless --l-phi gives one.
ACTIVATIONS = {
    "gelu": (1.13, 1.0),
    "gelu_python": (1.13, 1.0),
    "gelu_10": (1.13, 1.0),
    "gelu_new": (1.13, 1.0),
    "gelu_fast": (1.13, 1.0),
    "gelu_pytorch_tanh": (1.13, 1.0),
    "gelu_accurate": (1.13, 1.0),
    "gelu_python_tanh": (1.13, 1.0),
    "silu": (1.0999, 1.0),
    "swish": (1.0999, 1.0),
    "quick_gelu": (1.0999, 1.0),
    "mish": (1.0885, 1.0),
    "hardswish": (1.5, 1.0),
    "sigmoid": (0.25, None),
    "relu": (1.0, 1.0),
    "relu6": (1.0, 1.0),
    "leaky_relu": (1.0, 1.0),
    "tanh": (1.0, 1.0),
    "linear": (1.0, 1.0),
}
ACTIVATION_LIPSCHITZ = {name: constants[0] for name, constants in ACTIVATIONS.items()}
# A config.json without an activation key: GELU's constant (the paper's), said in the assumptions.
DEFAULT_L_PHI = 1.13
_TINY = np.finfo(np.float64).tiny


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
    position_terms : int
        Disentangled position terms (DeBERTa's ``c2p``, ``p2c``: 0, 1 or 2) that reuse each head's
        QK matrix against normalised relative position embeddings (docs/theory.md 3h).
    cross_qk, cross_ov : ndarray, shape (H,), optional
        ``c`` of a decoder layer's cross-attention heads (queries from the decoder's stream, keys and
        values from the encoder's output; docs/theory.md 3i); None for a layer without one.
    qk_sensitivity : ndarray, shape (H, H), optional
        QK-norm layers: ``S[i, h]`` bounds the change of head ``i``'s logits per unit spectral change of
        head ``h``'s QK row (its stacked factors, docs/theory.md 3d); None: a plain head's logit ``x QK y^T``
        moves by at most ``||Delta QK||_2`` and no other head's does (``S = I``).
    """

    qk: np.ndarray
    ov: np.ndarray
    ff: dict[str, float]
    block: str = "sequential"
    position_terms: int = 0
    cross_qk: np.ndarray | None = None  # a decoder layer's cross-attention heads, shape (H,)
    cross_ov: np.ndarray | None = None
    qk_sensitivity: np.ndarray | None = None  # QK-norm: (H, H), logit change of head i per unit change of row h
    # multi-head latent attention (docs/theory.md 3l), shape (H,): the value path's largest output (None: ov)
    # and its move per unit spectral change of the OV row (None: 1)
    ov_reach: np.ndarray | None = None
    ov_sensitivity: np.ndarray | None = None
    gate_sum: float = 1.0  # a bound on the chosen experts' gates' sum (docs/theory.md 3f): top_k for Llama 4's sigmoids
    gate_max: float = 1.0  # a bound on one routed gate: DeepSeek's routed_scaling_factor (docs/theory.md 3f)
    # a constant on the gated blocks' up branch, (u + up_offset) * phi(g) (gpt-oss's clamped SwiGLU: 1;
    # docs/theory.md 3n): a path phi(g) W_d of Lipschitz constant L_phi c_g c_d per unit offset
    up_offset: float = 0.0


def clamped_swiglu_constants(limit: float, alpha: float) -> tuple[float, float]:
    """``(L_phi, c_phi)`` of gpt-oss's clamped gate activation ``phi(t) = m sigmoid(alpha m)``, ``m = min(t,
    limit)`` (docs/theory.md 3n): ``sup |phi'| = sup_{s <= alpha limit} silu'(s)`` (the derivative in ``s =
    alpha t`` is SiLU's whatever ``alpha``; 0 above the clamp), which is SiLU's own supremum once ``alpha
    limit`` passes its argmax ``s* = 2.3994``; and ``sup |phi(t) / t| = sigmoid(alpha limit)``."""

    def silu_prime(x: float) -> float:
        sig = 1.0 / (1.0 + math.exp(-x))
        return sig * (1.0 + x * (1.0 - sig))

    lo, hi = 2.0, 3.0  # silu' rises to its maximum at s*, where 2 - s tanh(s / 2) = 0, then falls
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 2.0 - mid * math.tanh(mid / 2) > 0 else (lo, mid)
    top = alpha * limit
    return silu_prime(min(top, lo)), 1.0 / (1.0 + math.exp(-top))


def activation_lipschitz(activation: str | None) -> tuple[float, str]:
    """``L_phi`` for a config's ``hidden_act`` and where the value came from.

    No activation named: GELU's 1.13 (``"default (...)"``, said in the assumptions).  An activation
    not in the table (relu2, whose derivative is unbounded, or any other) is refused: a silent default
    could be below its true constant.  Pass ``l_phi`` (``--l-phi``) to analyse it with a stated value.
    """
    if activation is None:
        return DEFAULT_L_PHI, "default (config.json names no activation; GELU's)"
    if activation in ACTIVATIONS:
        return ACTIVATIONS[activation][0], f"hidden_act={activation}"
    raise SpecboundError(
        f"activation {activation!r} (config.json) has no Lipschitz constant in specbound's table "
        f"({', '.join(sorted(ACTIVATIONS))}); pass --l-phi VALUE (API l_phi=VALUE), an upper bound on "
        f"sup |phi'| over the inputs the model sees, to analyse it with that value"
    )


def check_gated_activation(activation: str | None, feed_forward: str) -> None:
    """A gated block's Lipschitz bound needs ``|phi(t)| <= c_phi |t|`` (docs/theory.md 3b): refuse an
    activation of the table without such a constant (sigmoid) rather than use ``c_phi = 1``."""
    if feed_forward == "gated" and activation in ACTIVATIONS and ACTIVATIONS[activation][1] is None:
        raise SpecboundError(
            f"activation {activation!r} in a gated feed-forward block has no c_phi with "
            f"|phi(t)| <= c_phi |t|, which the gated block's Lipschitz bound needs "
            f"(docs/theory.md 3b); specbound cannot analyse this block"
        )


def attention_lipschitz(norms: LayerSpectralNorms) -> float:
    """``sum_h c(OV_h) (1 + 4 c(QK_h))`` (multi-head attention on unit-norm rows); with ``n``
    disentangled position terms ``sum_h c(OV_h) (1 + 2 (2 + n) c(QK_h))`` (docs/theory.md 3h)."""
    if norms.position_terms:
        return float(np.sum(norms.ov * (1.0 + 2.0 * (2 + norms.position_terms) * norms.qk)))
    if norms.ov_reach is not None:  # latent attention: Lip(values) + 4 kappa max ||value|| (docs/theory.md 3l)
        return float(np.sum(norms.ov + 4.0 * norms.qk * norms.ov_reach))
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


def _branch_lipschitz(ff: dict, l_phi: float, c_phi: float, up_offset: float = 0.0) -> float:
    if "FF_gate" in ff:
        gated = (l_phi + c_phi) * ff["FF_gate"] * ff["FF_up"] * ff["FF_out"]
        return gated + up_offset * l_phi * ff["FF_gate"] * ff["FF_out"] if up_offset else gated
    return l_phi * ff["FF_in"] * ff["FF_out"]


def feed_forward_lipschitz(
    ff: dict[str, float], l_phi: float, c_phi: float = 1.0, gate_sum: float = 1.0, up_offset: float = 0.0
) -> float:
    """Plain ``act(x W_in) W_out``: ``L_phi c_in c_out``.  Gated
    ``(phi(x W_g) * (x W_u)) W_d`` with ``|phi(t)| <= c_phi |t|``: ``(L_phi + c_phi) c_g c_u c_d``
    (split ``phi(a)b - phi(a')b' = (phi(a) - phi(a'))b + phi(a')(b - b')``; docs/theory.md).  With a
    constant ``o`` on the up branch, ``((u + o) * phi(x W_g)) W_d`` (gpt-oss's ``+ 1``), the path
    ``o phi(x W_g) W_d`` adds ``o L_phi c_g c_d`` (docs/theory.md 3n).

    A mixture of experts (roles ``FF_gate[e3]``, ...): the largest routed expert's constant plus the
    shared expert's, since the top-k gates are non-negative and sum to at most 1 (``gate_sum`` when
    they only each are at most 1: ``top_k``) and the shared expert's sigmoid gate is at most 1, with
    the routing held fixed (docs/theory.md 3f)."""
    if not any(role.endswith("]") for role in ff):  # a dense block (the LLaMA path: no grouping)
        return _branch_lipschitz(ff, l_phi, c_phi, up_offset)
    branches = feed_forward_branches(ff)
    routed = [_branch_lipschitz(b, l_phi, c_phi, up_offset) for key, b in branches.items() if key != "shared"]
    shared = _branch_lipschitz(branches["shared"], l_phi, c_phi, up_offset) if "shared" in branches else 0.0
    return gate_sum * max(routed) + shared


def cross_query_lipschitz(norms: LayerSpectralNorms) -> float:
    """Cross-attention's Lipschitz constant in its queries (the decoder's stream), the encoder's output
    held fixed: ``2 sum_h c(OV_h) c(QK_h)`` (the softmax's weights move, the values do not;
    docs/theory.md 3i)."""
    return float(np.sum(2.0 * norms.cross_ov * norms.cross_qk))


def cross_memory_lipschitz(norms: LayerSpectralNorms) -> float:
    """Cross-attention's Lipschitz constant in the encoder's output (its keys and values), the queries
    held fixed: ``sum_h c(OV_h) (1 + 2 c(QK_h))`` (docs/theory.md 3i)."""
    return float(np.sum(norms.cross_ov * (1.0 + 2.0 * norms.cross_qk)))


def layer_lipschitz(norms: LayerSpectralNorms, l_phi: float) -> float:
    """``Lambda_k``: attention then feed-forward multiply (docs/spec.md section 3); parallel blocks add.
    A decoder layer (self-attention, cross-attention, feed-forward) multiplies the three, the
    cross-attention's factor in the decoder's stream (:func:`cross_query_lipschitz`)."""
    attention = attention_lipschitz(norms)
    ff = feed_forward_lipschitz(norms.ff, l_phi, gate_sum=norms.gate_sum, up_offset=norms.up_offset)
    if norms.cross_qk is not None:
        if norms.block == "parallel":
            raise ValueError("a parallel block with cross-attention is not modelled")
        return attention * cross_query_lipschitz(norms) * ff
    return attention + ff if norms.block == "parallel" else attention * ff


def memory_lipschitz(norms: LayerSpectralNorms, l_phi: float) -> float:
    """``M_j``: a decoder layer's Lipschitz constant in the encoder's output, which reaches it only
    through the cross-attention's keys and values: ``cross_memory_lipschitz * Lip(FF)``."""
    return cross_memory_lipschitz(norms) * feed_forward_lipschitz(
        norms.ff, l_phi, gate_sum=norms.gate_sum, up_offset=norms.up_offset
    )


def encoder_decoder_factors(
    lambdas: np.ndarray, memory: np.ndarray, first_decoder: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(alphas, ln alphas, ln Z)`` of an encoder-decoder whose layers ``0 .. first_decoder - 1`` are
    the encoder's and the rest the decoder's (docs/theory.md 3i).

    A decoder layer's downstream factor is the chain's, over the decoder alone:
    ``alpha_j = prod_{k > j} Lambda_k``.  The encoder's output ``z`` enters every decoder layer through
    its cross-attention, so the decoder's output moves by at most ``Z ||dz||`` with
    ``Z = sum_j alpha_j M_j`` (``memory``: ``M_j`` at the decoder's layers), and an encoder layer's
    factor is ``alpha_l = (prod_{l < k < first_decoder} Lambda_k) Z``.  ``alphas`` is ``inf`` where the
    product overflows; the logs are exact at any depth (taken of the product where it is a normal float).
    """
    lambdas = np.asarray(lambdas, dtype=np.float64)
    dec = lambdas[first_decoder:]
    m = np.asarray(memory, dtype=np.float64)[first_decoder:]
    alpha_d, log_alpha_d = downstream_factors(dec), log_downstream_factors(dec)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        z = float(np.sum(alpha_d * m))
        log_terms = log_alpha_d + np.log(m)
    top = np.max(log_terms) if log_terms.size else -math.inf
    log_z = top if not math.isfinite(top) else top + math.log(float(np.sum(np.exp(log_terms - top))))
    if _TINY <= z < math.inf:
        log_z = math.log(z)
    enc = lambdas[:first_decoder]
    with np.errstate(over="ignore", invalid="ignore"):
        alpha_e = downstream_factors(enc) * z
    log_alpha_e = log_downstream_factors(enc) + log_z
    normal = (alpha_e >= _TINY) & np.isfinite(alpha_e)
    with np.errstate(divide="ignore"):
        log_alpha_e = np.where(normal, np.log(np.where(normal, alpha_e, 1.0)), log_alpha_e)
    return np.concatenate([alpha_e, alpha_d]), np.concatenate([log_alpha_e, log_alpha_d]), log_z


def encoder_decoder_log_lipschitz(lambdas: np.ndarray, log_z: float, first_decoder: int) -> float:
    """``ln K`` with ``K = (prod_encoder Lambda) Z + prod_decoder Lambda``: the model's Lipschitz
    constant in its two inputs (the encoder's rows and the decoder's), what a chain's ``prod Lambda``
    is for the baselines that multiply norms along it (docs/theory.md 3i)."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    with np.errstate(divide="ignore"):
        a = float(np.sum(np.log(lambdas[:first_decoder]))) + log_z
        b = float(np.sum(np.log(lambdas[first_decoder:])))
    return float(np.logaddexp(a, b))


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
    after_attention = (
        1.0 if norms.block == "parallel" else feed_forward_lipschitz(ff, 1.0, 1.0, norms.gate_sum, norms.up_offset)
    )
    cross = {}
    if norms.cross_qk is not None:  # decoder: cross-attention between self-attention and feed-forward
        cross = {
            "QK_cross": 2.0 * norms.cross_ov * after_attention,
            "OV_cross": np.full_like(norms.cross_ov, after_attention),
        }
        after_attention = cross_query_lipschitz(norms) * after_attention
    # a perturbation of QK moves each logit by at most its norm once per bilinear term it is in:
    # x QK x^T, and with disentangled attention also x QK p^T (c2p) and p QK x^T (p2c)
    logit_terms = 1 + norms.position_terms
    # a QK-norm row moves head i's logits by S[i, h] per unit: gamma_h = 2 sum_i c(OV_i) S[i, h] (docs/theory.md 3d)
    reach = norms.ov if norms.ov_reach is None else norms.ov_reach  # the largest value a head's weights mix
    per_logit = reach if norms.qk_sensitivity is None else reach @ norms.qk_sensitivity
    gamma: dict[str, np.ndarray | float] = {
        "QK": (2.0 * logit_terms if norms.position_terms else 2.0) * per_logit * after_attention,
        "OV": np.full_like(norms.ov, after_attention)
        if norms.ov_sensitivity is None
        else norms.ov_sensitivity * after_attention,
        **cross,
    }
    if not any(role.endswith("]") for role in ff):
        gamma.update(_branch_sensitivities(ff, norms.up_offset))
        return gamma
    # a mixture of experts: each expert's matrices as in a dense block times the largest its gate can be
    # (1 for probabilities: dropped; DeepSeek's routed_scaling_factor), the shared expert's gate <= 1 dropped
    top = norms.gate_max
    for branch, values in feed_forward_branches(ff).items():
        g_max = 1.0 if branch == "shared" else top
        gamma.update(
            {
                f"{kind}[{branch}]": (g * g_max if g_max != 1.0 else g)
                for kind, g in _branch_sensitivities(values, norms.up_offset).items()
            }
        )
    return gamma


def _branch_sensitivities(ff: dict, up_offset: float = 0.0) -> dict[str, float]:
    if "FF_gate" in ff:  # the gate's perturbation is multiplied by u + up_offset (gpt-oss: clamp(u) + 1)
        return {
            "FF_gate": (ff["FF_up"] + up_offset) * ff["FF_out"],
            "FF_up": ff["FF_gate"] * ff["FF_out"],
            "FF_out": 1.0,
        }
    return {"FF_in": ff["FF_out"], "FF_out": 1.0}
