"""The spectrum-adaptive proxy: Sakai & Imaizumi (arXiv:2605.07297), Theorem 3.1, leading term
(SPEC section 4).

For a matrix with Schatten powers ``S_p`` and ``scale = gamma* alpha L``,

    C(p) = S_p^(1/(p+2)) * scale^(p/(p+2)) * N^((p+1)/(p+2)),   p in P_m = {0, 1/m, ..., 2},

each matrix takes its own minimiser (ties to the smallest p) and
``B_spectral = sum_matrices min_p C(p) + sqrt(L)``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar

from ..measures import ModelMeasures
from ..spectra import MatrixSpectrum, rank_threshold
from . import Bound, BoundResult, register


def schatten_grid(m: int) -> np.ndarray:
    """``P_m = {0, 1/m, 2/m, ..., 2}``, shape (2m + 1,)."""
    if m < 1:
        raise ValueError(f"the Schatten grid needs m >= 1, got {m}")
    return np.arange(2 * m + 1, dtype=np.float64) / m


def contribution(schatten_power: float, p: float, scale: float, n: int) -> float:
    """``C(p)`` from ``S_p`` (computed in logs: ``scale`` may be astronomically large)."""
    if schatten_power <= 0.0:
        return 0.0
    log_c = (math.log(schatten_power) + p * math.log(scale) + (p + 1.0) * math.log(n)) / (p + 2.0)
    return math.exp(log_c)


class ContributionCurve:
    """``p -> C(p)`` for one matrix; only singular values above the rank tolerance count."""

    def __init__(self, spectrum: MatrixSpectrum, scale: float, n: int, rank_tol: float):
        s = spectrum.singular_values
        self.kept = s[s > rank_threshold(s, spectrum.dim, rank_tol)]
        self.scale, self.n = scale, n

    def schatten(self, p: float) -> float:
        return float(self.kept.size) if p == 0 else float(np.sum(self.kept**p))

    def __call__(self, p: float) -> float:
        return contribution(self.schatten(p), p, self.scale, self.n)

    def on_grid(self, grid: np.ndarray) -> np.ndarray:
        """``C(p)`` for every ``p`` of ``grid`` at once (the same formula as :meth:`__call__`, in logs)."""
        grid = np.asarray(grid, dtype=np.float64)
        if not self.kept.size:
            return np.zeros(grid.size)
        powers = np.sum(self.kept[None, :] ** grid[:, None], axis=1)  # S_p; S_0 = #kept
        log_c = (np.log(powers) + grid * math.log(self.scale) + (grid + 1.0) * math.log(self.n)) / (grid + 2.0)
        return np.exp(log_c)

    def continuous_minimum(self) -> tuple[float, float]:
        """Infimum over ``[0, 2]``: ``p = 0`` apart, then a bounded search on ``(0, 2]``."""
        candidates = [(self(0.0), 0.0), (self(2.0), 2.0)]
        if self.kept.size:
            res = minimize_scalar(lambda p: math.log(self(p)), bounds=(0.0, 2.0), method="bounded",
                                  options={"xatol": 1e-10})
            candidates.append((self(float(res.x)), float(res.x)))
        value, p = min(candidates)
        return p, value


def optimise_matrices(measures: ModelMeasures) -> dict[str, np.ndarray]:
    """Per-matrix grid minimiser, its value, C(0), C(2) and the continuous diagnostic."""
    grid = schatten_grid(measures.grid_m)
    cols = {k: [] for k in ("p_star", "contribution", "c_p0", "c_p2", "p_continuous",
                            "contribution_continuous", "scale")}
    for mm in measures.matrices:
        curve = ContributionCurve(mm.spectrum, mm.scale, measures.dims.N, measures.rank_tol)
        values = curve.on_grid(grid)
        best = int(np.argmin(values))  # first minimum: ties go to the smallest p
        p_cont, c_cont = curve.continuous_minimum()
        for key, val in (("p_star", grid[best]), ("contribution", values[best]), ("c_p0", values[0]),
                         ("c_p2", values[-1]), ("p_continuous", p_cont),
                         ("contribution_continuous", c_cont), ("scale", mm.scale)):
            cols[key].append(val)
    return {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}


def _compute(measures: ModelMeasures) -> BoundResult:
    per_matrix = optimise_matrices(measures)
    value = float(np.sum(per_matrix["contribution"]) + math.sqrt(measures.dims.L))
    return BoundResult(value=value, per_matrix=per_matrix)


SPECTRAL_ADAPTIVE = register(Bound(
    name="spectral_adaptive",
    title="Spectrum-adaptive (Sakai & Imaizumi 2026)",
    reference="Sakai & Imaizumi, arXiv:2605.07297, Theorem 3.1 (leading term, post-hoc grid P_m)",
    compute=_compute,
))
