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

:func:`rotary_qk_envelope` reports, for every query head, quantities that bound the corresponding
quantity of ``W_Q^T M(delta) W_K`` at *every* offset ``|delta| <= P - 1`` (most of them at every
orthogonal matrix in place of ``M(delta)``).  The rotation-blind quantities of ``W_Q^T W_K``
(``delta = 0``) are computed elsewhere (``spectra.factored_spectra``) and not repeated here.

Everything is float64.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
# At import time, not inside the QR helper: threadpoolctl limits only the BLAS libraries already
# loaded when it is entered, and an unlimited second OpenBLAS (SciPy's) spinning against another
# process made one 4096 x 128 QR take 1.2 s instead of 7 ms on this 2-core machine.
from scipy.linalg import lapack

PAIRINGS = ("half", "interleaved")

# Default budget of d_h x d_h core SVDs for the exact spectral norm over all offsets.  Measured
# (numpy 2.4 / OpenBLAS, threadpoolctl at one thread, this repository's 2-core machine, N = 4096):
# the exact path costs 0.85 ms per 128 x 128 core (forming the core included; the batched SVD is
# 0.6 ms of it) and 0.18 ms per 64 x 64 core, so 4096 cores take ~3.5 s at d_h = 128 and ~0.75 s at
# d_h = 64.  A LLaMA-7B layer (32 heads x 8191 offsets = 262 112 cores, ~4 min exact) is over
# budget and gets the product bound: 0.41 s for the whole layer (0.26 s with 8 kv heads), nearly
# all of it the 4096 x 128 QR factorisations.
DEFAULT_MAX_CORE_SVDS = 4096
# Entries of the per-chunk stacks (rotated R factors, cores): 2^21 float64 = 16 MB each.
_CHUNK_ENTRIES = 1 << 21
# rope types that only change the set of angles (the "for every orthogonal R" bounds stay valid).
_ANGLE_ONLY_SCALINGS = ("linear", "dynamic", "llama3")
# model_type values whose HF implementation uses rotary embeddings even when the config carries no
# rotary key (older configs relied on the default base 10000).
_ROTARY_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi", "phi3", "gpt_neox", "gpt_neox_japanese", "gptj", "codegen", "stablelm",
    "olmo", "olmo2", "persimmon", "starcoder2", "cohere", "internlm", "internlm2", "falcon",
    "granite", "nemotron", "smollm3",
})
_INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "codegen"})


@dataclass(frozen=True)
class RotaryLayout:
    """Where and how fast a head's dimensions rotate.

    Attributes
    ----------
    rotary_dim : int
        Number of rotated dimensions ``rot`` (even, ``<= d_h``); the first ``rot`` dimensions of each
        head rotate, dimensions ``rot .. d_h - 1`` are left as they are (GPT-NeoX, GPT-J, Phi).
    pairing : {"half", "interleaved"}
        ``"half"``: dimensions ``i`` and ``i + rot/2`` form pair ``i`` (HF ``rotate_half``: LLaMA,
        Mistral, Qwen2, GPT-NeoX).  ``"interleaved"``: dimensions ``2i`` and ``2i + 1`` (GPT-J,
        llama.cpp's original layout).
    base : float
        ``rope_theta``; pair ``i`` turns by ``theta_i = base^(-2i/rot)`` per position.
    max_positions : int
        ``P``; offsets ``delta = t - s`` range over ``[-(P - 1), P - 1]``.
    scaling : str or None
        The config's ``rope_scaling`` / ``rope_parameters`` type when it is not the default
        (recorded only: the angles it produces are not modelled, so the exact-over-offsets path is
        switched off and only the bounds valid for every rotation are reported).
    """

    rotary_dim: int
    pairing: str
    base: float
    max_positions: int
    scaling: str | None = None

    def __post_init__(self):
        rot, p = self.rotary_dim, self.max_positions
        if isinstance(rot, bool) or not isinstance(rot, (int, np.integer)) or rot <= 0 or rot % 2:
            raise ValueError(f"rotary_dim must be a positive even integer, got {rot!r}")
        if self.pairing not in PAIRINGS:
            raise ValueError(f"rotary pairing must be one of {PAIRINGS}, got {self.pairing!r}")
        if not isinstance(self.base, (int, float, np.floating, np.integer)) or isinstance(self.base, bool) \
                or not math.isfinite(self.base) or self.base <= 0:
            raise ValueError(f"rotary base (rope_theta) must be a finite positive number, got {self.base!r}")
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p <= 0:
            raise ValueError(f"max_positions must be a positive integer, got {p!r}")

    @property
    def thetas(self) -> np.ndarray:
        """Angular frequencies ``theta_i = base^(-2i/rot)``, shape ``(rot/2,)``."""
        return float(self.base) ** (-np.arange(0, self.rotary_dim, 2, dtype=np.float64) / self.rotary_dim)

    @property
    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Index arrays ``(u, v)``, each of shape ``(rot/2,)``: dimensions ``u[i], v[i]`` form pair ``i``."""
        half = self.rotary_dim // 2
        i = np.arange(half)
        return (i, i + half) if self.pairing == "half" else (2 * i, 2 * i + 1)

    @property
    def offsets(self) -> np.ndarray:
        """All relative offsets ``delta = t - s``, ``-(P-1) .. P-1``, shape ``(2P - 1,)``."""
        return np.arange(-(self.max_positions - 1), self.max_positions)

    def check_head_dim(self, d_head: int) -> None:
        if self.rotary_dim > d_head:
            raise ValueError(f"rotary_dim {self.rotary_dim} exceeds the head dimension {d_head}")


def _first(config: dict, *keys):
    for key in keys:
        if config.get(key) is not None:
            return key, config[key]
    return None, None


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    return float(value)


def rotary_layout_from_config(config: dict, d_head: int, pairing: str | None = "half") -> RotaryLayout | None:
    """The rotary layout of a HF-style ``config.json`` dict, or None when the model has no rotary.

    Keys read: ``rope_theta`` / ``rotary_emb_base`` / ``rope_parameters["rope_theta"]`` (default
    10000); ``partial_rotary_factor`` / ``rotary_pct`` (fraction of ``d_head``, ``rot =
    int(d_head * f)`` as HF computes it) or ``rotary_dim`` (GPT-J, an absolute count);
    ``max_position_embeddings`` / ``n_positions``; ``head_dim`` (must equal ``d_head``);
    ``rope_scaling`` / ``rope_parameters["rope_type"]`` (recorded only).  A config is rotary when it
    has any rotary key, ``position_embedding_type == "rotary"``, or a ``model_type`` whose HF
    implementation is rotary (Falcon with ``alibi: true`` is not).

    Parameters
    ----------
    config : dict
        The parsed ``config.json`` (or ``PretrainedConfig.to_dict()``).
    d_head : int
        The head dimension ``d_h``.
    pairing : {"half", "interleaved"} or None
        Pair layout; None infers it from ``model_type`` (``gptj``/``codegen``: interleaved,
        otherwise half).  The default ``"half"`` is HF's ``rotate_half``.

    Returns
    -------
    RotaryLayout or None

    Raises
    ------
    ValueError
        One line naming the offending key for values that make no sense (non-positive base or
        positions, a fraction outside ``(0, 1]``, an odd or oversized rotary dimension, a
        ``head_dim`` that contradicts ``d_head``, an unknown pairing, no maximum position).
    """
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    if isinstance(d_head, bool) or not isinstance(d_head, (int, np.integer)) or d_head <= 0:
        raise ValueError(f"d_head must be a positive integer, got {d_head!r}")
    model_type = config.get("model_type")
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be a dict, got {params!r}")
    if params and "rope_theta" not in params and "rope_type" not in params \
            and all(isinstance(v, dict) for v in params.values()):
        raise ValueError("rope_parameters is given per layer type "
                         f"({sorted(params)}): pass the sub-dict of the layer's type merged into the config")
    params = params or {}
    scaling_cfg = config.get("rope_scaling")
    rotary_keys = ("rope_theta", "rotary_emb_base", "rotary_pct", "partial_rotary_factor", "rotary_dim")
    has_rotary = (bool(params) or scaling_cfg is not None or any(config.get(k) is not None for k in rotary_keys)
                  or config.get("position_embedding_type") == "rotary" or model_type in _ROTARY_MODEL_TYPES)
    if config.get("alibi") or config.get("position_embedding_type") in ("absolute", "alibi", "learned"):
        has_rotary = False
    if not has_rotary:
        return None

    if pairing is None:
        pairing = "interleaved" if model_type in _INTERLEAVED_MODEL_TYPES else "half"
    if pairing not in PAIRINGS:
        raise ValueError(f"rotary pairing must be one of {PAIRINGS}, got {pairing!r}")

    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != d_head:
        raise ValueError(f"config head_dim={head_dim!r} contradicts d_head={d_head}")

    key, base = _first(params, "rope_theta")
    if key is None:
        key, base = _first(config, "rope_theta", "rotary_emb_base")
    base = 10000.0 if key is None else _number(base, key)
    if not math.isfinite(base) or base <= 0:
        raise ValueError(f"{key} must be a finite positive number, got {base!r}")

    key, frac = _first(params, "partial_rotary_factor")
    if key is None:
        key, frac = _first(config, "partial_rotary_factor", "rotary_pct")
    explicit_dim = config.get("rotary_dim")
    if explicit_dim is not None:
        if isinstance(explicit_dim, bool) or not isinstance(explicit_dim, (int, np.integer)):
            raise ValueError(f"rotary_dim must be an integer, got {explicit_dim!r}")
        rot = int(explicit_dim)
        if key is not None and int(d_head * _number(frac, key)) != rot:
            raise ValueError(f"rotary_dim={rot} contradicts {key}={frac!r} with d_head={d_head}")
    elif key is not None:
        f = _number(frac, key)
        if not 0 < f <= 1:
            raise ValueError(f"{key} must lie in (0, 1], got {frac!r}")
        rot = int(d_head * f)
    else:
        rot = int(d_head)
    if rot <= 0 or rot % 2 or rot > d_head:
        raise ValueError(f"rotary dimension {rot} (d_head={d_head}) must be positive, even and <= d_head")

    key, p = _first(config, "max_position_embeddings", "n_positions")
    if key is None:
        raise ValueError("rotary config has no max_position_embeddings (or n_positions)")
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p <= 0:
        raise ValueError(f"{key} must be a positive integer, got {p!r}")

    scaling = params.get("rope_type") or params.get("type")
    if scaling in (None, "default") and isinstance(scaling_cfg, dict):
        scaling = scaling_cfg.get("rope_type") or scaling_cfg.get("type")
    elif scaling in (None, "default") and scaling_cfg is not None:
        scaling = str(scaling_cfg)
    scaling = None if scaling in (None, "default") else str(scaling)
    return RotaryLayout(rot, pairing, base, int(p), scaling)


def rotations(layout: RotaryLayout, d_head: int, deltas) -> np.ndarray:
    """``M(delta)`` for every ``delta`` in ``deltas``, shape ``(k, d_head, d_head)``.

    ``M(delta)`` acts on row vectors as the model does at position ``delta``: ``q_rot = q @ M``
    gives ``q_rot[u] = q[u] cos - q[v] sin`` and ``q_rot[v] = q[v] cos + q[u] sin`` for each pair
    ``(u, v)`` and angle ``delta * theta_i`` (HF's ``q * cos + rotate_half(q) * sin``).  It is
    orthogonal, ``M(a) M(b) = M(a + b)`` and ``M(a)^T = M(-a)``; unrotated dimensions get 1 on the
    diagonal.  ``deltas`` may be any reals (positions divided by a scaling factor, say).
    """
    layout.check_head_dim(d_head)
    deltas = np.atleast_1d(np.asarray(deltas, dtype=np.float64))
    if deltas.ndim != 1:
        raise ValueError(f"deltas must be a scalar or a 1-d array, got shape {deltas.shape}")
    u, v = layout.pairs
    ang = deltas[:, None] * layout.thetas[None, :]
    c, s = np.cos(ang), np.sin(ang)
    out = np.zeros((deltas.size, d_head, d_head))
    idx = np.arange(layout.rotary_dim, d_head)
    out[:, idx, idx] = 1.0
    out[:, u, u] = c
    out[:, v, v] = c
    out[:, u, v] = s
    out[:, v, u] = -s
    return out


def rotation(layout: RotaryLayout, d_head: int, delta: float) -> np.ndarray:
    """``M(delta)``, shape ``(d_head, d_head)``; see :func:`rotations`."""
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
    ang = deltas[:, None] * layout.thetas[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    au, av = r_a[:, u][None], r_a[:, v][None]
    shape = (deltas.size,) + r_a.shape
    out = np.empty(shape) if out is None else out.reshape(-1)[:math.prod(shape)].reshape(shape)
    out[...] = r_a
    out[:, :, u] = c * au - s * av
    out[:, :, v] = s * au + c * av
    return out


def _chunks(deltas: np.ndarray, per_delta: int):
    step = max(1, _CHUNK_ENTRIES // max(per_delta, 1))
    for i in range(0, deltas.size, step):
        yield deltas[i:i + step]


def _core_singular_values(r_a, r_b, layout, deltas):
    """Singular values of ``R_a M(delta) R_b^T`` for each delta, shape ``(K, min(k_a, k_b))``."""
    k_a, d = r_a.shape
    k_b = r_b.shape[0]
    out = np.empty((deltas.size, min(k_a, k_b)))
    step = max(1, _CHUNK_ENTRIES // max(k_a * d, 1))
    rm_buf = np.empty(min(step, deltas.size) * k_a * d)
    core_buf = np.empty((min(step, deltas.size) * k_a, k_b))
    for i in range(0, deltas.size, step):
        part = deltas[i:i + step]
        rm = _rotated_r(r_a, layout, part, rm_buf)
        cores = np.matmul(rm.reshape(-1, d), r_b.T, out=core_buf[:part.size * k_a])
        out[i:i + part.size] = np.linalg.svd(cores.reshape(part.size, k_a, k_b), compute_uv=False)
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
    deltas : array_like of float, shape (K,)
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
    deltas = np.atleast_1d(np.asarray(deltas, dtype=np.float64))
    return _core_singular_values(_r_factor(q_h), _r_factor(k_g), layout, deltas)


@dataclass(frozen=True)
class RotaryHeadEnvelope:
    """Bounds for one query head that hold at every offset ``|delta| <= P - 1``.

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
        ``"exact_over_offsets"`` or ``"product_bound"``.
    argmax_offset : int or None
        An offset attaining ``spectral_sup`` when exact.
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
    """

    head: int
    kv_head: int
    n: int
    spectral_sup: float
    spectral_method: str
    argmax_offset: int | None
    spectral_bound: float
    envelope: np.ndarray
    rank_bound: int
    norm_2_1_sup: float
    norm_2_1_method: str
    norm_2_1_bound: float
    norm_1_1_bound: float

    @property
    def kept_envelope(self) -> np.ndarray:
        """``envelope[:rank_bound]``, shape ``(rank_bound,)``: the values whose powers bound the
        thresholded ``S_p`` of every ``X``.  Do not threshold these again (see docs/rotary.md)."""
        return self.envelope[:self.rank_bound]

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


def _rank_bound(s_a: np.ndarray, s_b: np.ndarray, tau0: float) -> int:
    """``#{i : f_i > tau0}`` with ``f_i = min_{j+l=i+1} s_j(A) s_l(B) >= s_i(A R B)`` for every
    orthogonal ``R`` (Weyl/Horn: ``s_{j+l-1}(XY) <= s_j(X) s_l(Y)``)."""
    k = min(s_a.size, s_b.size)
    for i in range(k):  # f is non-increasing: stop at the first index at or below tau0
        f_i = np.min(s_a[:i + 1] * s_b[i::-1])
        if not f_i > tau0:
            return i
    return k


def rotary_qk_envelope(q: np.ndarray, k: np.ndarray, kv_index, layout: RotaryLayout, *,
                       rank_tol: float = 1e-10, max_core_svds: int = DEFAULT_MAX_CORE_SVDS,
                       exact_norm_2_1: bool = False) -> list[RotaryHeadEnvelope]:
    """Per query head, bounds on the rotary QK matrices ``W_Q^T M(delta) W_K`` over all offsets.

    Parameters
    ----------
    q : ndarray, shape (H, d_h, N)
        ``W_Q^h`` per query head, float64.
    k : ndarray, shape (H_kv, d_h, N)
        ``W_K^g`` per key head.
    kv_index : array_like of int, shape (H,), or None
        Key head of each query head (grouped-query attention: ``h // (H / H_kv)``); None: ``h``.
    layout : RotaryLayout
    rank_tol : float
        The project's rank tolerance: ``tau = rank_tol * N * max(s_1, 1)`` for an ``N x N`` matrix.
    max_core_svds : int
        Budget of ``d_h x d_h`` core SVDs.  When ``H * (2P - 1)`` fits (and the layout has no rope
        scaling), ``spectral_sup`` is the exact maximum over all offsets; otherwise it is the
        product bound.  The default (4096) keeps the exact path near 3.5 s at ``d_h = 128`` (one
        thread; see ``DEFAULT_MAX_CORE_SVDS``).
    exact_norm_2_1 : bool
        Also compute ``max_delta ||X(delta)||_{2,1}`` exactly (``O(H P N d_h^2)`` work, not gated
        by the budget; ignored, i.e. the bound is reported, when the layout has a rope scaling).

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
    if layout.scaling is not None and layout.scaling not in _ANGLE_ONLY_SCALINGS:
        warnings.warn(f"rope type {layout.scaling!r} may scale cos/sin by an attention factor a; "
                      "the logit matrix is then a^2 W_Q^T R W_K and these bounds omit a^2", stacklevel=2)

    r_q = [_r_factor(w) for w in q]
    used_kv = sorted(set(kv_index.tolist()))
    r_k = {g: _r_factor(k[g]) for g in used_kv}
    s_q = [np.linalg.svd(r, compute_uv=False) for r in r_q]
    s_k = {g: np.linalg.svd(r_k[g], compute_uv=False) for g in used_kv}
    colsum_q = np.sqrt(np.einsum("hij,hij->hj", q, q)).sum(axis=1)
    colsum_k = {g: float(np.sqrt(np.einsum("ij,ij->j", k[g], k[g])).sum()) for g in used_kv}

    # the offsets are allocated only when the exact path is affordable (P may be huge)
    exact = layout.scaling is None and heads * (2 * layout.max_positions - 1) <= max_core_svds
    offsets = layout.offsets.astype(np.float64) if exact or exact_norm_2_1 else np.zeros(0)
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
        if exact and kk:
            top = _core_singular_values(r_q[h], r_k[g], layout, offsets)[:, 0]
            j = int(np.argmax(top))
            spectral, method, argmax = float(top[j]), "exact_over_offsets", int(offsets[j])
        else:
            spectral, method, argmax = product, "product_bound", None
        fro = float(np.sqrt(np.sum(env**2)))
        n21_bound = min(s1a * colsum_k[g], math.sqrt(n) * fro)
        if exact_norm_2_1 and kk and layout.scaling is None:
            n21, n21_method = _sup_norm_2_1(r_q[h], k[g], layout, offsets), "exact_over_offsets"
        else:
            n21, n21_method = n21_bound, "bound"
        n11_bound = min(float(colsum_q[h]) * colsum_k[g], math.sqrt(n) * n21_bound,
                        math.sqrt(n) * s1b * float(colsum_q[h]))
        out.append(RotaryHeadEnvelope(h, g, n, spectral, method, argmax, product, env,
                                      _rank_bound(sa, sb, tau0), n21, n21_method, n21_bound, n11_bound))
    return out


def _sup_norm_2_1(r_a: np.ndarray, w_k: np.ndarray, layout: RotaryLayout, deltas: np.ndarray) -> float:
    """``max_delta sum_j ||R_a M(delta) W_K[:, j]||`` (column ``j`` of ``X`` is ``Q_a R_a M w_j``)."""
    k_a, d = r_a.shape
    n = w_k.shape[1]
    best = 0.0
    for part in _chunks(deltas, k_a * max(d, n)):
        cols = (_rotated_r(r_a, layout, part).reshape(-1, d) @ w_k).reshape(part.size, k_a, n)
        best = max(best, float(np.sqrt(np.einsum("kij,kij->kj", cols, cols)).sum(axis=1).max()))
    return best
