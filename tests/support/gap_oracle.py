"""The spectrum-adaptive gap restated from docs/bounds.md section 9, independently of
``specbound.bounds.covering``: the entropy of each term's class at a resolution (a direct search for the
truncation rank), integrated by Gauss-Legendre quadrature between the points where it is not smooth."""

from __future__ import annotations

import math

import numpy as np

NODES, WEIGHTS = np.polynomial.legendre.leggauss(24)
U_MAX = 80.0  # eps = e^-u on (0, 1]: beyond u = 80 the integrand is below e^-80 of its size


def entropy(s, a, b, p, delta):
    """``ln N(K, delta)`` (``delta`` a scalar or an array) of the class ``{S_p(W) <= S_p(s), ||W||_F <= ||s||}``
    of ``a x b`` matrices: the least rank ``k`` whose truncation error bound ``tau_k = (S_p / (k + 1))^(1/p)``
    is at most ``delta / 2`` (``p = 0``: the rank), then Candes & Plan's net, ``min(k (a + b + 1), a b)
    ln(9 ||s|| / delta')`` with ``delta' = delta / 2`` (``delta`` at ``p = 0``)."""
    delta = np.asarray(delta, dtype=np.float64)
    rho = math.sqrt(float(np.sum(s**2)))
    if p == 0:
        k, net = np.full(delta.shape, s.size), delta
    else:
        kmax = min(a, b)
        tau = (float(np.sum(s**p)) / np.arange(1, kmax + 1)) ** (1 / p)  # tau_0 .. tau_(kmax - 1)
        fits = tau[None, :] <= delta.reshape(-1, 1) / 2
        k = np.where(fits.any(axis=1), np.argmax(fits, axis=1), kmax).reshape(delta.shape)
        net = delta / 2
    return np.minimum(k * (a + b + 1), a * b) * np.maximum(0.0, np.log(9 * rho / net))


def entropy_integral(s, a, b, p, scale_over_margin):
    """``int_0^1 sqrt(entropy(delta = eps / scale_over_margin)) d eps``, piece by piece in ``u = -ln eps``
    between the resolutions where the truncation rank changes, each piece in ``v = sqrt(u - u0)`` (``u0``
    where the entropy's log reaches 0), in which the integrand is smooth."""
    log_s = math.log(scale_over_margin)
    u0 = -(log_s + math.log(9 * math.sqrt(float(np.sum(s**2))) * (2 if p else 1)))
    breaks = (
        [-math.log(2) - log_s - math.log(float(np.sum(s**p)) / j) / p for j in range(1, min(a, b) + 1)] if p else []
    )
    start = max(0.0, u0)
    edges = np.array([start] + sorted(u for u in breaks if start < u < U_MAX) + [U_MAX])
    v_lo, v_hi = np.sqrt(edges[:-1] - u0), np.sqrt(edges[1:] - u0)
    v = (v_hi - v_lo)[:, None] / 2 * NODES[None, :] + (v_hi + v_lo)[:, None] / 2
    u = u0 + v**2
    values = np.sqrt(entropy(s, a, b, p, np.exp(-u) / scale_over_margin)) * np.exp(-u) * 2 * v
    return float(np.sum((v_hi - v_lo) / 2 * (values @ WEIGHTS)))


def adaptive_gap_integral(terms, grid, margin, sqrt_l):
    """``sum_t min_p int_0^1 sqrt(ln N_t) + sqrt(L)``: ``terms`` are ``(kept values, a, b, scale_T)`` with
    the budget split over the terms already in ``scale_T``; each term at the grid index with the smallest
    integral (docs/bounds.md 9)."""
    return sqrt_l + sum(
        min(entropy_integral(s, a, b, p, scale / margin) for p in grid) for s, a, b, scale in terms if s.size
    )
