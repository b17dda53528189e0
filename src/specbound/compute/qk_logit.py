"""The factors of a head's attention logit when the model scales or normalises its queries and keys
(docs/theory.md section 3d, docs/rotary.md section 5).

Two things sit between ``x W_Q^T`` and the dot product in today's decoders:

* a rope scaling's **attention factor** ``a`` (YaRN, LongRoPE): transformers multiplies ``cos`` and
  ``sin`` by ``a``, so the logit is ``a^2 x W_Q^T M(delta) W_K y^T``.  Folding ``a`` into both factors
  (``a W_Q``, ``a W_K``) makes every QK quantity that of the matrix the logit uses (:func:`logit_factors`);
* **QK-norm** (Qwen3, Gemma 3, OLMo2): ``q = nu_q(x W_Q^T)``, ``k = nu_k(y W_K^T)`` with RMSNorm
  ``nu(u) = g * u / sqrt(mean(u^2) + eps)``.  The logit ``a^2 q M(delta) k^T`` is then a function of the
  head's raw factors ``W_Q^h``, ``W_K^g`` (the gains fixed), not of any one bilinear matrix: the head is
  covered through the stacked factors ``Z_h = [W_Q^h; W_K^g]`` (:func:`qk_norm_factors`), each unit of
  spectral change moving its logits by at most :func:`qk_norm_sensitivity`, and its Lipschitz constant in
  the two tokens is :func:`qk_norm_lipschitz`.

Shapes as everywhere: ``q`` ``(H, d_h, N)``, ``k`` ``(H_kv, d_h, N)``, float64.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..archs.model import LayerWeights, QKNorm


def logit_factors(weights: LayerWeights, attention_factor: float = 1.0) -> LayerWeights:
    """``weights`` with ``q``, ``k`` replaced by the factors of the bilinear logit: both scaled by the
    attention factor ``a``.  The same object when ``a = 1``, and for a QK-norm layer, whose head is
    covered through its raw factors (``a`` enters its sensitivity and ``kappa``: docs/theory.md 3d)."""
    if weights.qk_norm is not None or attention_factor == 1.0:
        return weights
    return replace(weights, q=weights.q * attention_factor, k=weights.k * attention_factor)


def qk_norm_factors(q: np.ndarray, k: np.ndarray, kv_index: np.ndarray) -> list[np.ndarray]:
    """Each query head's ``Z_h^T = [W_Q^h; W_K^g]^T`` in row-vector orientation, shape ``(N, 2 d_h)``: the
    linear map ``x -> (x W_Q^h^T, x W_K^g^T)`` whose two halves the head normalises (docs/theory.md 3d)."""
    return [np.concatenate([q[h], k[g]], axis=0).T for h, g in enumerate(np.asarray(kv_index, dtype=int))]


def _normed_reach(
    w: np.ndarray, gain: np.ndarray, eps: float, span: str, *, frobenius: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Per head ``(L, R)``: ``L`` bounds the Lipschitz constant of ``x -> nu(x W^T)_h`` and ``R`` its
    norm over the unit ball ``||x|| <= 1`` (docs/theory.md 3d).

    With ``n`` the normalised width (``d_h`` per head, ``H d_h`` over the projection) and
    ``nu(u) = sqrt(n) G u / sqrt(||u||^2 + n eps)``, the Jacobian is
    ``sqrt(n) G (I - u u^T / (||u||^2 + n eps)) / sqrt(||u||^2 + n eps)``, of norm at most
    ``||g||_inf / sqrt(eps)`` (at ``u = 0``), so ``L = ||g_h||_inf ||W_group||_2 / sqrt(eps)`` with
    ``W_group`` the normalised projection (the head's ``W^h``, or all heads' stacked).  Head ``h``'s
    block has norm ``sqrt(n) ||g_h * u_h|| / sqrt(||u||^2 + n eps) <= sqrt(n) ||g_h||_inf r / sqrt(r^2 +
    n eps)`` with ``r = ||u_h|| <= ||W^h||_2``, increasing in ``r``.

    ``frobenius``: every spectral norm replaced by the Frobenius norm of the same matrix (``L``, ``R``
    increase in it, so each value is at least the spectral one): the Frobenius-side analogue.
    """
    heads, d, _ = w.shape
    if frobenius:
        s1 = np.linalg.norm(w, axis=(1, 2))  # ||W^h||_F per head
    else:
        s1 = np.linalg.norm(w, ord=2, axis=(1, 2))  # ||W^h||_2 per head
    g_inf = np.max(np.abs(gain), axis=1)
    if span == "head":
        n, group = d, s1
    elif frobenius:  # ||[W^1; ...; W^H]||_F = sqrt(sum ||W^h||_F^2)
        n, group = heads * d, np.full(heads, float(np.linalg.norm(w)))
    else:  # ||[W^1; ...; W^H]||_2 <= sqrt(sum ||W^h||^2) (and <= ||W||_F): no SVD of the whole projection
        n = heads * d
        group = np.full(heads, min(math.sqrt(float(np.sum(s1**2))), float(np.linalg.norm(w))))
    lipschitz = g_inf * group / math.sqrt(eps)
    reach = g_inf * math.sqrt(n) * s1 / np.sqrt(s1**2 + n * eps)
    return lipschitz, reach


def qk_norm_lipschitz(
    q: np.ndarray,
    k: np.ndarray,
    kv_index: np.ndarray,
    norm: QKNorm,
    attention_factor: float = 1.0,
    *,
    frobenius: bool = False,
) -> np.ndarray:
    """Per query head ``kappa_h``, shape ``(H,)``: for unit-norm tokens ``x, x', y, y'`` and every
    orthogonal ``M`` (any offset, any rope scaling's angles), the normalised logit
    ``l(x, y) = a^2 nu_q(x W_Q^T)_h M nu_k(y W_K^T)_g^T`` satisfies

        ``|l(x, y) - l(x', y')| <= kappa_h (||x - x'|| + ||y - y'||)``,
        ``kappa_h = a^2 max(L_q R_k, R_q L_k)``

    (``L``, ``R`` of :func:`_normed_reach`; split ``q M k^T - q' M k'^T = (q - q') M k^T + q' M (k -
    k')^T``).  ``q``, ``k`` are the raw projections (gains not folded); ``kv_index`` ``(H,)`` the key
    head of each query head.  Finite because ``eps > 0``.  ``frobenius``: the Frobenius-side analogue
    ``kappa_F >= kappa_h`` (every ``||.||_2`` of the factors replaced by ``||.||_F``), the factor the
    Frobenius product reads in place of ``kappa_h`` (docs/bounds.md 8).
    """
    lq, rq = _normed_reach(q, norm.q_gain, norm.eps, norm.span, frobenius=frobenius)
    lk, rk = _normed_reach(k, norm.k_gain, norm.eps, norm.span, frobenius=frobenius)
    kv = np.asarray(kv_index, dtype=int)
    return attention_factor**2 * np.maximum(lq * rk[kv], rq * lk[kv])


def qk_norm_sensitivity(
    q: np.ndarray, k: np.ndarray, kv_index: np.ndarray, norm: QKNorm, attention_factor: float = 1.0
) -> np.ndarray:
    """``S``, shape ``(H, H)``: ``S[i, h]`` bounds how far query head ``i``'s logits move per unit of
    ``||Delta Z_h||_2``, a change of head ``h``'s stacked factors ``Z_h = [W_Q^h; W_K^g]`` (docs/theory.md 3d).

    A change ``Delta = [Delta_Q; Delta_K]`` moves ``u = x W^T`` by at most ``||Delta||_2`` (``||x|| <= 1``),
    the normalised query of a head by at most ``||g_h||_inf / sqrt(eps)`` times that (the RMSNorm's
    Jacobian bound of :func:`_normed_reach`), and the logit ``a^2 q M k^T`` by
    ``s_i = a^2 (||g_q,i||_inf R_k + R_q ||g_k,g||_inf) / sqrt(eps)`` per unit (``R`` each side's reach).
    With a norm per head (``span = "head"``; each query head given its own copy of its key head, which
    covers the tied model) only head ``h`` moves: ``S = diag(s)``.  A norm over the whole projection
    (OLMo2) normalises every head by all heads' queries (keys): a change of ``Z_h`` moves every head ``i``,
    each by at most ``s_i``, so ``S[i, h] = s_i``.
    """
    lq, rq = _normed_reach(q, norm.q_gain, norm.eps, norm.span)
    lk, rk = _normed_reach(k, norm.k_gain, norm.eps, norm.span)
    kv = np.asarray(kv_index, dtype=int)
    gq = np.max(np.abs(norm.q_gain), axis=1)
    gk = np.max(np.abs(norm.k_gain), axis=1)
    s = attention_factor**2 * (gq * rk[kv] + rq * gk[kv]) / math.sqrt(norm.eps)
    if norm.span == "head":
        return np.diag(s)
    return np.repeat(s[:, None], s.size, axis=1)
