"""The Schatten machinery of the spectrum-adaptive bound (docs/spec.md sections 2 and 4), in one place:
``S_p`` over the singular values above the rank tolerance, the per-matrix term

    C(p) = S_p^(1/(p+2)) * scale^(p/(p+2)) * N^((p+1)/(p+2)),

the post-hoc grid ``P_m = {0, 1/m, ..., 2}`` with ``m = ceil(L + ln max(N, 2))``, its minimiser and
the continuous minimum.  Every bound that evaluates ``C(p)`` (adaptive, fixed p, three types,
shared weights) and the stored contribution curves use this module.
"""

from __future__ import annotations

import math

import numpy as np

from ..compute.spectra import MatrixSpectrum, rank_threshold


def default_grid_m(L: int, N: int) -> int:
    """``m = ceil(L + ln(max(N, 2)))`` (docs/spec.md section 4)."""
    return int(math.ceil(L + math.log(max(N, 2))))


def schatten_grid(m: int) -> np.ndarray:
    """``P_m = {0, 1/m, 2/m, ..., 2}``, shape (2m + 1,)."""
    if m < 1:
        raise ValueError(f"the Schatten grid needs m >= 1, got {m}")
    return np.arange(2 * m + 1, dtype=np.float64) / m


def log_contribution(schatten_power, p, log_scale: float, n: int):
    """``ln C(p) = (ln S_p + p ln scale + (p + 1) ln N) / (p + 2)``, the one home of the formula
    (scalars or arrays of ``S_p`` and ``p``): exact whatever the size of ``scale``, ``p = 0`` never
    multiplies it (``C(0) = sqrt(r N)`` is scale-free), and ``-inf`` for a zero matrix (``S_p = 0``)."""
    if np.ndim(schatten_power) == 0 and np.ndim(p) == 0:  # one value: without the array machinery
        power, p = float(schatten_power), float(p)
        if not power > 0:
            return -math.inf
        return (math.log(power) + (0.0 if p == 0 else p * log_scale) + (p + 1.0) * math.log(n)) / (p + 2.0)
    powers, p = np.asarray(schatten_power, dtype=np.float64), np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logs = np.log(powers)
    scaled = np.where(p == 0, 0.0, p * log_scale)
    out = np.where(powers > 0, (logs + scaled + (p + 1.0) * math.log(n)) / (p + 2.0), -np.inf)
    return float(out) if out.ndim == 0 else out


def safe_exp(log_value: float) -> float:
    """``exp`` that returns ``inf`` instead of raising on overflow (``0`` for ``-inf``)."""
    try:
        return math.exp(log_value)
    except OverflowError:
        return math.inf


def log_sum(log_values) -> float:
    """``ln sum_i exp(x_i)`` without overflow (``-inf`` for no terms or all ``-inf``)."""
    x = np.asarray(log_values, dtype=np.float64)
    if x.size == 0 or not np.any(x > -np.inf):
        return -math.inf
    top = float(np.max(x))
    return top + math.log(float(np.sum(np.exp(x - top))))


def kept_values(singular_values: np.ndarray, dim: int, rank_tol: float) -> np.ndarray:
    """The singular values above the rank tolerance ``tau`` (docs/spec.md section 2): those ``S_p`` sums over.

    Only these count, so that ``S_p -> S_0 = r`` as ``p -> 0`` and rounding noise (a dense SVD of a
    rank-64 ``768 x 768`` product returns 704 values near ``1e-15``, each worth ``0.16`` at
    ``p = 1/19``) does not enter the bound.  See docs/theory.md.
    """
    return singular_values[singular_values > rank_threshold(singular_values, dim, rank_tol)]


def kept_singular_values(spectrum: MatrixSpectrum, rank_tol: float) -> np.ndarray:
    """:func:`kept_values` of a spectrum (a rotary head's certified envelope as it is: ``spectrum.kept``)."""
    if spectrum.kept is not None:
        return spectrum.kept
    return kept_values(spectrum.singular_values, spectrum.dim, rank_tol)


def schatten_of_kept(kept: np.ndarray, p: float) -> float:
    """``S_p = sum_i s_i^p`` over already-kept values; ``S_0`` is their number (the rank)."""
    return float(kept.size) if p == 0 else float(np.sum(kept**p))


def schatten_power(singular_values: np.ndarray, p: float, dim: int, rank_tol: float) -> float:
    """``S_p`` of a spectrum of full length ``dim``: over the values above the rank tolerance; ``S_0`` is the rank."""
    return schatten_of_kept(kept_values(singular_values, dim, rank_tol), p)


def grid_minimum(curve: "ContributionCurve", grid: np.ndarray) -> tuple[float, float]:
    """``(p*, C(p*))`` over the grid; ties go to the smallest p."""
    values = curve.on_grid(grid)
    best = int(np.argmin(values))
    return float(grid[best]), float(values[best])


class ContributionCurve:
    """``p -> C(p)`` for one matrix; only singular values above the rank tolerance count."""

    def __init__(self, spectrum: MatrixSpectrum, *, log_scale: float, n: int, rank_tol: float):
        self.kept = kept_singular_values(spectrum, rank_tol)
        self.log_scale, self.n = float(log_scale), n

    @classmethod
    def from_kept(cls, kept: np.ndarray, *, log_scale: float, n: int) -> "ContributionCurve":
        """A curve over singular values already filtered by the rank tolerance."""
        curve = cls.__new__(cls)
        curve.kept, curve.log_scale, curve.n = np.asarray(kept, dtype=np.float64), float(log_scale), n
        return curve

    def schatten(self, p: float) -> float:
        return schatten_of_kept(self.kept, p)

    def log_at(self, p: float) -> float:
        """``ln C(p)`` (``-inf`` for a zero matrix)."""
        return log_contribution(self.schatten(p), p, self.log_scale, self.n)

    def __call__(self, p: float) -> float:
        return safe_exp(self.log_at(p))

    def log_on_grid(self, grid: np.ndarray) -> np.ndarray:
        """``ln C(p)`` for every ``p`` of ``grid`` at once (the formula of :func:`log_contribution`)."""
        grid = np.asarray(grid, dtype=np.float64)
        if self.kept.size == 0:
            return np.full_like(grid, -np.inf)
        # s^p as exp(p ln s): one logarithm per singular value instead of one per (p, s) pair (``**``
        # takes the logarithm again for every grid point); the two agree to a few ulp
        powers = np.exp(np.multiply.outer(grid, np.log(self.kept))).sum(axis=1)
        powers[grid == 0] = float(self.kept.size)
        return log_contribution(powers, grid, self.log_scale, self.n)

    def on_grid(self, grid: np.ndarray) -> np.ndarray:
        """``C(p)`` for every ``p`` of ``grid``; ``inf`` where it exceeds float64 (never at ``p = 0``)."""
        with np.errstate(over="ignore"):
            return np.exp(self.log_on_grid(grid))

    def continuous_minimum(self) -> tuple[float, float]:
        """``(p, C(p))`` minimising ``C`` over all of ``[0, 2]`` (see :func:`continuous_minima`)."""
        p, value = continuous_minima([self])
        return float(p[0]), float(value[0])


def continuous_minima(
    curves: list[ContributionCurve], *, tol: float = 1e-13, max_steps: int = 200
) -> tuple[np.ndarray, np.ndarray]:
    """The minimiser over ``[0, 2]`` and the minimum of ``C`` for every curve at once.

    ``ln C(p) = g(p) / (p + 2)`` with ``g(p) = ln S_p + p ln(scale) + (p + 1) ln N``.  ``ln S_p``
    is a log-sum-exp of linear functions of ``p``, so ``g`` is convex and ``ln C`` quasiconvex: its
    derivative has the sign of ``h(p) = (p + 2) g'(p) - g(p)``, and ``h'(p) = (p + 2) g''(p) >= 0``.
    The minimiser is therefore global and unique up to flat stretches: ``0`` when ``h(0) >= 0``,
    ``2`` when ``h(2) <= 0``, else the root of ``h``, found by Newton steps kept inside a shrinking
    bracket (bisection whenever a step would leave it) until the bracket or the step is below
    ``tol``.  ``g'`` and ``g''`` are the mean and the variance of ``ln s_i`` under the weights
    ``s_i^p``; a matrix without singular values above the rank tolerance has ``C = 0`` and ``p = 0``.

    Returns
    -------
    p : ndarray, shape (len(curves),)
    value : ndarray, shape (len(curves),)
        ``C(p)``, never above ``C(0)`` or ``C(2)``.
    """
    count = len(curves)
    ranks = np.array([c.kept.size for c in curves], dtype=int)
    width = int(ranks.max(initial=0))
    p = np.zeros(count)
    if width > 0:
        mask = np.arange(width)[None, :] < ranks[:, None]
        logs = np.zeros((count, width))
        for i, c in enumerate(curves):
            logs[i, : c.kept.size] = np.log(c.kept)
        top = np.where(mask, logs, -np.inf).max(axis=1, initial=-np.inf)
        top = np.where(ranks > 0, top, 0.0)
        shifted = np.where(mask, logs - top[:, None], 0.0)  # <= 0: no overflow in exp
        slope = np.array([c.log_scale + math.log(c.n) for c in curves])  # d/dp of the linear part
        log_n = np.array([math.log(c.n) for c in curves])
        live = ranks > 0

        def h_and_slope(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            weights = np.where(mask, np.exp(q[:, None] * shifted), 0.0)
            total = np.where(live, weights.sum(axis=1), 1.0)
            mean = (weights * shifted).sum(axis=1) / total
            var = (weights * (shifted - mean[:, None]) ** 2).sum(axis=1) / total
            g = q * top + np.log(total) + q * slope + log_n
            g1 = mean + top + slope
            return (q + 2.0) * g1 - g, (q + 2.0) * var

        h0, _ = h_and_slope(np.zeros(count))
        h2, _ = h_and_slope(np.full(count, 2.0))
        lo, hi = np.zeros(count), np.full(count, 2.0)
        interior = live & (h0 < 0) & (h2 > 0)
        p = np.where(live & (h0 < 0) & (h2 <= 0), 2.0, 0.0)
        todo, q = interior.copy(), np.where(interior, 1.0, p)
        for _ in range(max_steps):
            if not todo.any():
                break
            h, dh = h_and_slope(q)
            lo = np.where(todo & (h < 0), q, lo)
            hi = np.where(todo & (h > 0), q, hi)
            with np.errstate(divide="ignore", invalid="ignore"):
                newton = q - h / dh
            inside = (dh > 0) & (newton > lo) & (newton < hi)
            step = np.where(inside, newton, 0.5 * (lo + hi))
            step = np.where(h == 0, q, step)
            done = (np.abs(step - q) <= tol) | (hi - lo <= tol) | (h == 0)
            q = np.where(todo, step, q)
            todo = todo & ~done
        p = np.where(interior, q, p)
    values = np.empty(count)
    for i, c in enumerate(curves):  # the same formula as the grid, and never above an end point
        candidates = [(c(0.0), 0.0), (c(2.0), 2.0), (c(float(p[i])), float(p[i]))]
        values[i], p[i] = min(candidates)
    return p, values
