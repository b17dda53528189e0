"""Multi-head latent attention's rows and factors (docs/theory.md 3l).

Head ``h``'s logit between a query token ``x`` and a key token ``y`` is

    ``l = m [c_q(x) X_h c_k(y)^T + a^2 c_q(x) B_h^T M(delta) A y^T]``

with the normalised latents ``c_q(x) = nu_q(x W_qa^T)`` (``x`` itself without a query latent) and
``c_k(y) = nu_k(y W_kv^T)``, ``X_h = B_n^T C_n`` (the head's non-rotary query rows of ``q_b_proj`` against
its key rows of ``kv_b_proj``), ``B_h`` its rotary query rows, ``A`` the rotary key rows of
``kv_a_proj_with_mqa`` shared by every head, ``m`` YaRN's ``mscale^2`` and ``a`` the rope scaling's attention
factor; its output per key token is ``c_k(y) Y_h`` with ``Y_h = C_v^T O_h``.  The head is covered through
its raw factors: its QK row is the block-diagonal ``diag(W_qa^T, [W_kv; A]^T, X_h, B_h^T)`` and its OV row
``diag(W_kv^T, Y_h)`` (every norm, ``S_p`` and the rank that of the block-diagonal matrix: the blocks'
singular values together), with the sensitivities and Lipschitz factors derived in docs/theory.md 3l.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..archs.model import LatentWeights
from ..options import EXACT_SVD, KernelOptions
from .spectra import MatrixSpectrum, dense_spectrum


def block_diagonal_spectrum(blocks: list[MatrixSpectrum]) -> MatrixSpectrum:
    """The spectrum of ``diag(B_1, ..., B_k)`` from its blocks': the singular values together, the shapes
    summed, and the (2,1)- and (1,1)-norms summed (each column and entry belongs to one block)."""
    values = np.sort(np.concatenate([b.singular_values for b in blocks]))[::-1]
    methods = {b.sv_method for b in blocks}
    return MatrixSpectrum(
        shape=(sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)),
        singular_values=values,
        norm_2_1=float(sum(b.norm_2_1 for b in blocks)),
        norm_1_1=float(sum(b.norm_1_1 for b in blocks)),
        sv_method="gram" if "gram" in methods else "svd",
        sv_rel_error_bound=max(b.sv_rel_error_bound for b in blocks),
    )


@dataclass(frozen=True)
class LatentFactors:
    """One layer's latent-attention factors per head (docs/theory.md 3l), each shape ``(H,)``.

    ``kappa``: the logit's Lipschitz constant in the two tokens (the QK row's lipschitz_factor);
    ``qk_sensitivity``: how far the logit moves per unit spectral change of the QK row; ``value_lipschitz``:
    the value path's Lipschitz constant ``L_k ||Y_h||`` (the OV row's lipschitz_factor); ``value_reach``: its
    largest output ``R_k ||Y_h||``; ``ov_sensitivity``: how far it moves per unit spectral change of the OV
    row."""

    kappa: np.ndarray
    qk_sensitivity: np.ndarray
    value_lipschitz: np.ndarray
    value_reach: np.ndarray
    ov_sensitivity: np.ndarray


def _norm(w: np.ndarray, frobenius: bool) -> float:
    return float(np.linalg.norm(w)) if frobenius else float(np.linalg.norm(w, ord=2)) if w.size else 0.0


def _normed(w: np.ndarray, gain: np.ndarray, eps: float, frobenius: bool) -> tuple[float, float, float]:
    """``(J, L, R)`` of ``x -> nu(x W^T)`` on the unit ball (docs/theory.md 3d with the group the whole latent):
    the Jacobian bound ``||g||_inf / sqrt(eps)``, the Lipschitz constant ``J ||W||`` and the reach
    ``sqrt(n) ||g||_inf r / sqrt(r^2 + n eps)`` with ``r = ||W||``."""
    n = w.shape[0]
    r = _norm(w, frobenius)
    g = float(np.max(np.abs(gain))) if gain.size else 0.0
    jac = g / math.sqrt(eps)
    return jac, jac * r, g * math.sqrt(n) * r / math.sqrt(r * r + n * eps)


def latent_heads(w: LatentWeights) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per head ``(X_h, B_h, C_v, Y_h)``: ``X_h = B_n^T C_n`` ``(q_rank or N, kv_rank)``, the rotary query rows
    ``B_h`` ``(d_rope, q_rank or N)``, and ``Y_h = C_v^T O_h`` ``(kv_rank, N)``."""
    d = w.dims
    xs, brs, ys = [], [], []
    for h in range(w.q_b.shape[0]):
        b_n, b_r = w.q_b[h, : d.d_nope], w.q_b[h, d.d_nope :]
        c_n, c_v = w.kv_b[h, : d.d_nope], w.kv_b[h, d.d_nope :]
        xs.append(b_n.T @ c_n)
        brs.append(b_r)
        ys.append(c_v.T @ w.o[h])
    return xs, brs, ys


def latent_factors(w: LatentWeights, *, frobenius: bool = False) -> LatentFactors:
    """The per-head factors of :class:`LatentFactors` (``frobenius``: every norm of a factor replaced by its
    Frobenius norm, the Frobenius-side analogues ``>=`` the spectral ones; the sensitivities are spectral)."""
    d = w.dims
    m, a2 = d.logit_scale, d.rope_factor**2
    kv_c, rope = w.kv_a[: d.kv_rank], w.kv_a[d.kv_rank :]
    jk, lk, rk = _normed(kv_c, w.kv_gain, d.kv_eps, frobenius)
    if w.q_a is None:  # no query latent: the token itself (reach 1, Lipschitz 1)
        jq, lq, rq = 0.0, 1.0, 1.0
    else:
        jq, lq, rq = _normed(w.q_a, w.q_gain, d.q_eps, frobenius)
    a_r = _norm(rope, frobenius)
    xs, brs, ys = latent_heads(w)
    out = {k: [] for k in ("kappa", "s", "lip_v", "reach_v", "s_ov")}
    for x_h, b_r, y_h in zip(xs, brs, ys):
        x, b, y = _norm(x_h, frobenius), a2 * _norm(b_r, frobenius), _norm(y_h, frobenius)
        key = x * rk + b * a_r  # ||X c_k^T + a^2 B^T M A y^T|| over unit-ball keys
        out["kappa"].append(m * max(lq * key, rq * (x * lk + b * a_r)))
        out["s"].append(m * (jq * key + rq * rk + a2 * rq * a_r + rq * math.hypot(x * jk, b)))
        out["lip_v"].append(lk * y)
        out["reach_v"].append(rk * y)
        out["s_ov"].append(jk * y + rk)
    arr = {k: np.array(v, dtype=np.float64) for k, v in out.items()}
    return LatentFactors(arr["kappa"], arr["s"], arr["lip_v"], arr["reach_v"], arr["s_ov"])


def latent_spectra(w: LatentWeights, kernel: KernelOptions = EXACT_SVD):
    """``(qk, ov, qk_sensitivity (H, H), value_reach (H,), ov_sensitivity (H,))`` of one layer: each head's QK row
    ``diag(W_qa^T, [W_kv; A]^T, X_h, B_h^T)`` (without a query latent ``diag([W_kv; A]^T, X_h, B_h^T)``) and OV
    row ``diag(W_kv^T, Y_h)`` in row-vector orientation, their spectra from the blocks' (the shared blocks'
    computed once), ``lipschitz`` the head's ``kappa_h`` and ``L_k ||Y_h||``."""
    kernel = kernel if kernel.method == "factored" else EXACT_SVD
    d = w.dims
    spec = lambda m: dense_spectrum(np.ascontiguousarray(m), kernel)  # noqa: E731
    shared_qk = ([spec(w.q_a.T)] if w.q_a is not None else []) + [spec(w.kv_a.T)]
    shared_ov = spec(w.kv_a[: d.kv_rank].T)
    xs, brs, ys = latent_heads(w)
    f, ff = latent_factors(w), latent_factors(w, frobenius=True)
    qk = [
        replace(
            block_diagonal_spectrum(shared_qk + [spec(x), spec(b.T)]), lipschitz=float(k), lipschitz_frobenius=float(kf)
        )
        for x, b, k, kf in zip(xs, brs, f.kappa, ff.kappa)
    ]
    ov = [
        replace(block_diagonal_spectrum([shared_ov, spec(y)]), lipschitz=float(v), lipschitz_frobenius=float(vf))
        for y, v, vf in zip(ys, f.value_lipschitz, ff.value_lipschitz)
    ]
    return qk, ov, np.diag(f.qk_sensitivity), f.value_reach, f.ov_sensitivity


def latent_difference_spectra(w, w0, kernel: KernelOptions = EXACT_SVD):
    """``(qk, ov, ff)``: the spectra of ``Z - Z0`` for every latent QK and OV row (``--init``; docs/theory.md 3l)
    and of every feed-forward matrix's difference (``w``, ``w0``: the layers'
    :class:`~specbound.archs.model.LayerWeights`).  A block-diagonal row's difference is the block-diagonal
    of the blocks' differences."""
    kernel = kernel if kernel.method == "factored" else EXACT_SVD
    a, a0 = w.latent, w0.latent
    spec = lambda m: dense_spectrum(np.ascontiguousarray(m), kernel)  # noqa: E731
    shared = ([spec((a.q_a - a0.q_a).T)] if a.q_a is not None else []) + [spec((a.kv_a - a0.kv_a).T)]
    shared_ov = spec((a.kv_a[: a.dims.kv_rank] - a0.kv_a[: a0.dims.kv_rank]).T)
    (xs, brs, ys), (xs0, brs0, ys0) = latent_heads(a), latent_heads(a0)
    qk = [
        block_diagonal_spectrum(shared + [spec(x - x0), spec((b - b0).T)]) for x, x0, b, b0 in zip(xs, xs0, brs, brs0)
    ]
    ov = [block_diagonal_spectrum([shared_ov, spec(y - y0)]) for y, y0 in zip(ys, ys0)]
    ff = {role: dense_spectrum(m - w0.ff[role]) for role, m in w.ff.items()}
    return qk, ov, ff
