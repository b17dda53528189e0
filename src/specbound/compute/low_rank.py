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


def _scaled(update: HeadUpdate | None, scale: np.ndarray | None) -> HeadUpdate | None:
    """``update`` with each head's rows scaled as the logit's factors are (``scale`` ``(H, d_h)``)."""
    if update is None or scale is None:
        return update
    return HeadUpdate(update.u * scale[:, :, None], update.v)


def pair_difference(a: np.ndarray, b: np.ndarray, a0: np.ndarray, ua: HeadUpdate | None, ub: HeadUpdate | None,
                    *, with_norm_1_1: bool = True) -> list[MatrixSpectrum]:
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
    return factored_spectra(np.ascontiguousarray(np.concatenate(left, axis=1)),
                            np.ascontiguousarray(np.concatenate(right, axis=1)), with_norm_1_1=with_norm_1_1)


def update_difference_spectra(weights: LayerWeights, init: LayerWeights, updates: LayerUpdates, *, group: int = 1,
                              block: str = "sequential", attention_factor: float = 1.0,
                              with_norm_1_1: bool = True) -> LayerSpectra | None:
    """The spectra :func:`~.distance.difference_spectra` gives for one layer's ``W - W0``, from the
    updates' factors (``weights``, ``init``: the raw weights, read as the pipeline reads them; their
    feed-forward matrices are never read).  None when the logit's query/key norm gains differ between
    the two (the QK update is then not of this form): the caller falls back to the weights."""
    if (weights.qk_norm is None) != (init.qk_norm is None) or (weights.qk_norm is not None and not (
            np.array_equal(weights.qk_norm.q_gain, init.qk_norm.q_gain)
            and np.array_equal(weights.qk_norm.k_gain, init.qk_norm.k_gain))):
        return None
    logit, logit0 = logit_factors(weights, attention_factor), logit_factors(init, attention_factor)
    norm = weights.qk_norm
    q_scale = None if norm is None and attention_factor == 1.0 else \
        (np.ones_like(weights.q[:, :, 0]) if norm is None else norm.q_gain) * attention_factor
    k_scale = None if norm is None and attention_factor == 1.0 else \
        (np.ones_like(weights.k[:, :, 0]) if norm is None else norm.k_gain) * attention_factor
    heads = updates.heads

    def repeated(update: HeadUpdate | None) -> HeadUpdate | None:
        return None if update is None else update.repeated(group)

    k, k0 = (np.repeat(w.k, group, axis=0) for w in (logit, logit0))
    v, v0 = (np.repeat(w.v, group, axis=0) for w in (logit, logit0))
    qk = pair_difference(logit.q, k, logit0.q, _scaled(heads["q"], q_scale), repeated(_scaled(heads["k"], k_scale)),
                         with_norm_1_1=with_norm_1_1)
    ov = pair_difference(v, weights.o, v0, repeated(heads["v"]), heads["o"], with_norm_1_1=with_norm_1_1)
    cross = {}
    if weights.cross is not None:
        c, c0 = weights.cross, init.cross
        cross["cross_qk"] = pair_difference(c.q, c.k, c0.q, heads["cross_q"], heads["cross_k"],
                                            with_norm_1_1=with_norm_1_1)
        cross["cross_ov"] = pair_difference(c.v, c.o, c0.v, heads["cross_v"], heads["cross_o"],
                                            with_norm_1_1=with_norm_1_1)
    ff = {role: zero_spectrum(updates.ff_shapes[role]) if f is None else low_rank_spectrum(*f)
          for role, f in updates.ff.items()}
    return LayerSpectra(weights.layer, qk, ov, ff, block, **cross)
