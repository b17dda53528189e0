"""One layer's spectra: every per-head QK/OV matrix and every feed-forward matrix (docs/spec.md 1-2).

The factored method gets QK/OV spectra from ``d_h x d_h`` cores; ``method="dense"`` materialises
every ``N x N`` per-head product and runs a full SVD, as the paper's reference code does (the
benchmark's baseline).  Feed-forward spectra come from the proven Gram path or LAPACK's SVD.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from ..archs.model import LayerWeights, RotaryLayout
from ..errors import SpecboundError
from ..options import EXACT_SVD, KernelOptions
from .latent import latent_spectra
from .propagation import LayerSpectralNorms
from .qk_logit import logit_factors, qk_norm_factors, qk_norm_lipschitz, qk_norm_sensitivity
from .rotary import DEFAULT_MAX_CORE_SVDS, rotary_qk_envelope
from .spectra import ROTARY_METHODS, MatrixSpectrum, RotaryQKSpectrum, dense_spectrum, factored_spectra


@dataclass(frozen=True)
class LayerSpectra:
    """Spectra of one layer's matrices: per query head for QK/OV, one per feed-forward role
    (``FF_in``/``FF_out``, or ``FF_gate``/``FF_up``/``FF_out``), and the block structure.

    With rotary position embeddings ``qk`` holds each head's quantities valid at every relative
    position (:func:`rotary_qk_spectra`) and ``qk_rotation_blind`` those of ``W_Q^T W_K``."""

    layer: int
    qk: list[MatrixSpectrum]
    ov: list[MatrixSpectrum]
    ff: dict[str, MatrixSpectrum]
    block: str = "sequential"
    qk_rotation_blind: list[MatrixSpectrum] | None = None  # rotary models: W_Q^T W_K as if unrotated
    position_terms: int = 0  # DeBERTa: disentangled position terms reusing each QK (docs/theory.md 3h)
    cross_qk: list[MatrixSpectrum] | None = None  # a decoder layer's cross-attention heads (encoder-decoders)
    cross_ov: list[MatrixSpectrum] | None = None
    # QK-norm layers: (H, H), how far head i's logits move per unit spectral change of head h's QK row
    # (its stacked factors; docs/theory.md 3d); None: 1 on the diagonal, a plain head's |x Delta y^T| <= ||Delta||
    qk_sensitivity: np.ndarray | None = None
    # multi-head latent attention (docs/theory.md 3l): per head the value path's largest output and how far
    # it moves per unit spectral change of the OV row; None: a plain head's c(OV) and 1
    ov_reach: np.ndarray | None = None
    ov_sensitivity: np.ndarray | None = None

    def norms(self, norm=None) -> LayerSpectralNorms:
        """The layer's factors for the propagation: ``norm(spectrum)`` of every matrix (default its
        :attr:`~.spectra.MatrixSpectrum.lipschitz_factor`: the spectral norm, or a QK-norm head's
        ``kappa_h``)."""
        value = (lambda s: s.lipschitz_factor) if norm is None else norm
        cross = (
            {}
            if self.cross_qk is None
            else {
                "cross_qk": np.array([value(s) for s in self.cross_qk]),
                "cross_ov": np.array([value(s) for s in self.cross_ov]),
            }
        )
        return LayerSpectralNorms(
            qk=np.array([value(s) for s in self.qk]),
            ov=np.array([value(s) for s in self.ov]),
            ff={role: value(s) for role, s in self.ff.items()},
            block=self.block,
            position_terms=self.position_terms,
            qk_sensitivity=self.qk_sensitivity,
            ov_reach=self.ov_reach,
            ov_sensitivity=self.ov_sensitivity,
            **cross,
        )

    def matrices(self) -> list[tuple[str, int | None, MatrixSpectrum]]:
        """``(role, head, spectrum)`` of every matrix in the order of the analysis' rows: QK heads, OV
        heads, cross-attention QK and OV heads (a decoder layer), feed-forward."""
        cross = (
            []
            if self.cross_qk is None
            else (
                [("QK_cross", h, s) for h, s in enumerate(self.cross_qk)]
                + [("OV_cross", h, s) for h, s in enumerate(self.cross_ov)]
            )
        )
        return (
            [("QK", h, s) for h, s in enumerate(self.qk)]
            + [("OV", h, s) for h, s in enumerate(self.ov)]
            + cross
            + [(role, None, s) for role, s in self.ff.items()]
        )


def attention_spectra(
    weights: LayerWeights, kernel: KernelOptions, *, group: int = 1, with_norm_1_1: bool = True
) -> tuple[list, list]:
    """Spectra of one layer's per-head QK and OV matrices.

    ``kernel.method="factored"`` uses the ``d_h x d_h`` cores (docs/spec.md section 1), on
    ``kernel.device``; ``"dense"`` materialises every ``N x N`` per-head product and runs a full SVD,
    as the paper's reference code does (the benchmark's baseline, always in NumPy).  ``group`` is the
    number of query heads per key/value head.
    """
    kv = np.arange(weights.q.shape[0]) // group  # query head h uses key/value head h // group
    if kernel.method == "factored":
        return (
            factored_spectra(weights.q, weights.k, kernel, b_index=kv, with_norm_1_1=with_norm_1_1),
            factored_spectra(weights.v, weights.o, kernel, a_index=kv, with_norm_1_1=with_norm_1_1),
        )
    return (
        [dense_spectrum(weights.q[h].T @ weights.k[g], EXACT_SVD) for h, g in enumerate(kv)],
        [dense_spectrum(weights.v[g].T @ weights.o[h], EXACT_SVD) for h, g in enumerate(kv)],
    )


def rotary_qk_spectra(
    weights: LayerWeights,
    kv: np.ndarray,
    layout: RotaryLayout,
    *,
    rank_tol: float,
    max_core_svds: int = DEFAULT_MAX_CORE_SVDS,
) -> list[RotaryQKSpectrum]:
    """Per query head, a QK "spectrum" that holds for ``W_Q^T M(delta) W_K`` at every relative offset
    ``|delta| < max_positions`` (docs/rotary.md): the spectral and Frobenius norms', nuclear norm's,
    stable rank's and each singular value's maximum over the offsets (exact from the ``d_h x d_h``
    cores where affordable, else bounds valid for every rotation), the Horn envelope
    ``s_i(W_Q) s_i(W_K)`` whose powers bound ``S_p`` for every ``p > 0`` (not singular values), a rank
    bound, and (2,1)- and (1,1)-norm bounds valid for every rotation (:class:`RotaryQKSpectrum`).  Shapes: ``weights.q``
    ``(H, d_h, N)``, ``weights.k`` ``(H_kv, d_h, N)``, ``kv`` ``(H,)``; ``max_core_svds`` the budget of the
    exact path (:func:`~specbound.compute.rotary.rotary_qk_envelope`)."""
    n = weights.q.shape[2]
    try:
        envelopes = rotary_qk_envelope(weights.q, weights.k, kv, layout, rank_tol=rank_tol, max_core_svds=max_core_svds)
    except ValueError as exc:
        raise SpecboundError(f"rotary layout does not fit layer {weights.layer}: {exc}") from None
    return [
        RotaryQKSpectrum(
            (n, n),
            e.envelope,
            e.norm_2_1_sup,
            e.norm_1_1_bound,
            sv_method=ROTARY_METHODS[e.spectral_method],
            kept=e.kept_envelope,
            spectral_sup=e.spectral_sup,
            sigma_bounds=e.sigma_bounds,
            frobenius_sup=e.frobenius_sup,
            nuclear_sup=e.nuclear_sup,
            stable_rank_sup=e.stable_rank_sup,
            argmax_offset=e.argmax_offset,
        )
        for e in envelopes
    ]


def feed_forward_spectra(ff: Mapping[str, np.ndarray], kernel: KernelOptions, *, prefetch: bool = False) -> dict:
    """Spectra of a layer's feed-forward matrices, the Gram path when its proven relative error is
    at most ``kernel.gram_rtol`` (0: always LAPACK's SVD), on ``kernel.device``.

    The (lazy) mapping is indexed inside the loop rather than iterated by items, which would load
    the next matrix while the previous one is still referenced.  ``prefetch``: read the next matrix
    in a background thread while this one's spectrum is computed (reading is file I/O and an
    upcast; the spectrum is BLAS/LAPACK work that releases the GIL), at the cost of two matrices
    alive at once instead of one.  A checkpoint's matrices are read as stored where float32 holds
    them exactly (:meth:`~specbound.archs.model.LazyMatrices.compact`: bf16 weights in half the memory
    of float64); the spectra upcast them a block at a time, so the numbers are those of float64.
    """
    roles = list(ff)
    read = getattr(ff, "compact", ff.__getitem__)
    if not prefetch or len(roles) < 2:
        return {role: dense_spectrum(read(role), kernel) for role in roles}

    out = {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specbound-read") as reader:
        pending = reader.submit(read, roles[0])
        for i, role in enumerate(roles):
            matrix = pending.result()
            pending = reader.submit(read, roles[i + 1]) if i + 1 < len(roles) else None
            out[role] = dense_spectrum(matrix, kernel)
            del matrix
    return out


def layer_spectra(
    weights: LayerWeights,
    kernel: KernelOptions,
    *,
    group: int = 1,
    block: str = "sequential",
    with_norm_1_1: bool = True,
    release: bool = False,
    rotary: RotaryLayout | None = None,
    prefetch: bool = False,
    position_terms: int = 0,
) -> LayerSpectra:
    """Spectra of one layer's QK/OV heads and feed-forward matrices, computed as ``kernel`` says
    (the dense method always uses the SVD in NumPy, feed-forward too).

    ``rotary``: the model's rotary layout (QK quantities valid at every relative position, their
    certified envelopes cut at ``kernel.rank_tol``; the rotation-blind ones are kept in
    ``qk_rotation_blind``).  ``release``: drop ``weights``' attention factors once their spectra are
    computed, so that one wide matrix is alive at a time while the feed-forward matrices are read
    (for weights read just for this call, as :func:`specbound.pipeline.model_layer_spectra` does).
    ``prefetch``: read each feed-forward matrix while the previous one's spectrum is computed (see
    :func:`feed_forward_spectra`).  ``position_terms``: the disentangled position terms of the
    layer's attention (DeBERTa), recorded for its propagation factors.  A decoder layer's
    cross-attention (``weights.cross``) gets its heads' spectra like the self-attention's.
    """
    raw = weights
    if raw.latent is not None:  # multi-head latent attention: rows of raw factors (docs/theory.md 3l)
        qk, ov, sensitivity, reach, ov_sens = latent_spectra(raw.latent, kernel)
        ff_matrices = weights.ff
        if release:
            raw.latent = None
        ff = feed_forward_spectra(ff_matrices, kernel if kernel.method == "factored" else EXACT_SVD, prefetch=prefetch)
        return LayerSpectra(
            weights.layer, qk, ov, ff, block, qk_sensitivity=sensitivity, ov_reach=reach, ov_sensitivity=ov_sens
        )
    kv = np.arange(weights.q.shape[0]) // group
    a = 1.0 if rotary is None else rotary.attention_factor
    # the bilinear logit's factors: the rope attention factor folded in (qk_logit.py)
    weights = logit_factors(raw, a)
    sensitivity = None
    if raw.qk_norm is not None:  # each head covered through its stacked raw factors (docs/theory.md 3d)
        qk = qk_norm_spectra(raw, kv, a, kernel)
        ov = attention_spectra(weights, kernel, group=group, with_norm_1_1=with_norm_1_1)[1]
        sensitivity = qk_norm_sensitivity(raw.q, raw.k, kv, raw.qk_norm, a)
    else:
        qk, ov = attention_spectra(weights, kernel, group=group, with_norm_1_1=with_norm_1_1)
    cross_qk = cross_ov = None
    if weights.cross is not None:  # a decoder layer's cross-attention: heads like any other
        if rotary is not None:
            raise SpecboundError("rotary position embeddings with cross-attention are not supported")
        cross_qk, cross_ov = attention_spectra(weights.cross, kernel, group=1, with_norm_1_1=with_norm_1_1)
    blind = None
    if rotary is not None and raw.qk_norm is None:  # every QK quantity must hold at every relative position
        blind = qk
        qk = rotary_qk_spectra(weights, kv, rotary, rank_tol=kernel.rank_tol)
    ff_matrices = weights.ff
    if release:
        for w in {id(raw): raw, id(weights): weights}.values():
            w.q = w.k = w.v = w.o = w.cross = None
    ff = feed_forward_spectra(ff_matrices, kernel if kernel.method == "factored" else EXACT_SVD, prefetch=prefetch)
    return LayerSpectra(
        weights.layer,
        qk,
        ov,
        ff,
        block,
        qk_rotation_blind=blind,
        position_terms=position_terms,
        cross_qk=cross_qk,
        cross_ov=cross_ov,
        qk_sensitivity=sensitivity,
    )


def qk_norm_spectra(
    weights: LayerWeights, kv: np.ndarray, attention_factor: float, kernel: KernelOptions
) -> list[MatrixSpectrum]:
    """A QK-norm layer's QK rows (docs/theory.md 3d): each head's stacked raw factors ``Z_h^T`` ``(N, 2 d_h)``
    (:func:`~.qk_logit.qk_norm_factors`), every norm its own, whatever the rotation, with the normalised
    logit's Lipschitz factor ``kappa_h`` as ``lipschitz`` and ``kappa_F`` as ``lipschitz_frobenius``."""
    norm = weights.qk_norm
    kappa = qk_norm_lipschitz(weights.q, weights.k, kv, norm, attention_factor)
    kappa_f = qk_norm_lipschitz(weights.q, weights.k, kv, norm, attention_factor, frobenius=True)
    kernel = kernel if kernel.method == "factored" else EXACT_SVD  # as for the feed-forward matrices
    return [
        replace(dense_spectrum(z, kernel), lipschitz=float(c), lipschitz_frobenius=float(f))
        for z, c, f in zip(qk_norm_factors(weights.q, weights.k, kv), kappa, kappa_f)
    ]
