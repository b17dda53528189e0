"""Spectra of every matrix plus their propagation factors: what every bound is computed from."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..archs.model import ModelDims
from .layer_spectra import LayerSpectra
from .propagation import (
    LayerSpectralNorms,
    downstream_factors,
    encoder_decoder_factors,
    encoder_decoder_log_lipschitz,
    layer_lipschitz,
    log_downstream_factors,
    memory_lipschitz,
    sensitivities,
    split_role,
)
from .spectra import MatrixSpectrum

ROLE_ORDER = ("QK", "OV", "QK_cross", "OV_cross", "FF_in", "FF_gate", "FF_up", "FF_out")


def ordered_roles(roles) -> list[str]:
    """The distinct roles in ``roles`` (an iterable or a column), in :data:`ROLE_ORDER`, any other after
    them in order of appearance."""
    present = list(dict.fromkeys(roles))
    return [r for r in ROLE_ORDER if r in present] + [r for r in present if r not in ROLE_ORDER]


def role_group(role: str) -> str:
    """The role a summary groups a matrix under: every routed expert's ``FF_gate[e3]`` under
    ``FF_gate[experts]`` (a mixture of experts has ``E`` of each), any other role as it is."""
    kind, branch = split_role(role)
    return role if branch is None or branch == "shared" else f"{kind}[experts]"


def with_role_groups(frame):
    """``frame`` (a table with a ``role`` column) with each role replaced by its :func:`role_group`;
    ``frame`` itself when no matrix belongs to a routed expert."""
    roles = frame["role"]
    if not roles.astype(str).str.contains(r"\[e\d+\]$", regex=True).any():
        return frame
    return frame.assign(role=roles.map(role_group))


@dataclass(frozen=True)
class MatrixMeasure:
    """One analysed matrix with its place in the network and its propagation factors.

    ``spectrum`` is the matrix ``W`` itself; the propagation factors (``alpha``, ``gamma``,
    ``scale``) always come from it.  ``delta`` is the spectrum of ``W - W0`` when the analysis is
    measured from initial weights ``W0``; the bounds' complexity terms read :attr:`target`.
    """

    layer: int
    head: int | None
    role: str
    spectrum: MatrixSpectrum
    alpha: float
    gamma: float
    scale: float
    log_alpha: float = 0.0
    log_scale: float = 0.0
    delta: MatrixSpectrum | None = None

    @property
    def target(self) -> MatrixSpectrum:
        """The spectrum the complexity terms measure: ``W - W0`` if given, else ``W``."""
        return self.spectrum if self.delta is None else self.delta


@dataclass(frozen=True)
class ModelMeasures:
    """Everything the bounds read.

    Attributes
    ----------
    dims : ModelDims
    l_phi : float
        Activation Lipschitz constant used in ``Lambda``.
    rank_tol : float
        Relative tolerance of the numerical rank (docs/spec.md section 2).
    grid_m : int
        Resolution of the post-hoc Schatten grid ``{0, 1/m, ..., 2}``.
    layers : list of LayerSpectra
    lambdas, alphas : ndarray, shape (L,)
        ``alphas`` is ``inf`` where the product overflows float64.
    log_alphas : ndarray, shape (L,)
        ``ln alpha_l``, exact at any depth: what the bounds read.
    matrices : list of MatrixMeasure
    rotation_blind : ModelMeasures, optional
        Rotary models: the same measures with every QK head's rotation-blind ``W_Q^T W_K`` (the
        ``*_rotation_blind`` variants read it; None for other models).
        Layer by layer: QK heads, OV heads, FF_in, FF_out.
    """

    dims: ModelDims
    l_phi: float
    rank_tol: float
    grid_m: int
    layers: list[LayerSpectra]
    lambdas: np.ndarray
    alphas: np.ndarray
    log_alphas: np.ndarray
    matrices: list[MatrixMeasure]
    rotation_blind: "ModelMeasures | None" = None
    memory: np.ndarray | None = None  # encoder-decoders: M_j per layer (nan in the encoder's)
    log_lipschitz: float | None = None  # encoder-decoders: ln K of the two stacks (a chain's is ln prod Lambda)

    @property
    def from_init(self) -> bool:
        """Whether the complexity terms measure distances ``W - W0`` from initial weights."""
        return any(mm.delta is not None for mm in self.matrices)

    def layer_of_matrices(self) -> np.ndarray:
        """Layer index of every matrix, shape (#matrices,), for per-layer sums."""
        return np.array([mm.layer for mm in self.matrices], dtype=np.int64)

    def per_layer_sum(self, values) -> np.ndarray:
        """Sum of a per-matrix array over each layer's matrices, shape (L,)."""
        return np.bincount(
            self.layer_of_matrices(), weights=np.asarray(values, dtype=np.float64), minlength=self.dims.L
        )

    def measured_from(self, deltas: list[LayerSpectra]) -> "ModelMeasures":
        """The same measures with the complexity terms on ``W - W0`` (``deltas``: spectra of the
        differences, layer by layer, in :class:`LayerSpectra` form)."""
        flat = [s for layer in deltas for s in _role_order(layer)]
        if len(flat) != len(self.matrices):
            raise ValueError(f"{len(flat)} difference spectra for {len(self.matrices)} matrices")
        matrices = [replace(mm, delta=d) for mm, d in zip(self.matrices, flat)]
        return replace(self, matrices=matrices)


def _role_order(layer: LayerSpectra) -> list[MatrixSpectrum]:
    """A layer's spectra in the order of ``ModelMeasures.matrices``: QK heads, OV heads, (cross-attention
    QK and OV heads,) feed-forward."""
    return [s for _, _, s in layer.matrices()]


def _decoder_start(dims: ModelDims) -> int | None:
    """The first decoder layer of an encoder-decoder, None for one chain (an encoder-only export too)."""
    if dims.stacks is None or not any(part.cross for part in dims.stacks):
        return None
    return next(part.first for part in dims.stacks if part.cross)


def layer_norms(layer: LayerSpectra, dims: ModelDims, norm=None) -> LayerSpectralNorms:
    """The layer's factors (:meth:`LayerSpectra.norms`, ``norm`` in place of the spectral norm when given)
    with what the model's feed-forward block adds to its matrices: the routed gates' bounds (Llama 4: each
    at most 1, top_k of them; DeepSeek, GLM: times routed_scaling_factor; docs/theory.md 3f) and the
    constant on the up branch (gpt-oss's ``(clamp(u) + 1) * phi(g)``; docs/theory.md 3n)."""
    n = layer.norms(norm)
    if dims.moe is not None and (dims.moe.gate_sum != 1 or dims.moe.gate_max != 1):
        n = replace(n, gate_sum=float(dims.moe.gate_sum), gate_max=float(dims.moe.gate_max))
    return replace(n, up_offset=float(dims.up_offset)) if dims.up_offset else n


def measure(
    layers: list[LayerSpectra], dims: ModelDims, *, l_phi: float, rank_tol: float, grid_m: int
) -> ModelMeasures:
    """Attach ``alpha``, ``gamma*`` and ``scale = gamma* alpha L`` to every matrix, each also as its
    natural log (``log_scale`` is floored at ``ln`` of the smallest positive float, like ``scale``)."""
    norms = [layer_norms(layer, dims) for layer in layers]
    lambdas = np.array([layer_lipschitz(n, l_phi) for n in norms])
    decoder = _decoder_start(dims)
    memory = log_lipschitz = None
    if decoder is None:
        alphas = downstream_factors(lambdas)
        log_alphas = log_downstream_factors(lambdas)
    else:  # the encoder's output reaches the decoder's output through every cross-attention
        memory = np.array([memory_lipschitz(n, l_phi) if n.cross_qk is not None else math.nan for n in norms])
        alphas, log_alphas, log_z = encoder_decoder_factors(lambdas, memory, decoder)
        log_lipschitz = encoder_decoder_log_lipschitz(lambdas, log_z, decoder)
    matrices = []
    for layer, n, alpha, log_alpha in zip(layers, norms, alphas, log_alphas):
        gamma = sensitivities(n)
        entries = [
            (role, head, s, gamma[role] if head is None else gamma[role][head]) for role, head, s in layer.matrices()
        ]
        for role, head, spectrum, g in entries:
            scale, log_scale = scale_and_log(float(g), float(alpha), float(log_alpha), dims.L)
            matrices.append(
                MatrixMeasure(
                    layer.layer, head, role, spectrum, float(alpha), float(g), scale, float(log_alpha), log_scale
                )
            )
    blind = None
    if any(layer.qk_rotation_blind is not None for layer in layers):  # rotary: also as if unrotated
        # a layer without rotary positions (NoPE) is its own rotation-blind self
        blind = measure(
            [
                layer
                if layer.qk_rotation_blind is None
                else replace(layer, qk=layer.qk_rotation_blind, qk_rotation_blind=None)
                for layer in layers
            ],
            dims,
            l_phi=l_phi,
            rank_tol=rank_tol,
            grid_m=grid_m,
        )
    return ModelMeasures(
        dims,
        l_phi,
        rank_tol,
        int(grid_m),
        layers,
        lambdas,
        alphas,
        log_alphas,
        matrices,
        rotation_blind=blind,
        memory=memory,
        log_lipschitz=log_lipschitz,
    )


_TINY = np.finfo(np.float64).tiny
LOG_TINY = math.log(_TINY)


def scale_and_log(gamma: float, alpha: float, log_alpha: float, L: int) -> tuple[float, float]:
    """``(scale, ln scale)`` with ``scale = max(gamma* alpha L, tiny)`` (docs/spec.md section 3): the
    product where it is a normal float (so its log is that of the product form to the last bit),
    else from logs (``scale`` is then ``inf``, or ``tiny`` after an underflow)."""
    with np.errstate(over="ignore"):
        scale = gamma * alpha * L
    if _TINY <= scale < math.inf:
        return scale, math.log(scale)
    if gamma <= 0 or log_alpha == -math.inf:
        return _TINY, LOG_TINY
    log_scale = max(math.log(gamma) + log_alpha + math.log(L), LOG_TINY)
    return (math.inf if log_scale > LOG_TINY else _TINY), log_scale
