"""Spectra of ``W - W0``: the matrices measured from initial weights ``W0``.

A per-head difference stays a thin product (docs/spec.md section 1): with head factors ``A, B`` and their
initial values ``A0, B0`` (each ``d x N``),

    A.T B - A0.T B0 = (A - A0).T B + A0.T (B - B0) = [A - A0; A0].T [B; B - B0],

a product of two ``2d x N`` factors, rank at most ``2d``.  The factors carry the differences
``A - A0`` and ``B - B0`` themselves, not ``A`` and ``-A0``: equal weights give exactly zero blocks,
so ``W = W0`` has exactly the zero spectrum (every product in the core is ``0 * x``), and close
weights lose no digits to cancellation (``[A; -A0].T [B; B0]`` subtracts two products of size
``|W|`` in the core's round-off, ``~1e-16 |W|``, which ``alpha`` then multiplies).  Its spectrum and column norms come from
the ``2d x 2d`` core exactly as for ``A.T B`` (:func:`~specbound.compute.spectra.factored_spectra` on the
factors stacked along ``d``).  Feed-forward differences are dense, and so is a QK-norm head's: its row is
the stacked raw factors ``Z_h = [W_Q^h; W_K^g]`` (docs/theory.md 3d), so ``Z_h - Z0_h`` is the stacked
factors' differences, ``2 d_h x N``.
"""

from __future__ import annotations

import numpy as np

from ..archs.model import LayerWeights
from ..options import KernelOptions
from .layer_spectra import LayerSpectra
from .qk_logit import qk_norm_factors
from .spectra import dense_spectrum, factored_spectra


def stacked_difference(a: np.ndarray, b: np.ndarray, a0: np.ndarray, b0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Factors ``([A - A0; A0], [B; B - B0])`` of ``A.T B - A0.T B0``, each (H, 2d, N).

    Exact for equal weights (both products vanish term by term) and free of cancellation for
    close ones: the difference is formed on the factors, entry by entry, before any product.
    """
    return np.concatenate([a - a0, a0], axis=1), np.concatenate([b, b - b0], axis=1)


def difference_spectra(weights: LayerWeights, init: LayerWeights, kernel: KernelOptions, *, group: int = 1,
                       with_norm_1_1: bool = True, block: str = "sequential") -> LayerSpectra:
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
        spectra["qk"] = [dense_spectrum(z - z0) for z, z0 in zip(qk_norm_factors(weights.q, weights.k, kv),
                                                                 qk_norm_factors(init.q, init.k, kv))]
    for role, (a, b, a0, b0) in pairs.items():
        if kernel.method == "dense":
            spectra[role] = [dense_spectrum(a[h].T @ b[h] - a0[h].T @ b0[h]) for h in range(a.shape[0])]
        else:
            spectra[role] = factored_spectra(*stacked_difference(a, b, a0, b0), with_norm_1_1=with_norm_1_1)
    ff = {role: dense_spectrum(w - init.ff[role]) for role, w in weights.ff.items()}
    return LayerSpectra(weights.layer, spectra["qk"], spectra["ov"], ff, block, cross_qk=spectra.get("cross_qk"),
                        cross_ov=spectra.get("cross_ov"))
