"""Spectra of ``W - W0`` when the update is given as factors (a LoRA adapter on its base,
:mod:`specbound.archs.low_rank`), never multiplied out (docs/theory.md section 3k).

* A feed-forward update ``L @ R`` (``L`` ``(m, r)``, ``R`` ``(r, n)``): with the thin QR factorisations
  ``L = Q_L R_L`` and ``R^T = Q_R R_R``, ``L R = Q_L (R_L R_R^T) Q_R^T``, so its singular values are
  those of the ``r x r`` core ``R_L R_R^T`` (the Frobenius, nuclear and spectral norms with them);
  column ``j`` of ``L R`` is ``Q_L (R_L R[:, j])``, so its norm is ``||R_L R[:, j]||`` (the
  (2,1)-norm from an ``r x n`` product); the (1,1)-norm needs the entries and streams ``L R`` in
  tiles, as a head's product does (:func:`~.spectra.factored_spectra`).
* A head's QK (or OV) update: with ``A = A0 + u_a v_a`` and ``B = B0 + u_b v_b`` (per head; ``u``
  ``(d_h, r)``, ``v`` ``(r, N)``),

      A^T B - A0^T B0 = (u_a v_a)^T B + A0^T u_b v_b = [v_a; u_b^T A0]^T [u_a^T B; v_b],

      a product of two ``(r_a + r_b) x N`` factors (one block when only one side is adapted), whose
  spectrum and norms :func:`~.spectra.factored_spectra` computes from its core.  Every block is made
  from the update's own factors: equal weights give no term at all, and nothing cancels.
* A QK-norm head's row is its stacked raw factors ``Z_h = [W_Q^h; W_K^g]`` (docs/theory.md 3d), so
  ``(Z_h - Z0_h)^T = [v_q; v_k]^T diag(u_q, u_k)^T``: a low-rank ``(N, 2 d_h)`` product of rank at most
  ``r_q + r_k``.
"""

from __future__ import annotations

import numpy as np

from ..archs.model import HeadUpdate, LayerUpdates, LayerWeights
from .layer_spectra import LayerSpectra
from .qk_logit import logit_factors
from .spectra import MatrixSpectrum, factored_spectra


def low_rank_spectrum(left: np.ndarray, right: np.ndarray, *, with_norm_1_1: bool = True) -> MatrixSpectrum:
    """Spectrum and norms of the ``(m, n)`` matrix ``left @ right`` (``left`` ``(m, r)``, ``right``
    ``(r, n)``) from its ``r x r`` core: a head's factored product ``A^T B`` with ``A = left^T``,
    ``B = right`` (:func:`~.spectra.factored_spectra`); the product is never held whole (the
    (1,1)-norm streams it in tiles)."""
    return factored_spectra(np.ascontiguousarray(left.T)[None], right[None], with_norm_1_1=with_norm_1_1)[0]


def zero_spectrum(shape: tuple[int, int]) -> MatrixSpectrum:
    """The spectrum of an unchanged matrix's ``W - W0 = 0``."""
    return MatrixSpectrum((int(shape[0]), int(shape[1])), np.zeros(min(shape)), 0.0, 0.0, sv_method="core")


def pair_difference(
    a: np.ndarray,
    b: np.ndarray,
    a0: np.ndarray,
    ua: HeadUpdate | None,
    ub: HeadUpdate | None,
    *,
    with_norm_1_1: bool = True,
) -> list[MatrixSpectrum]:
    """Spectra of ``A^T B - A0^T B0`` per head from the updates ``A - A0 = u_a v_a``, ``B - B0 = u_b v_b``
    (``a`` unused but for its shape; ``b`` the updated ``B``, ``a0`` the initial ``A``; each (H, d, N))."""
    heads, _, n = a.shape
    if ua is None and ub is None:
        return [zero_spectrum((n, n)) for _ in range(heads)]
    left, right = [], []
    if ua is not None:
        left.append(ua.v)
        right.append(np.swapaxes(ua.u, 1, 2) @ b)
    if ub is not None:
        left.append(np.swapaxes(ub.u, 1, 2) @ a0)
        right.append(ub.v)
    return factored_spectra(
        np.ascontiguousarray(np.concatenate(left, axis=1)),
        np.ascontiguousarray(np.concatenate(right, axis=1)),
        with_norm_1_1=with_norm_1_1,
    )


def stacked_difference(
    q: np.ndarray, uq: HeadUpdate | None, uk: HeadUpdate | None, *, with_norm_1_1: bool = True
) -> list[MatrixSpectrum]:
    """Spectra of each QK-norm head's ``(Z_h - Z0_h)^T = [v_q; v_k]^T diag(u_q, u_k)^T`` (``N x 2 d_h``) from
    the updates of its query and (already repeated per query head) key factors; ``q`` (H, d, N) for the
    shapes.  A side without an update is a zero block."""
    heads, d, n = q.shape
    if uq is None and uk is None:
        return [zero_spectrum((n, 2 * d)) for _ in range(heads)]
    out = []
    for h in range(heads):
        left, right = [], []
        for side, update in enumerate((uq, uk)):
            if update is None:
                continue
            block = np.zeros((update.u.shape[2], 2 * d))
            block[:, side * d : (side + 1) * d] = update.u[h].T
            left.append(update.v[h].T)
            right.append(block)
        out.append(
            low_rank_spectrum(np.concatenate(left, axis=1), np.concatenate(right, axis=0), with_norm_1_1=with_norm_1_1)
        )
    return out


def update_difference_spectra(
    weights: LayerWeights,
    init: LayerWeights,
    updates: LayerUpdates,
    *,
    group: int = 1,
    block: str = "sequential",
    attention_factor: float = 1.0,
    with_norm_1_1: bool = True,
) -> LayerSpectra:
    """The spectra :func:`~.distance.difference_spectra` gives for one layer's ``W - W0``, from the
    updates' factors (``weights``, ``init``: the raw weights, read as the pipeline reads them; their
    feed-forward matrices are never read)."""
    logit, logit0 = logit_factors(weights, attention_factor), logit_factors(init, attention_factor)
    heads = updates.heads

    def repeated(update: HeadUpdate | None) -> HeadUpdate | None:
        return None if update is None else update.repeated(group)

    def scaled(update: HeadUpdate | None) -> HeadUpdate | None:  # the attention factor, as logit_factors folds it
        return update if logit is weights or update is None else HeadUpdate(update.u * attention_factor, update.v)

    k, k0 = (np.repeat(w.k, group, axis=0) for w in (logit, logit0))
    v, v0 = (np.repeat(w.v, group, axis=0) for w in (logit, logit0))
    if weights.qk_norm is not None:  # the stacked raw factors (docs/theory.md 3d)
        qk = stacked_difference(weights.q, heads["q"], repeated(heads["k"]), with_norm_1_1=with_norm_1_1)
    else:
        qk = pair_difference(
            logit.q, k, logit0.q, scaled(heads["q"]), repeated(scaled(heads["k"])), with_norm_1_1=with_norm_1_1
        )
    ov = pair_difference(v, weights.o, v0, repeated(heads["v"]), heads["o"], with_norm_1_1=with_norm_1_1)
    cross = {}
    if weights.cross is not None:
        c, c0 = weights.cross, init.cross
        cross["cross_qk"] = pair_difference(
            c.q, c.k, c0.q, heads["cross_q"], heads["cross_k"], with_norm_1_1=with_norm_1_1
        )
        cross["cross_ov"] = pair_difference(
            c.v, c.o, c0.v, heads["cross_v"], heads["cross_o"], with_norm_1_1=with_norm_1_1
        )
    ff = {
        role: zero_spectrum(updates.ff_shapes[role]) if f is None else low_rank_spectrum(*f)
        for role, f in updates.ff.items()
    }
    return LayerSpectra(weights.layer, qk, ov, ff, block, **cross)
