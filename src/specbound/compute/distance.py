"""Spectra of ``W - W0``: the matrices measured from initial weights ``W0``.

A per-head difference stays a thin product (docs/spec.md section 1): with head factors ``A, B`` and their
initial values ``A0, B0`` (each ``d x N``),

    A.T B - A0.T B0 = (A - A0).T B + A0.T (B - B0) = [A - A0; A0].T [B; B - B0],

a product of two ``2d x N`` factors, rank at most ``2d``.  The factors carry the differences
``A - A0`` and ``B - B0`` themselves, not ``A`` and ``-A0``: equal weights give exactly zero blocks,
so ``W = W0`` has exactly the zero spectrum (every product in the core is ``0 * x``), and close
weights lose no digits to cancellation (``[A; -A0].T [B; B0]`` subtracts two products of size
``|W|`` in the core's round-off, ``~1e-16 |W|``, which ``alpha`` then multiplies).  Its spectrum and column norms come
from the ``2d x 2d`` core exactly as for ``A.T B`` (:func:`~specbound.compute.spectra.factored_spectra` on the
factors stacked along ``d``).  Feed-forward differences are dense, and so is a QK-norm head's: its row is
the stacked raw factors ``Z_h = [W_Q^h; W_K^g]`` (docs/theory.md 3d), so ``Z_h - Z0_h`` is the stacked
factors' differences, ``2 d_h x N``.

A rotary head's difference at offset ``delta`` is ``A^T M B - A0^T M B0 = [A - A0; A0]^T diag(M, M) [B; B -
B0]``: the same stacked factors with the rotation acting on each ``d_h`` block, which
:func:`rotary_difference_spectra` bounds at every offset as the model's own QK quantities are (docs/rotary.md).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..archs.model import LayerWeights, RotaryLayout
from ..options import KernelOptions
from .layer_spectra import LayerSpectra, rotary_qk_spectra
from .qk_logit import qk_norm_factors
from .rotary import doubled_layout
from .spectra import RotaryQKSpectrum, dense_spectrum, factored_spectra


def stacked_difference(a: np.ndarray, b: np.ndarray, a0: np.ndarray, b0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Factors ``([A - A0; A0], [B; B - B0])`` of ``A.T B - A0.T B0``, each (H, 2d, N).

    Exact for equal weights (both products vanish term by term) and free of cancellation for
    close ones: the difference is formed on the factors, entry by entry, before any product.
    """
    return np.concatenate([a - a0, a0], axis=1), np.concatenate([b, b - b0], axis=1)


def difference_spectra(
    weights: LayerWeights,
    init: LayerWeights,
    kernel: KernelOptions,
    *,
    group: int = 1,
    with_norm_1_1: bool = True,
    block: str = "sequential",
) -> LayerSpectra:
    """Spectra of one layer's ``W - W0`` for every QK/OV head and feed-forward matrix.

    ``group`` is the number of query heads per key/value head; ``kernel.method="dense"``
    materialises the ``N x N`` differences (the slow reference).  Differences are computed in NumPy
    with LAPACK's SVD (:data:`~specbound.options.EXACT_SVD`; ``kernel.gram_rtol`` and
    ``kernel.device`` do not apply).
    """
    k, k0 = (np.repeat(w.k, group, axis=0) for w in (weights, init))
    v, v0 = (np.repeat(w.v, group, axis=0) for w in (weights, init))
    pairs = {"qk": (weights.q, k, init.q, k0), "ov": (v, weights.o, v0, init.o)}
    if weights.cross is not None:  # a decoder layer's cross-attention (one key/value head per query head)
        pairs["cross_qk"] = (weights.cross.q, weights.cross.k, init.cross.q, init.cross.k)
        pairs["cross_ov"] = (weights.cross.v, weights.cross.o, init.cross.v, init.cross.o)
    spectra = {}
    if weights.qk_norm is not None:  # the stacked raw factors' differences (docs/theory.md 3d)
        kv = np.arange(weights.q.shape[0]) // group
        del pairs["qk"]
        spectra["qk"] = [
            dense_spectrum(z - z0)
            for z, z0 in zip(qk_norm_factors(weights.q, weights.k, kv), qk_norm_factors(init.q, init.k, kv))
        ]
    for role, (a, b, a0, b0) in pairs.items():
        if kernel.method == "dense":
            spectra[role] = [dense_spectrum(a[h].T @ b[h] - a0[h].T @ b0[h]) for h in range(a.shape[0])]
        else:
            spectra[role] = factored_spectra(*stacked_difference(a, b, a0, b0), with_norm_1_1=with_norm_1_1)
    ff = {role: dense_spectrum(w - init.ff[role]) for role, w in weights.ff.items()}
    return LayerSpectra(
        weights.layer,
        spectra["qk"],
        spectra["ov"],
        ff,
        block,
        cross_qk=spectra.get("cross_qk"),
        cross_ov=spectra.get("cross_ov"),
    )


def rotary_difference_spectra(
    weights: LayerWeights,
    init: LayerWeights,
    layout: RotaryLayout,
    *,
    group: int = 1,
    rank_tol: float,
    updates: dict | None = None,
) -> list[RotaryQKSpectrum]:
    """Per query head, the QK quantities of ``A^T M(delta) B - A0^T M(delta) B0`` valid at every offset
    ``|delta| < max_positions`` (docs/theory.md 3k, docs/rotary.md): ``A = W_Q^h``, ``B = W_K^g`` the logit's
    factors (``weights``, the attention factor folded in; ``init`` the initial ones), ``A - A0`` and ``B - B0``
    their differences, or, with ``updates`` (a LoRA adapter's ``HeadUpdate`` of ``q`` and ``k``, per key
    head), ``u v`` of the update's own factors (times the attention factor, as the logit folds it).

    The difference is ``F^T diag(M, M) G`` with ``F = [A - A0; A0]``, ``G = [B; B - B0]``; with their rows
    permuted it is ``F'^T M2(delta) G'`` for the doubled layout (:func:`~.rotary.doubled_layout`), and
    :func:`~.layer_spectra.rotary_qk_spectra` gives its maxima over offsets or the bounds valid for every
    rotation, tightened by the rank of the difference (:func:`difference_rank_caps`) and by the (2,1)- and
    (1,1)-norms of its two terms ``dA^T M B + A0^T M dB`` (``||A^T M b_j|| <= ||A||_2 ||b_j||``, ``|a_i^T M b_j| <=
    ||a_i|| ||b_j||``), which vanish with the differences.  Shapes: ``q`` ``(H, d_h, N)``, ``k`` ``(H_kv, d_h, N)``."""
    a, b = weights.q, np.repeat(weights.k, group, axis=0)
    if updates is None:
        da, db = a - init.q, b - np.repeat(init.k, group, axis=0)
    else:  # the factors' own updates, never the merged weights' difference; a as logit_factors folds it
        da, db = (
            np.zeros_like(w) if u is None else layout.attention_factor * (u.u @ u.v)
            for u, w in ((updates["q"], a), (updates["k"], weights.k))
        )
        db = np.repeat(db, group, axis=0)
    heads, d, _ = a.shape
    layout2, order = doubled_layout(layout, d)
    f = np.concatenate([da, a - da], axis=1)[:, order]
    g = np.concatenate([b, db], axis=1)[:, order]
    spectra = rotary_qk_spectra(
        LayerWeights(weights.layer, f, g, g, f, {}), np.arange(heads), layout2, rank_tol=rank_tol
    )
    caps = difference_rank_caps(a - da, b, da, db, rank_tol)
    # the two terms' norms: column j of A^T M B is A^T M b_j, entry (i, j) is a_i^T M b_j (vanish with dA, dB)
    cols = lambda w: np.linalg.norm(w, axis=1).sum(axis=1)  # noqa: E731  sum of the N column norms of (H, d, N)
    spec = lambda w: np.linalg.norm(w, ord=2, axis=(1, 2))  # noqa: E731
    n21 = spec(da) * cols(b) + spec(a - da) * cols(db)
    n11 = cols(da) * cols(b) + cols(a - da) * cols(db)
    return [
        replace(
            s,
            norm_2_1=min(s.norm_2_1, float(x21)),
            norm_1_1=min(s.norm_1_1, float(x11)),
            **(
                {}
                if s.kept.size <= cap
                else dict(
                    kept=s.kept[:cap],
                    stable_rank_sup=min(s.stable_rank_sup, float(cap)),
                    frobenius_sup=min(s.frobenius_sup, float(np.sqrt(np.sum(s.kept[:cap] ** 2)))),
                    nuclear_sup=min(s.nuclear_sup, float(np.sum(s.kept[:cap]))),
                )
            ),
        )
        for s, cap, x21, x11 in zip(spectra, caps, n21, n11)
    ]


def difference_rank_caps(a0: np.ndarray, b: np.ndarray, da: np.ndarray, db: np.ndarray, rank_tol: float) -> list[int]:
    """Per head, ``r_A + r_B``: a bound on the numerical rank of ``X(delta) - X0(delta) = dA^T M B + A0^T M dB``
    at every offset (each ``(H, d_h, N)``).  Truncating ``dA`` after ``r_A`` singular values leaves ``E`` with
    ``||E||_2 <= s_(r_A + 1)(dA) ||B||_2 + ||A0||_2 s_(r_B + 1)(dB)``; with each term at most ``rank_tol N / 2``
    (``r_A``, ``r_B`` the least such), every singular value of the difference past ``r_A + r_B`` is at most
    ``rank_tol N``, below the rank tolerance (Weyl).  The Horn envelope's weak log-majorisation then bounds
    ``S_p`` and the Frobenius and nuclear norms by its first ``r_A + r_B`` values (docs/theory.md 3c).
    An adapter's ``dA = u v`` gives at most its rank ``r``."""
    n = a0.shape[2]
    half = rank_tol * n / 2

    def least(delta, other):
        s = np.linalg.svd(delta, compute_uv=False)  # (H, d)
        norm = np.linalg.norm(other, ord=2, axis=(1, 2))
        tail = np.concatenate([s, np.zeros((s.shape[0], 1))], axis=1) * norm[:, None]  # s_(r+1) ||other||, r = 0..d
        return np.argmax(tail <= half, axis=1)

    return [int(x) for x in least(da, b) + least(db, a0)]
