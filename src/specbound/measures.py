"""Spectra of every matrix plus their propagation factors: what every bound is computed from."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .extract import ModelDims
from .propagation import LayerNorms, downstream_factors, layer_lipschitz, sensitivities
from .spectra import MatrixSpectrum

ROLE_ORDER = ("QK", "OV", "FF_in", "FF_gate", "FF_up", "FF_out")


@dataclass(frozen=True)
class LayerSpectra:
    """Spectra of one layer's matrices: per query head for QK/OV, one per feed-forward role
    (``FF_in``/``FF_out``, or ``FF_gate``/``FF_up``/``FF_out``), and the block structure."""

    layer: int
    qk: list[MatrixSpectrum]
    ov: list[MatrixSpectrum]
    ff: dict[str, MatrixSpectrum]
    block: str = "sequential"

    def norms(self) -> LayerNorms:
        return LayerNorms(
            qk=np.array([s.spectral_norm for s in self.qk]),
            ov=np.array([s.spectral_norm for s in self.ov]),
            ff={role: s.spectral_norm for role, s in self.ff.items()},
            block=self.block,
        )


@dataclass(frozen=True)
class MatrixMeasure:
    """One analysed matrix with its place in the network and its propagation factors."""

    layer: int
    head: int | None
    role: str
    spectrum: MatrixSpectrum
    alpha: float
    gamma: float
    scale: float


@dataclass(frozen=True)
class ModelMeasures:
    """Everything the bounds read.

    Attributes
    ----------
    dims : ModelDims
    l_phi : float
        Activation Lipschitz constant used in ``Lambda``.
    rank_tol : float
        Relative tolerance of the numerical rank (SPEC section 2).
    grid_m : int
        Resolution of the post-hoc Schatten grid ``{0, 1/m, ..., 2}``.
    layers : list of LayerSpectra
    lambdas, alphas : ndarray, shape (L,)
    matrices : list of MatrixMeasure
        Layer by layer: QK heads, OV heads, FF_in, FF_out.
    """

    dims: ModelDims
    l_phi: float
    rank_tol: float
    grid_m: int
    layers: list[LayerSpectra]
    lambdas: np.ndarray
    alphas: np.ndarray
    matrices: list[MatrixMeasure]


def default_grid_m(L: int, N: int) -> int:
    """``m = ceil(L + ln(max(N, 2)))`` (SPEC section 4)."""
    return int(math.ceil(L + math.log(max(N, 2))))


def measure(layers: list[LayerSpectra], dims: ModelDims, *, l_phi: float, rank_tol: float,
            grid_m: int | None = None) -> ModelMeasures:
    """Attach ``alpha``, ``gamma*`` and ``scale = gamma* alpha L`` to every matrix."""
    norms = [layer.norms() for layer in layers]
    lambdas = np.array([layer_lipschitz(n, l_phi) for n in norms])
    alphas = downstream_factors(lambdas)
    tiny = np.finfo(np.float64).tiny
    matrices = []
    for layer, n, alpha in zip(layers, norms, alphas):
        gamma = sensitivities(n)
        entries = ([("QK", h, s, gamma["QK"][h]) for h, s in enumerate(layer.qk)]
                   + [("OV", h, s, gamma["OV"][h]) for h, s in enumerate(layer.ov)]
                   + [(role, None, s, gamma[role]) for role, s in layer.ff.items()])
        for role, head, spectrum, g in entries:
            scale = max(float(g) * float(alpha) * dims.L, tiny)
            matrices.append(MatrixMeasure(layer.layer, head, role, spectrum, float(alpha), float(g), scale))
    m = default_grid_m(dims.L, dims.N) if grid_m is None else int(grid_m)
    return ModelMeasures(dims, l_phi, rank_tol, m, layers, lambdas, alphas, matrices)
