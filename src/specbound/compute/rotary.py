"""Rotary position embeddings (RoPE) in the per-head query-key matrices (see docs/rotary.md).

Row-vector convention, as everywhere in specbound: a token is a row ``x`` in ``R^N``; head ``h``
has ``W_Q^h, W_K^h`` of shape ``(d_h, N)`` (rows ``[h d_h, (h+1) d_h)`` of ``q_proj.weight`` /
``k_proj.weight``), ``q = x W_Q^T`` and ``k = x W_K^T``.

A rotary model rotates ``q`` and ``k`` by their positions before the dot product:
``q_rot = q @ M(t)`` with the block-diagonal orthogonal ``M(t)`` of :func:`rotation` (exactly what
HF's ``q * cos + rotate_half(q) * sin`` does).  Since ``M(t) M(s)^T = M(t - s)``, the logit of a
query at position ``t`` and a key at position ``s`` is

    ``x_t W_Q^T M(t - s) W_K x_s^T``,

so the effective QK matrix at the offset ``delta = t - s`` is ``W_Q^T M(delta) W_K`` (``N x N``,
rank ``<= d_h``).  In the column-vector convention ``M(delta) = G(s - t)`` with ``G`` the usual
counter-clockwise rotation by ``(s - t) theta_i`` in every pair.

A layout with several position axes (``RotaryLayout.axes``: M-RoPE's time, height and width, a vision
tower's patch rows and columns) rotates pair ``i`` by ``delta[axes[i]] theta_i`` for a position vector, and
everything above holds with integer offset vectors ``delta`` (``(K, n_axes)`` arrays wherever a 1D layout
takes ``(K,)``): ``M`` is still block-diagonal orthogonal and ``M(t) M(s)^T = M(t - s)``.  The offsets the
model can produce are ``RotaryLayout.offsets`` (docs/rotary.md section 7).

:func:`rotary_qk_envelope` reports, for every query head, quantities that bound the corresponding
quantity of ``W_Q^T M(delta) W_K`` at *every* offset (``|delta| <= P - 1``, or every vector of the
layout's ``offsets``; most of them at every orthogonal matrix in place of ``M(delta)``).  The
rotation-blind quantities of ``W_Q^T W_K`` (``delta = 0``) are computed elsewhere
(``spectra.factored_spectra``) and not repeated here.

Everything is float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

# At import time, not inside the QR helper: threadpoolctl limits only the BLAS libraries already
# loaded when it is entered, and SciPy's own OpenBLAS, loaded later and unlimited, spins against
# the other threads (docs/benchmarks.md).
from scipy.linalg import lapack

from ..archs.model import RotaryLayout

# Default budget of d_h x d_h core SVDs for the exact spectral norm over all offsets: a few seconds
# a layer at d_h = 128 on one core (the timings: docs/benchmarks.md).  A LLaMA-7B layer (32 heads x
# 8191 offsets = 262 112 cores) is over budget and gets the product bound.
DEFAULT_MAX_CORE_SVDS = 4096
# Entries of the per-chunk stacks (rotated R factors, cores): 2^21 float64 = 16 MB each.
_CHUNK_ENTRIES = 1 << 21


def _offset_array(layout: RotaryLayout, deltas) -> np.ndarray:
    """``deltas`` as float64, ``(K,)`` for one axis or ``(K, n_axes)`` (one vector ``(n_axes,)`` allowed)."""
    deltas = np.asarray(deltas, dtype=np.float64)
    if layout.axes is None:
        deltas = np.atleast_1d(deltas)
        if deltas.ndim != 1:
            raise ValueError(f"deltas must be a scalar or a 1-d array, got shape {deltas.shape}")
        return deltas
    deltas = deltas[None] if deltas.ndim == 1 else deltas
    if deltas.ndim != 2 or deltas.shape[1] != layout.n_axes:
        raise ValueError(
            f"offsets of a rotary layout with {layout.n_axes} position axes must be vectors "
            f"of shape (K, {layout.n_axes}), got shape {deltas.shape}"
        )
    return deltas


def _angles(layout: RotaryLayout, deltas: np.ndarray) -> np.ndarray:
    """Each pair's angle at each offset, ``(K, rot/2)``: ``delta theta_i`` (one axis), ``delta[axes[i]] theta_i``."""
    if layout.axes is None:
        return deltas[:, None] * layout.thetas[None, :]
    return deltas[:, np.asarray(layout.axes)] * layout.thetas[None, :]


def rotations(layout: RotaryLayout, d_head: int, deltas) -> np.ndarray:
    """``M(delta)`` for every ``delta`` in ``deltas``, shape ``(k, d_head, d_head)``.

    ``M(delta)`` acts on row vectors as the model does at position ``delta``: ``q_rot = q @ M``
    gives ``q_rot[u] = q[u] cos - q[v] sin`` and ``q_rot[v] = q[v] cos + q[u] sin`` for each pair
    ``(u, v)`` and angle ``delta * theta_i`` (HF's ``q * cos + rotate_half(q) * sin``).  It is
    orthogonal, ``M(a) M(b) = M(a + b)`` and ``M(a)^T = M(-a)``; unrotated dimensions get 1 on the
    diagonal.  ``deltas`` may be any reals (positions divided by a scaling factor, say); with several
    position axes, vectors ``(k, n_axes)`` (pair ``i`` at angle ``delta[axes[i]] theta_i``).
    """
    layout.check_head_dim(d_head)
    deltas = _offset_array(layout, deltas)
    u, v = layout.pairs
    ang = _angles(layout, deltas)
    c, s = np.cos(ang), np.sin(ang)
    out = np.zeros((len(deltas), d_head, d_head))
    idx = np.arange(layout.rotary_dim, d_head)
    out[:, idx, idx] = 1.0
    out[:, u, u] = c
    out[:, v, v] = c
    out[:, u, v] = s
    out[:, v, u] = -s
    return out


def rotation(layout: RotaryLayout, d_head: int, delta: float) -> np.ndarray:
    """``M(delta)``, shape ``(d_head, d_head)`` (``delta`` a vector with several axes); see :func:`rotations`."""
    return rotations(layout, d_head, [delta])[0]


def _r_factor(w: np.ndarray) -> np.ndarray:
    """R of the thin QR of ``w.T`` for a ``(d, N)`` factor: shape ``(min(N, d), d)``, with
    ``w.T = Q R`` and ``Q`` having orthonormal columns."""
    wt = np.asfortranarray(np.asarray(w, dtype=np.float64).T)  # (N, d)
    n, d = wt.shape
    k = min(n, d)
    if k == 0:
        return np.zeros((0, d))
    factored, _, info = lapack.dgeqrt(max(1, min(16, k)), wt)
    if info != 0:
        raise RuntimeError(f"LAPACK dgeqrt failed (info={info}) on a {n} x {d} factor")
    return np.triu(factored[:k])


def _rotated_r(r_a: np.ndarray, layout: RotaryLayout, deltas: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``R_a @ M(delta)`` for every delta, shape ``(K, k, d)``, in ``O(K k d)`` (column pairs mix).

    ``out``: a buffer of at least ``K * k * d`` entries to write into (reused across chunks so that
    large stacks are not freshly page-faulted for every chunk).
    """
    u, v = layout.pairs
    ang = _angles(layout, deltas)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    au, av = r_a[:, u][None], r_a[:, v][None]
    shape = (len(deltas),) + r_a.shape
    out = np.empty(shape) if out is None else out.reshape(-1)[: math.prod(shape)].reshape(shape)
    out[...] = r_a
    out[:, :, u] = c * au - s * av
    out[:, :, v] = s * au + c * av
    return out


def _chunks(deltas: np.ndarray, per_delta: int):
    step = max(1, _CHUNK_ENTRIES // max(per_delta, 1))
    for i in range(0, len(deltas), step):
        yield deltas[i : i + step]


def _core_singular_values(r_a, r_b, layout, deltas):
    """Singular values of ``R_a M(delta) R_b^T`` for each delta, shape ``(K, min(k_a, k_b))``."""
    k_a, d = r_a.shape
    k_b = r_b.shape[0]
    count = len(deltas)
    out = np.empty((count, min(k_a, k_b)))
    step = max(1, _CHUNK_ENTRIES // max(k_a * d, 1))
    rm_buf = np.empty(min(step, count) * k_a * d)
    core_buf = np.empty((min(step, count) * k_a, k_b))
    for i in range(0, count, step):
        part = deltas[i : i + step]
        rm = _rotated_r(r_a, layout, part, rm_buf)
        cores = np.matmul(rm.reshape(-1, d), r_b.T, out=core_buf[: len(part) * k_a])
        out[i : i + len(part)] = np.linalg.svd(cores.reshape(len(part), k_a, k_b), compute_uv=False)
    return out


def exact_qk_at_offsets(q_h: np.ndarray, k_g: np.ndarray, layout: RotaryLayout, deltas) -> np.ndarray:
    """Singular values of ``W_Q^T M(delta) W_K`` at each offset, from its ``k x k`` core.

    With thin QRs ``W_Q^T = Q_a R_a`` and ``W_K^T = Q_b R_b``,
    ``W_Q^T M W_K = Q_a (R_a M R_b^T) Q_b^T``: the nonzero singular values are those of the core.

    Parameters
    ----------
    q_h, k_g : ndarray, shape (d_h, N)
        The query head's and its key head's factors.
    layout : RotaryLayout
    deltas : array_like of float, shape (K,), or (K, n_axes) for a layout with several position axes
        Offsets ``t - s`` (query position minus key position).

    Returns
    -------
    ndarray, shape (K, min(N, d_h))
        Descending singular values per offset; the other ``N - min(N, d_h)`` are exactly zero.
    """
    q_h, k_g = np.asarray(q_h, dtype=np.float64), np.asarray(k_g, dtype=np.float64)
    if q_h.ndim != 2 or q_h.shape != k_g.shape:
        raise ValueError(f"q_h and k_g must both be (d_h, N), got {q_h.shape} and {k_g.shape}")
    layout.check_head_dim(q_h.shape[0])
    return _core_singular_values(_r_factor(q_h), _r_factor(k_g), layout, _offset_array(layout, deltas))


@dataclass(frozen=True)
class RotaryHeadEnvelope:
    """Bounds for one query head that hold at every offset (``|delta| <= P - 1``; the layout's ``offsets``).

    ``X(delta) = W_Q^T M(delta) W_K`` is the head's ``N x N`` QK matrix at offset ``delta``.
    Every ``*_bound`` field and the envelope hold for *every* orthogonal ``d_h x d_h`` matrix in
    place of ``M(delta)`` (so whatever the rope scaling does to the angles); ``spectral_sup`` and
    ``norm_2_1_sup`` are the exact maxima over the integer offsets when their method says
    ``"exact_over_offsets"``.

    Attributes
    ----------
    head, kv_head : int
        Query head ``h`` and the key head ``g`` it uses.
    n : int
        ``N``, the model width (``X`` is ``N x N``).
    spectral_sup : float
        ``max_delta ||X(delta)||_2`` (exact) or ``spectral_bound``.
    spectral_method : str
        ``"exact_over_offsets"`` or ``"product_bound"``: how ``spectral_sup`` and the other
        ``*_sup`` fields and ``sigma_bounds`` were obtained.
    argmax_offset : int, tuple of int or None
        An offset attaining ``spectral_sup`` when exact (a vector for a layout with several axes).
    spectral_bound : float
        ``||W_Q^h||_2 ||W_K^g||_2 = envelope[0]``.
    envelope : ndarray, shape (k,), k = min(N, d_h)
        ``e_i = s_i(W_Q^h) s_i(W_K^g)``, descending.  ``sum_{i<=j} s_i(X)^p <= sum_{i<=j} e_i^p`` for
        all ``j`` and ``p > 0`` (Horn).
    rank_bound : int
        Upper bound on the numerical rank ``#{s_i(X) > rank_tol N max(s_1(X), 1)}`` of every ``X``.
    norm_2_1_sup, norm_2_1_method :
        ``max_delta ||X(delta)||_{2,1}`` (``"exact_over_offsets"``) or ``norm_2_1_bound`` (``"bound"``).
    norm_2_1_bound : float
        ``min(||W_Q||_2 sum_j ||W_K[:, j]||, sqrt(N) ||e||_2)``.
    norm_1_1_bound : float
        ``min((sum_i ||W_Q[:, i]||)(sum_j ||W_K[:, j]||), sqrt(N) norm_2_1_bound,
        sqrt(N) ||W_K||_2 sum_i ||W_Q[:, i]||)``.
    sigma_bounds : ndarray, shape (k,)
        A per-index bound ``sigma_bounds[i] >= s_{i+1}(X(delta))`` at every offset: the exact
        ``max_delta s_{i+1}(X(delta))`` (exact) or ``f_{i+1} = min_{j+l=i+2} s_j(W_Q) s_l(W_K)``
        (Weyl-Horn, every orthogonal matrix).  The envelope is *not* such a bound (docs/rotary.md 3.2).
    frobenius_sup, nuclear_sup : float
        ``max_delta ||X(delta)||_F`` and ``max_delta ||X(delta)||_*`` (exact), else the envelope's
        ``||e||_2`` and ``sum e_i`` (Horn at ``p = 2`` and ``p = 1``).
    stable_rank_sup : float
        ``max_delta ||X(delta)||_F^2 / ||X(delta)||_2^2`` (exact; 0 at an offset where ``X = 0``),
        else ``#{i : f_i > 0}``, which bounds the rank and so the stable rank of every ``X``
        (no cheap lower bound on ``min_delta ||X(delta)||_2`` exists to do better).
    """

    head: int
    kv_head: int
    n: int
    spectral_sup: float
    spectral_method: str
    argmax_offset: int | tuple[int, ...] | None
    spectral_bound: float
    envelope: np.ndarray
    rank_bound: int
    norm_2_1_sup: float
    norm_2_1_method: str
    norm_2_1_bound: float
    norm_1_1_bound: float
    sigma_bounds: np.ndarray
    frobenius_sup: float
    nuclear_sup: float
    stable_rank_sup: float

    @property
    def kept_envelope(self) -> np.ndarray:
        """``envelope[:rank_bound]``, shape ``(rank_bound,)``: the values whose powers bound the
        thresholded ``S_p`` of every ``X``.  Do not threshold these again (see docs/rotary.md)."""
        return self.envelope[: self.rank_bound]

    @property
    def frobenius_bound(self) -> float:
        """``||X||_F <= ||e||_2`` (Horn at ``p = 2``, all values)."""
        return float(np.sqrt(np.sum(self.envelope**2)))

    def schatten_power(self, p: float) -> float:
        """Upper bound on the project's ``S_p(X) = sum_{s_i > tau} s_i^p`` for every offset:
        ``sum(kept_envelope ** p)`` for ``p > 0``, ``rank_bound`` for ``p = 0``."""
        if p < 0:
            raise ValueError(f"Schatten index p must be >= 0, got {p}")
        if p == 0:
            return float(self.rank_bound)
        return float(np.sum(self.kept_envelope**p))


def weyl_horn_bounds(s_a: np.ndarray, s_b: np.ndarray) -> np.ndarray:
    """``f_i = min_{j+l=i+1} s_j(A) s_l(B)``, ``i = 1..k`` (``k = min`` of the lengths), shape (k,):
    ``s_i(A^T R B) <= f_i`` for every orthogonal ``R`` (Weyl/Horn: ``s_{j+l-1}(XY) <= s_j(X) s_l(Y)``,
    Horn & Johnson, *Topics in Matrix Analysis*, Thm 3.3.16).  Non-increasing, ``f_1 = s_1(A) s_1(B)``."""
    k = min(s_a.size, s_b.size)
    return np.array([np.min(s_a[: i + 1] * s_b[i::-1]) for i in range(k)], dtype=np.float64)


def _rank_bound(f: np.ndarray, tau0: float) -> int:
    """``#{i : f_i > tau0}`` (``f`` non-increasing, :func:`weyl_horn_bounds`)."""
    return int(np.count_nonzero(f > tau0))


def _offset_maxima(sv: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """From the singular values of ``X(delta)`` at every offset, shape ``(K, k)``: the per-index
    maxima (shape ``(k,)``), and the maxima of ``||X||_F``, ``||X||_*`` and the stable rank."""
    top = sv[:, 0]
    frob_sq = np.sum(sv**2, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        stable = np.where(top > 0, frob_sq / np.where(top > 0, top, 1.0) ** 2, 0.0)
    return sv.max(axis=0), float(np.sqrt(frob_sq.max())), float(sv.sum(axis=1).max()), float(stable.max())


def rotary_qk_envelope(
    q: np.ndarray,
    k: np.ndarray,
    kv_index,
    layout: RotaryLayout,
    *,
    rank_tol: float,
    max_core_svds: int = DEFAULT_MAX_CORE_SVDS,
    exact_norm_2_1: bool = False,
) -> list[RotaryHeadEnvelope]:
    """Per query head, bounds on the rotary QK matrices ``W_Q^T M(delta) W_K`` over all offsets.

    Parameters
    ----------
    q : ndarray, shape (H, d_h, N)
        ``W_Q^h`` per query head, float64: the logit's factors (a rope scaling's attention factor
        and any query/key norm gains already folded in by the caller, ``compute.qk_logit``).
    k : ndarray, shape (H_kv, d_h, N)
        ``W_K^g`` per key head.
    kv_index : array_like of int, shape (H,), or None
        Key head of each query head (grouped-query attention: ``h // (H / H_kv)``); None: ``h``.
    layout : RotaryLayout
    rank_tol : float
        The project's rank tolerance: ``tau = rank_tol * N * max(s_1, 1)`` for an ``N x N`` matrix.
    max_core_svds : int
        Budget of ``d_h x d_h`` core SVDs.  When ``H * (2P - 1)`` (``H`` times the layout's
        ``max_offset_count`` with several position axes) fits (and the layout is
        ``offset_invariant``: every rope type but LongRoPE), ``spectral_sup`` is the exact maximum
        over all offsets at the layout's frequencies; otherwise it is the
        product bound.  The default (4096) keeps the exact path near 3.5 s at ``d_h = 128`` (one
        thread; see ``DEFAULT_MAX_CORE_SVDS``).
    exact_norm_2_1 : bool
        Also compute ``max_delta ||X(delta)||_{2,1}`` exactly (``O(H P N d_h^2)`` work, not gated
        by the budget; ignored, i.e. the bound is reported, when the layout is not offset-invariant).

    Returns
    -------
    list of RotaryHeadEnvelope, one per query head.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if q.ndim != 3 or k.ndim != 3 or q.shape[1:] != k.shape[1:]:
        raise ValueError(f"q must be (H, d_h, N) and k (H_kv, d_h, N), got {q.shape} and {k.shape}")
    heads, d, n = q.shape
    layout.check_head_dim(d)
    kv_index = np.arange(heads) if kv_index is None else np.asarray(kv_index, dtype=int)
    if kv_index.shape != (heads,) or (heads and (kv_index.min() < 0 or kv_index.max() >= k.shape[0])):
        raise ValueError(f"kv_index must have shape ({heads},) with entries in [0, {k.shape[0]})")

    r_q = [_r_factor(w) for w in q]
    used_kv = sorted(set(kv_index.tolist()))
    r_k = {g: _r_factor(k[g]) for g in used_kv}
    s_q = [np.linalg.svd(r, compute_uv=False) for r in r_q]
    s_k = {g: np.linalg.svd(r_k[g], compute_uv=False) for g in used_kv}
    colsum_q = np.sqrt(np.einsum("hij,hij->hj", q, q)).sum(axis=1)
    colsum_k = {g: float(np.sqrt(np.einsum("ij,ij->j", k[g], k[g])).sum()) for g in used_kv}

    # the offsets are allocated only when the exact path is affordable (P may be huge)
    exact = layout.offset_invariant and heads * layout.max_offset_count <= max_core_svds
    offsets = (
        layout.offsets.astype(np.float64)
        if exact or exact_norm_2_1
        else np.zeros((0,) + (() if layout.axes is None else (layout.n_axes,)))
    )
    tau0 = rank_tol * max(n, 1)  # the tolerance's floor: max(s_1, 1) >= 1 at every offset
    out = []
    for h in range(heads):
        g = int(kv_index[h])
        sa, sb = s_q[h], s_k[g]
        kk = min(sa.size, sb.size)
        env = sa[:kk] * sb[:kk]
        s1a = float(sa[0]) if sa.size else 0.0
        s1b = float(sb[0]) if sb.size else 0.0
        product = float(env[0]) if kk else 0.0
        f = weyl_horn_bounds(sa, sb)
        fro = float(np.sqrt(np.sum(env**2)))
        if exact and kk:
            sv = _core_singular_values(r_q[h], r_k[g], layout, offsets)  # (2P - 1, k)
            j = int(np.argmax(sv[:, 0]))
            spectral, method = float(sv[j, 0]), "exact_over_offsets"
            argmax = int(offsets[j]) if layout.axes is None else tuple(int(x) for x in offsets[j])
            sigma, fro_sup, nuc_sup, stable_sup = _offset_maxima(sv)
        else:
            spectral, method, argmax = product, "product_bound", None
            sigma, fro_sup, nuc_sup = f, fro, float(np.sum(env))
            stable_sup = float(np.count_nonzero(f > 0))
        n21_bound = min(s1a * colsum_k[g], math.sqrt(n) * fro)
        if exact_norm_2_1 and kk and layout.offset_invariant:
            n21, n21_method = _sup_norm_2_1(r_q[h], k[g], layout, offsets), "exact_over_offsets"
        else:
            n21, n21_method = n21_bound, "bound"
        n11_bound = min(
            float(colsum_q[h]) * colsum_k[g], math.sqrt(n) * n21_bound, math.sqrt(n) * s1b * float(colsum_q[h])
        )
        out.append(
            RotaryHeadEnvelope(
                h,
                g,
                n,
                spectral,
                method,
                argmax,
                product,
                env,
                _rank_bound(f, tau0),
                n21,
                n21_method,
                n21_bound,
                n11_bound,
                sigma,
                fro_sup,
                nuc_sup,
                stable_sup,
            )
        )
    return out


def _sup_norm_2_1(r_a: np.ndarray, w_k: np.ndarray, layout: RotaryLayout, deltas: np.ndarray) -> float:
    """``max_delta sum_j ||R_a M(delta) W_K[:, j]||`` (column ``j`` of ``X`` is ``Q_a R_a M w_j``)."""
    k_a, d = r_a.shape
    n = w_k.shape[1]
    best = 0.0
    for part in _chunks(deltas, k_a * max(d, n)):
        cols = (_rotated_r(r_a, layout, part).reshape(-1, d) @ w_k).reshape(len(part), k_a, n)
        best = max(best, float(np.sqrt(np.einsum("kij,kij->kj", cols, cols)).sum(axis=1).max()))
    return best


def doubled_layout(layout: RotaryLayout, d_head: int) -> tuple[RotaryLayout, np.ndarray]:
    """``(layout2, order)``: ``diag(M(delta), M(delta))``, the rotation of a ``2 d_h``-row stacked factor
    ``[X; Y]`` (each ``d_h`` rows rotated by ``M(delta)``), as one layout's ``M2(delta)`` after a permutation
    of the rows: ``[X; Y][order]`` rotates by ``M2`` exactly as ``[X; Y]`` by ``diag(M, M)`` (docs/rotary.md;
    the ``W - W0`` of a rotary head, :func:`~.distance.rotary_difference_spectra`).

    ``layout2`` rotates ``2 rot`` dimensions with the same pairing and the frequencies twice, ``(theta,
    theta)``: the permuted rows are ``[X_rot, Y_rot, X_rest, Y_rest]`` for interleaved pairs, and ``[X_lo,
    Y_lo, X_hi, Y_hi, X_rest, Y_rest]`` (``lo``, ``hi`` the two halves of the rotated dimensions) for half
    pairs, so that pair ``i`` of ``layout2`` joins the dimensions pair ``i mod rot/2`` of ``layout`` joins, in
    ``X`` for ``i < rot/2`` and in ``Y`` after (with several position axes, the pairs' axes twice too)."""
    layout.check_head_dim(d_head)
    rot, half = layout.rotary_dim, layout.rotary_dim // 2
    x, y = np.arange(d_head), d_head + np.arange(d_head)
    rest = [x[rot:], y[rot:]]
    if layout.pairing == "half":
        order = np.concatenate([x[:half], y[:half], x[half:rot], y[half:rot], *rest])
    else:
        order = np.concatenate([x[:rot], y[:rot], *rest])
    thetas = np.concatenate([layout.thetas, layout.thetas])
    axes = None if layout.axes is None else tuple(layout.axes) * 2
    return replace(
        layout, rotary_dim=2 * rot, inv_freq=tuple(float(t) for t in thetas), attention_factor=1.0, axes=axes
    ), order
