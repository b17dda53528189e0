"""The spectrum-adaptive family's gap form: Dudley's entropy integral, term by term (docs/bounds.md 9).

Each bound of the family is a sum of covering terms (one per matrix, or per feed-forward block, or per
stored matrix) plus ``sqrt(L)``; term ``t`` takes a Schatten index ``p`` from its grid and costs
``C_t(p)``.  For the ramp loss at margin ``margin`` (values in ``[0, 1]``) the leading term of the gap
is ``c_lead / sqrt(n)`` times ``int_0^1 sqrt(ln N(eps)) d eps`` with the loss class covered at ``eps``,
i.e. the network's output at ``margin * eps``.  Per regime:

* ``p > 0``: the project reads ``C(p)`` as ``sqrt(ln N(eps)) = C(p) (margin eps)^(-p/(p+2))`` (the
  ``scale / eps`` inside ``scale^(p/(p+2))``), so the integral is ``C(p) margin^(-p/(p+2)) (p+2)/2``;
* ``p = 0``: the rank-``r`` class of an ``a x b`` matrix with ``||W||_F <= rho`` has a Frobenius-norm
  cover at ``delta`` of ``(9 rho / delta)^D`` elements, ``D = min(r (a + b + 1), a b)`` (Candes & Plan,
  IEEE Trans. Inf. Theory 57 (2011), Lemma 3.1; the dense ball for ``a b``), and the output moves by at
  most ``scale ||Delta W||_2 <= scale ||Delta W||_F``, so ``ln N(eps) = D ln(R / (margin eps))`` with
  ``R = 9 scale rho``, and the integral is ``sqrt(D) I(ln(R / margin))``,

    I(a) = int_0^1 sqrt(max(0, a - ln eps)) d eps = sqrt(a) + (sqrt(pi)/2) erfcx(sqrt(a))   (a >= 0)
         = e^a sqrt(pi) / 2                                                                (a < 0),

  which grows like ``sqrt(ln R)``: with depth, through ``scale``.

``sqrt(ln sum_t N_t) <= sum_t sqrt(ln N_t)``, so the terms add.  Each term takes the index that
minimises its ``C_t(p; scale / margin)`` (the bound's own choice, paid by the union cost), and
``log_factor`` is the ratio of the integral to ``B_margin = sum_t min_p C_t(p; scale / margin) +
sqrt(L)``: the contribution-weighted mean of the terms' factors.  ``sqrt(L)`` is not a covering term
and is kept as it is.  Dudley's absolute constant stays in ``c_lead``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import erfcx

from .schatten import ContributionCurve, safe_exp

# Candes & Plan's net: (9 rho / delta)^D elements for the rank-r class of Frobenius norm <= rho.
NET_CONSTANT = 9.0


@dataclass(frozen=True)
class CoveringTerm:
    """One covered parameter matrix (or block) of a spectrum-adaptive bound.

    Attributes
    ----------
    curve : ContributionCurve
        ``p -> C(p)`` (its ``kept`` values and ``log_scale``).
    grid : ndarray
        The Schatten indices the term may take (the post-hoc grid, or one fixed ``p``).
    dimension : int
        ``D``, the parametric dimension of its rank-``r`` class (``r = len(curve.kept)``): the
        coefficient of ``ln(R / eps)`` in its ``p = 0`` entropy.
    """

    curve: ContributionCurve
    grid: np.ndarray
    dimension: int


def rank_class_dimension(rows: int, cols: int, rank: int) -> int:
    """``min(r (a + b + 1), a b)``: the exponent of a cover of the rank-``r`` ``a x b`` matrices."""
    return int(min(rank * (rows + cols + 1), rows * cols)) if rank > 0 else 0


def matrix_term(spectrum, *, log_scale: float, n: int, rank_tol: float, grid: np.ndarray) -> CoveringTerm:
    """The covering term of one matrix (``spectrum``: what its complexity measures)."""
    curve = ContributionCurve(spectrum, log_scale=log_scale, n=n, rank_tol=rank_tol)
    rows, cols = spectrum.shape
    return CoveringTerm(curve, np.asarray(grid, dtype=np.float64), rank_class_dimension(rows, cols, curve.kept.size))


def dudley_log_integral(a: float) -> float:
    """``I(a) = int_0^1 sqrt(max(0, a - ln eps)) d eps`` (see the module docstring); ``a = ln R``."""
    if a <= 0:
        return math.exp(a) * math.sqrt(math.pi) / 2
    return math.sqrt(a) + math.sqrt(math.pi) / 2 * float(erfcx(math.sqrt(a)))


def log_radius(curve: ContributionCurve) -> float:
    """``ln R = ln(9 scale ||W||_F)``, ``||W||_F`` over the kept values (``-inf`` for none)."""
    if curve.kept.size == 0:
        return -math.inf
    return math.log(NET_CONSTANT) + curve.log_scale + 0.5 * math.log(float(np.sum(curve.kept**2)))


def term_integral(term: CoveringTerm, p: float, log_c: float, margin: float) -> float:
    """``int_0^1 sqrt(ln N_t(eps)) d eps`` at index ``p``, ``log_c = ln C_t(p; scale / margin)``."""
    if not log_c > -math.inf:
        return 0.0
    if p == 0:
        return math.sqrt(term.dimension) * dudley_log_integral(log_radius(term.curve) - math.log(margin))
    return safe_exp(log_c) * (p + 2.0) / 2.0


def gap_complexity(terms: list[CoveringTerm], sqrt_l: float, margin: float) -> dict[str, float]:
    """``B_margin`` (the margin inside each term), the entropy integral and their ratio.

    Returns ``{"complexity", "integral", "log_factor"}``; ``inf`` where a value exceeds float64.
    """
    shift = math.log(margin)
    complexity, integral = sqrt_l, sqrt_l
    for term in terms:
        curve = ContributionCurve.from_kept(term.curve.kept, log_scale=term.curve.log_scale - shift, n=term.curve.n)
        logs = curve.log_on_grid(term.grid)
        best = int(np.argmin(logs))  # ties go to the smallest p, as the bound's own choice
        complexity += safe_exp(float(logs[best]))
        integral += term_integral(term, float(term.grid[best]), float(logs[best]), margin)
    ratio = integral / complexity if 0 < complexity < math.inf and integral < math.inf else math.nan
    return {"complexity": complexity, "integral": integral, "log_factor": ratio}
