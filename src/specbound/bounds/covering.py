"""The spectrum-adaptive family's gap form: Dudley's entropy integral, term by term (docs/bounds.md 9).

Each bound of the family is a sum of covering terms (one per matrix, or per feed-forward block, or per
stored matrix) plus ``sqrt(L)``; term ``t`` takes a Schatten index ``p`` from its grid and costs
``C_t(p)``.  For the ramp loss at margin ``margin`` (values in ``[0, 1]``) the leading term of the gap
is ``c_lead / sqrt(n)`` times ``int_0^1 sqrt(ln N(eps)) d eps`` with the loss class covered at ``eps``,
i.e. the network's output at ``margin * eps``.

**The budget.** Term ``t`` moves the output by at most ``sigma_t ||Delta W_t||_2`` (``sigma_t =
gamma* alpha_l``, or a block's or a stored matrix's); with ``T`` terms each covered at ``margin eps /
(T sigma_t)`` the errors add up to ``margin eps``.  So every term's scale in the gap form is
``scale_T = T sigma_t``: the headline's ``scale`` (``sigma_t`` times the ``budget_parts`` it splits the
budget into: ``L``, or the stored layers) with ``budget_parts`` replaced by ``T``, the covers actually
summed (``T = L (2H + 2)`` on a BERT-shaped model).

**One entropy for every index** (a rank truncation and Candes & Plan's net).  The class of term ``t`` at
index ``p`` is ``K = {W : S_p(W) <= S_p(W_t), ||W||_F <= rho = ||W_t||_F}`` (``a x b``; ``S_0`` the rank).
For ``W`` in ``K`` with singular values ``s_i``, the rank-``k`` truncation ``W_k`` has ``||W - W_k||_2 =
s_(k+1) <= tau_k``: ``tau_k = (S_p / (k + 1))^(1/p)`` for ``p > 0`` (the ``k + 1`` largest values are each
at least ``s_(k+1)``); for ``p = 0``, ``tau_k = 0`` once ``k >= r``.  ``W_k`` is a rank-``k`` matrix of
Frobenius norm at most ``rho``, with a Frobenius (so spectral) net of ``(9 rho / delta')^D_k`` elements,
``D_k = min(k (a + b + 1), a b)`` (Candes & Plan, IEEE Trans. Inf. Theory 57 (2011), Lemma 3.1; the dense
ball for ``a b``).  With ``k(delta)`` the least ``k`` with ``tau_k <= delta / 2`` and ``delta' = delta -
tau_k``,

    ln N(K, delta) <= D_k(delta) ln(9 rho / (delta - tau_k(delta))) <= D_k(delta) ln(c_p 9 rho / delta),

``c_0 = 1`` (``k = r``, ``tau = 0``: the rank class's entropy) and ``c_p = 2`` for ``p > 0``.  In output
units (``delta = margin eps / scale_T``), ``ln N_t(eps) <= D_k(eps) ln(A / eps)`` with ``A = c_p 9 scale_T
rho / margin``.  ``k(eps) >= j`` exactly when ``eps < e_j = (2 scale_T / margin) (S_p / j)^(1/p)``, so

    int_0^1 sqrt(ln N_t) = sum_j (sqrt(D_j) - sqrt(D_(j-1))) G(min(e_j, 1)),
    G(x) = int_0^x sqrt(max(0, ln(A / eps))) d eps = y I(ln(A / y)),   y = min(x, A),
    I(u) = int_0^1 sqrt(max(0, u - ln eps)) d eps = sqrt(u) + (sqrt(pi)/2) erfcx(sqrt(u))   (u >= 0)
         = e^u sqrt(pi) / 2                                                                  (u < 0),

and at ``p = 0`` (``k = r`` at every ``eps``) it is ``sqrt(D_r) I(ln A)``: the same formula.  ``I`` grows
like ``sqrt(ln A)``, with depth through ``scale``.

``sqrt(ln prod_t N_t) <= sum_t sqrt(ln N_t)``, so the terms add.  Each term takes the index of its grid
whose integral is smallest (ties to the smallest ``p``; a post-hoc choice like the headline's ``p*``, paid
by the same union cost), so the gap never widens with the margin, and ``log_factor`` is the ratio of the
integral to ``B_margin = sum_t C_t(p_t; scale_T / margin) + sqrt(L)`` at those indices.  ``sqrt(L)`` is not a
covering term and is kept as it is.  Dudley's absolute constant stays in
``c_lead``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import erfcx

from .schatten import ContributionCurve

# Candes & Plan's net: (9 rho / delta)^D elements for the rank-r class of Frobenius norm <= rho.
NET_CONSTANT = 9.0


@dataclass(frozen=True)
class CoveringTerm:
    """One covered parameter matrix (or block) of a spectrum-adaptive bound.

    Attributes
    ----------
    curve : ContributionCurve
        ``p -> C(p)`` (its ``kept`` values and the headline's ``log_scale``).
    grid : ndarray
        The Schatten indices the term may take (the post-hoc grid, or one fixed ``p``).
    dimension : int
        ``D``, the parametric dimension of its rank-``r`` class (``r = len(curve.kept)``): the
        coefficient of ``ln(R / eps)`` in its ``p = 0`` entropy.
    shape : (int, int)
        ``(a, b)`` of the covered matrix (a block-diagonal block: the sums of its blocks' sizes).
    dense_dimension : int
        The dimension of its dense ball: ``a b``, or the sum of a block-diagonal block's ``a_i b_i``.
    budget_parts : int
        How many parts the headline's ``scale`` splits the error budget into (its factor ``L``, or the
        number of stored layers): ``scale / budget_parts`` is the term's sensitivity ``sigma_t``.
    """

    curve: ContributionCurve
    grid: np.ndarray
    dimension: int
    shape: tuple[int, int]
    dense_dimension: int
    budget_parts: int

    def rank_dimensions(self, ranks: np.ndarray) -> np.ndarray:
        """``D_k = min(k (a + b + 1), dense_dimension)`` for each ``k`` of ``ranks``."""
        a, b = self.shape
        return np.minimum(np.asarray(ranks, dtype=np.float64) * (a + b + 1), float(self.dense_dimension))


def rank_class_dimension(rows: int, cols: int, rank: int) -> int:
    """``min(r (a + b + 1), a b)``: the exponent of a cover of the rank-``r`` ``a x b`` matrices."""
    return int(min(rank * (rows + cols + 1), rows * cols)) if rank > 0 else 0


def matrix_term(
    spectrum, *, log_scale: float, n: int, rank_tol: float, grid: np.ndarray, budget_parts: int
) -> CoveringTerm:
    """The covering term of one matrix (``spectrum``: what its complexity measures; ``log_scale`` the
    headline's, which splits the budget into ``budget_parts``)."""
    curve = ContributionCurve(spectrum, log_scale=log_scale, n=n, rank_tol=rank_tol)
    rows, cols = spectrum.shape
    return CoveringTerm(
        curve,
        np.asarray(grid, dtype=np.float64),
        rank_class_dimension(rows, cols, curve.kept.size),
        (int(rows), int(cols)),
        int(rows) * int(cols),
        int(budget_parts),
    )


def dudley_log_integral(a):
    """``I(a) = int_0^1 sqrt(max(0, a - ln eps)) d eps`` (see the module docstring); ``a = ln R``
    (a scalar or an array)."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        root = np.sqrt(np.maximum(a, 0.0))
        out = np.where(
            a <= 0, np.exp(np.minimum(a, 0.0)) * math.sqrt(math.pi) / 2, root + math.sqrt(math.pi) / 2 * erfcx(root)
        )
    return float(out) if out.ndim == 0 else out


def log_radius(curve: ContributionCurve) -> float:
    """``ln(9 scale ||W||_F)`` at the curve's own ``log_scale``, ``||W||_F`` over the kept values (``-inf``
    for none)."""
    if curve.kept.size == 0:
        return -math.inf
    return math.log(NET_CONSTANT) + curve.log_scale + 0.5 * math.log(float(np.sum(curve.kept**2)))


def truncation_ranks(term: CoveringTerm, p: float) -> np.ndarray:
    """``1, 2, ..., k_max``: the ranks a cover of the term's index-``p`` class may truncate to (``k_max =
    min(a, b)`` for ``p > 0``; the rank ``r`` itself at ``p = 0``)."""
    return np.array([term.curve.kept.size]) if p == 0 else np.arange(1, min(term.shape) + 1)


def log_covering_number(term: CoveringTerm, p: float, eps, log_scale: float) -> np.ndarray:
    """``ln N_t(eps)`` of the module docstring: ``D_k(eps) max(0, ln(c_p 9 scale rho / eps))`` for the
    class at index ``p`` covered at output resolution ``eps`` (``log_scale``: ``ln(scale_T / margin)``).
    The entropy :func:`term_integral` integrates (its closed form); shape of ``eps``."""
    eps = np.asarray(eps, dtype=np.float64)
    kept = term.curve.kept
    if kept.size == 0:
        return np.zeros_like(eps)
    log_a = log_radius(ContributionCurve.from_kept(kept, log_scale=log_scale, n=term.curve.n)) + (
        0.0 if p == 0 else math.log(2.0)
    )
    if p == 0:
        dims = np.full_like(eps, float(term.dimension))
    else:  # k(eps) = #{j <= k_max : eps < e_j}
        j = truncation_ranks(term, p)
        log_e = math.log(2.0) + log_scale + (math.log(float(np.sum(kept**p))) - np.log(j)) / p
        k = np.sum(np.log(eps)[..., None] < log_e, axis=-1)
        dims = np.where(k > 0, term.rank_dimensions(np.maximum(k, 1)), 0.0)
    return dims * np.maximum(0.0, log_a - np.log(eps))


def term_integral(term: CoveringTerm, p: float, log_scale: float) -> float:
    """``int_0^1 sqrt(ln N_t(eps)) d eps`` at index ``p`` (:func:`log_covering_number`), in closed form:
    ``sum_j (sqrt(D_j) - sqrt(D_(j-1))) G(min(e_j, 1))``; ``log_scale = ln(scale_T / margin)``."""
    kept = term.curve.kept
    if kept.size == 0:
        return 0.0
    log_a = log_radius(ContributionCurve.from_kept(kept, log_scale=log_scale, n=term.curve.n))
    if p == 0:
        return math.sqrt(term.dimension) * float(dudley_log_integral(log_a))
    log_a += math.log(2.0)
    j = truncation_ranks(term, p)
    log_e = math.log(2.0) + log_scale + (math.log(float(np.sum(kept**p))) - np.log(j)) / p
    log_y = np.minimum(np.minimum(log_e, 0.0), log_a)  # y = min(e_j, 1, A)
    roots = np.sqrt(term.rank_dimensions(j))
    steps = np.diff(roots, prepend=0.0)
    with np.errstate(under="ignore"):
        return float(np.sum(steps * np.exp(log_y) * dudley_log_integral(log_a - log_y)))


def gap_log_scales(terms: list[CoveringTerm], margin: float) -> list[float]:
    """Each term's ``ln(scale_T / margin)``: the headline's scale with its ``budget_parts`` replaced by
    ``T``, the number of terms covered (those with a nonzero matrix; a zero one is its own cover)."""
    covered = sum(1 for term in terms if term.curve.kept.size)
    log_t = math.log(max(covered, 1))
    return [term.curve.log_scale - math.log(term.budget_parts) + log_t - math.log(margin) for term in terms]


def gap_complexity(terms: list[CoveringTerm], sqrt_l: float, margin: float) -> dict[str, float]:
    """The entropy integral (each term at the index of its grid with the smallest integral), ``B_margin``
    (each term's ``C(p_t; scale_T / margin)`` at that index) and their ratio.

    Returns ``{"complexity", "integral", "log_factor"}``; ``inf`` where a value exceeds float64.
    """
    complexity, integral = sqrt_l, sqrt_l
    for term, log_scale in zip(terms, gap_log_scales(terms, margin)):
        if term.curve.kept.size == 0:
            continue
        values = [term_integral(term, float(p), log_scale) for p in term.grid]
        best = int(np.argmin(values))  # ties go to the smallest p
        curve = ContributionCurve.from_kept(term.curve.kept, log_scale=log_scale, n=term.curve.n)
        complexity += curve(float(term.grid[best]))
        integral += values[best]
    ratio = integral / complexity if 0 < complexity < math.inf and integral < math.inf else math.nan
    return {"complexity": complexity, "integral": integral, "log_factor": ratio}
