"""Generalisation-gap bounds in this project's proxy forms (SPEC section 7, docs/bounds.md section 9)."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad
from support.gap_oracle import entropy_integral
from support.hand_model import HAND_DIMS, hand_layers

import specbound
from specbound.bounds import REGISTRY, compute_all
from specbound.bounds.covering import (
    dudley_log_integral,
    gap_complexity,
    gap_log_scales,
    log_covering_number,
    matrix_term,
    term_integral,
)
from specbound.bounds.gap import GapParameters, gap_bounds, gap_terms
from specbound.bounds.schatten import default_grid_m, grid_minimum, kept_singular_values, schatten_grid
from specbound.compute.measures import measure
from specbound.compute.spectra import MatrixSpectrum
from specbound.errors import SpecboundError


def test_gap_terms_by_hand():
    params = GapParameters(n=100, margin=0.5, delta=math.exp(-1))
    # leading 10 * 2 / (0.5 * 10) = 4; confidence sqrt((1 + 3) / 100) = 0.2
    t = gap_terms(10.0, 2.0, 3.0, params)
    assert t["leading"] == pytest.approx(4.0) and t["confidence"] == pytest.approx(0.2)
    assert t["gap"] == pytest.approx(4.2) and t["vacuous"] is True
    t = gap_terms(0.1, 2.0, 3.0, params)
    assert t["gap"] == pytest.approx(0.24) and t["vacuous"] is False
    t = gap_terms(
        10.0, 2.0, 3.0, GapParameters(n=100, margin=0.5, delta=math.exp(-1), lead_constant=0.5, confidence_constant=2.0)
    )
    assert t["gap"] == pytest.approx(2.0 + 0.4)


def _entropy_oracle(ms, margin, fixed_p=None):
    """The spectrum-adaptive gap's numerator restated from docs/bounds.md section 9 (tests/support/
    gap_oracle.py): the error budget split over the ``T`` covered matrices (``scale_T = scale T / L``), each
    matrix at the index of the grid whose entropy integral is smallest, and ``C(p; scale_T / margin)`` there.
    Returns ``(B_margin, integral)``."""

    grid = schatten_grid(ms.grid_m) if fixed_p is None else np.array([float(fixed_p)])
    n = ms.dims.N
    kept = [kept_singular_values(mm.target, 1e-10) for mm in ms.matrices]
    t = sum(1 for s in kept if s.size)
    complexity = integral = math.sqrt(ms.dims.L)
    for mm, s in zip(ms.matrices, kept):
        if s.size == 0:
            continue
        scale = mm.scale * t / ms.dims.L
        values = [entropy_integral(s, *mm.target.shape, p, scale / margin) for p in grid]
        p = grid[int(np.argmin(values))]
        complexity += (
            float(np.sum(s**p) if p else s.size) ** (1 / (p + 2))
            * (scale / margin) ** (p / (p + 2))
            * n ** ((p + 1) / (p + 2))
        )
        integral += min(values)
    return complexity, integral


def test_gap_bounds_on_hand_model():
    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    n, params = 10_000, GapParameters(n=10_000, margin=1.0, delta=0.01)
    gaps = gap_bounds(ms, results, params)
    # measures without a margin-bound form get none
    assert set(gaps) == {k for k, b in REGISTRY.items() if b.has_gap_form and (b.applies is None or b.applies(ms))}
    assert not {"param_count", "spectral_product", "frobenius_product"} & set(gaps)
    # 8 matrices, m = 4: the grid costs 8 ln 9; three types: 2 heads' QK/OV + 2 FF blocks -> 6 ln 9
    assert gaps["spectral_adaptive"]["union_cost"] == pytest.approx(8 * math.log(9))
    assert gaps["spectral_three_type"]["union_cost"] == pytest.approx(6 * math.log(9))
    assert gaps["spectral_fixed_p0"]["union_cost"] == 0
    assert gaps["nbs"]["union_cost"] == pytest.approx(math.log(8 * n))
    assert gaps["bft"]["log_factor"] == pytest.approx(math.log(16) * math.log(n))  # ln(2W) ln n, W = 8
    # the spectrum-adaptive family: margin inside, each term's entropy integral (docs/bounds.md 9)
    b = results["spectral_adaptive"].value
    complexity, integral = _entropy_oracle(ms, 1.0)
    g = gaps["spectral_adaptive"]
    assert g["complexity"] == pytest.approx(b, rel=1e-12) == complexity  # margin 1: the bound itself
    assert g["log_factor"] == pytest.approx(integral / b, rel=1e-9) and g["log_factor"] > 1
    assert g["gap"] == pytest.approx(
        integral / math.sqrt(n) + math.sqrt((math.log(100) + 8 * math.log(9)) / n), rel=1e-9
    )
    for p in (0, 1, 2):
        complexity, integral = _entropy_oracle(ms, 1.0, fixed_p=p)
        assert gaps[f"spectral_fixed_p{p}"]["leading"] == pytest.approx(integral / math.sqrt(n), rel=1e-9)
    assert {k for k, v in gaps.items() if v["margin_form"].startswith("inside")} == {
        k for k in gaps if k.startswith("spectral_")
    }


@pytest.mark.parametrize("margin", [0.01, 0.3, 1.8, 100.0])
def test_the_margin_is_inside_each_term(margin):
    """The headline gap: ``B_margin = sum_i min_p margin^(-p/(p+2)) C_i(p) + sqrt(L)`` and each term's
    entropy integral at that margin, checked term by term; never below ``B_margin / sqrt(n)`` (the
    margin-inside form without the log factor), whatever the margin."""
    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    g = gap_bounds(ms, results, GapParameters(n=1000, margin=margin))["spectral_adaptive"]
    complexity, integral = _entropy_oracle(ms, margin)
    assert g["complexity"] == pytest.approx(complexity, rel=1e-10)
    assert g["leading"] == pytest.approx(integral / math.sqrt(1000), rel=1e-9)  # no 1/margin outside
    assert g["leading"] >= complexity / math.sqrt(1000)


@settings(max_examples=30, deadline=None)
@given(
    st.floats(0.01, 100.0),
    st.sampled_from(
        ["spectral_adaptive", "spectral_three_type", "spectral_fixed_p0", "spectral_fixed_p2", "spectral_shared"]
    ),
)
def test_a_wider_margin_never_widens_the_adaptive_gap(margin, name):
    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    narrow = gap_bounds(ms, results, GapParameters(n=1000, margin=margin))[name]
    wide = gap_bounds(ms, results, GapParameters(n=1000, margin=2 * margin))[name]
    assert wide["gap"] <= narrow["gap"] * (1 + 1e-12)


def test_dudley_integral_closed_form():
    for a in (-30.0, -2.0, -1e-9, 0.0, 1e-9, 0.5, 4.0, 62.0, 700.0, 1e5):
        value, _ = quad(lambda t: math.sqrt(max(0.0, a + t)) * math.exp(-t), max(0.0, -a), math.inf)
        assert dudley_log_integral(a) == pytest.approx(value, rel=1e-9), a
    assert dudley_log_integral(0.0) == pytest.approx(math.sqrt(math.pi) / 2)


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-3, 1e3), st.integers(10, 10**9), st.floats(0.01, 2.0))
def test_gap_shrinks_with_n_and_margin(value, n, margin):
    base = gap_terms(value, math.log(n), 5.0, GapParameters(n=n, margin=margin))
    more_data = gap_terms(value, math.log(2 * n), 5.0, GapParameters(n=2 * n, margin=margin))
    wider = gap_terms(value, math.log(n), 5.0, GapParameters(n=n, margin=2 * margin))
    assert more_data["gap"] < base["gap"] and wider["gap"] < base["gap"]
    assert base["vacuous"] == (base["gap"] >= 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=1, margin=1.0), "n "),
        (dict(n=10.5, margin=1.0), "n "),
        (dict(n=True, margin=1.0), "n "),
        (dict(n=10, margin=0.0), "margin"),
        (dict(n=10, margin=math.inf), "margin"),
        (dict(n=10, margin=1.0, delta=1.0), "delta"),
        (dict(n=10, margin=1.0, delta=0), "delta"),
        (dict(n=10, margin=1.0, lead_constant=-1), "lead_constant"),
    ],
)
def test_invalid_gap_parameters(kwargs, message):
    with pytest.raises(SpecboundError, match=message):
        GapParameters(**kwargs)


def test_analyze_needs_both_n_and_margin_before_reading_anything():
    with pytest.raises(SpecboundError, match="margin is missing"):
        specbound.analyze("/nonexistent/folder", n=1000)
    with pytest.raises(SpecboundError, match="n \\(the sample size\\) is missing"):
        specbound.analyze("/nonexistent/folder", margin=0.1)


def test_gap_bound_in_json(tiny_pair):
    src, _ = tiny_pair
    a = specbound.analyze(src, n=5000, margin=0.25, delta=0.1, threads=1)
    doc = json.loads(a.to_json())
    g = doc["gap_bound"]
    assert g["parameters"] == {
        "n": 5000,
        "margin": 0.25,
        "delta": 0.1,
        "lead_constant": 1.0,
        "confidence_constant": 1.0,
    }
    assert g["loss_range"] == [0.0, 1.0] and "unstated" in g["assumptions"]
    assert g["kind"] != "theorem" and "theorems' forms" not in g["assumptions"] and "proxies" in g["assumptions"]
    for name, terms in g["bounds"].items():
        assert terms["vacuous"] == (terms["gap"] >= 1), name
        assert terms["gap"] == pytest.approx(terms["leading"] + terms["confidence"])
    assert "gap_bound" not in specbound.analyze(src, threads=1).to_dict()


def test_covering_terms_restate_each_bound():
    """The covering terms' minima at the headline's scale add up to the bound's own value, for every
    bound of the spectrum-adaptive family (the gap form covers the classes the bound measures); the gap
    form splits the budget over the ``T`` terms it sums instead of the headline's ``L`` (or stored
    layers): at fixed ``p = 2`` every term's ``C`` grows by ``(T / L)^(1/2)``."""

    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    family = [name for name, b in REGISTRY.items() if b.covering_terms is not None and name in results]
    assert {"spectral_adaptive", "spectral_three_type", "spectral_shared", "spectral_fixed_p1"} <= set(family)
    root_l = math.sqrt(HAND_DIMS.L)
    for name in family:
        terms = REGISTRY[name].covering_terms(ms)
        assert sum(grid_minimum(t.curve, t.grid)[1] for t in terms) + root_l == pytest.approx(
            results[name].value, rel=1e-12
        ), name
        assert {t.budget_parts for t in terms} == {HAND_DIMS.L}, name  # nothing shared on the hand model
    terms = REGISTRY["spectral_fixed_p2"].covering_terms(ms)
    form = gap_complexity(terms, root_l, 1.0)
    assert len(terms) == 8 and form["complexity"] - root_l == pytest.approx(
        (results["spectral_fixed_p2"].value - root_l) * math.sqrt(8 / HAND_DIMS.L), rel=1e-12
    )


@pytest.fixture(scope="module")
def minilm_gaps():
    return {margin: specbound.analyze(threads=1, n=10**6, margin=margin) for margin in (1.0, 1.8)}


def test_the_default_models_gap_carries_the_derived_entropy_integral(minilm_gaps):
    """all-MiniLM-L6-v2 at n = 10^6, margin 1: every matrix at p* = 0, so the leading term is
    ``(sum_i sqrt(D_i) I(ln(9 scale_i (T / L) ||W_i||_F)) + sqrt(6)) / 10^3`` (docs/bounds.md 9: the budget
    split over the T = 156 covers summed, not the L = 6 layers), restated from the matrices table by
    quadrature: a log factor well above 1, not the former 1.  The gap is the issue's 196.70 (the budget
    split over L printed 187.43)."""

    a = minilm_gaps[1.0]
    m = a.matrices
    assert (m["p_star"] == 0).all() and len(m) == 156
    integral = math.sqrt(6)
    for row in m.itertuples():
        log_r = math.log(9 * 156 / 6) + row.log10_scale * math.log(10) + math.log(row.frobenius_norm)
        value, _ = quad(lambda t: math.sqrt(max(0.0, log_r + t)) * math.exp(-t), 0, math.inf)
        integral += math.sqrt(min(row.rank * (row.rows + row.cols + 1), row.rows * row.cols)) * value
    g = a.gap_bound["bounds"]["spectral_adaptive"]
    assert g["log_factor"] == pytest.approx(integral / a.bounds["spectral_adaptive"], rel=1e-8)
    assert g["log_factor"] > 5 and g["leading"] == pytest.approx(integral / 1000, rel=1e-8)
    assert g["gap"] == pytest.approx(196.70, abs=0.005)


def test_a_margin_above_one_never_lowers_the_headline_below_the_margin_inside_form(minilm_gaps):
    """At margin 1.8 the former headline divided B by the margin (11.45 on this model) while the
    margin-inside form is B_margin / sqrt(n) + confidence (20.60): the headline is at least the latter."""
    a = minilm_gaps[1.8]
    g = a.gap_bound["bounds"]["spectral_adaptive"]
    inside = g["complexity"] / 1000 + g["confidence"]
    outside = a.bounds["spectral_adaptive"] / (1.8 * 1000) + g["confidence"]
    assert g["gap"] >= inside > 1.5 * outside
    assert g["margin_form"].startswith("inside")


def _lower_entropy(s, a, b, p, log_delta):
    """A lower bound on ``ln N(K, delta)`` (external covers, spectral norm) of the class ``K = {S_p(W) <=
    S_p(s), ||W||_F <= ||s||}`` of ``a x b`` matrices: ``K`` holds every matrix supported on ``k`` rows
    (columns, the longer side) with ``||W||_2 <= t_k``, ``t_k = min((S_p / k)^(1/p), ||s|| / sqrt(k))``
    (rank ``k <= r`` and ``t_k = ||s|| / sqrt(k)`` at ``p = 0``): a ball of dimension ``k max(a, b)``, whose
    external covering number at ``delta`` is at least ``(t_k / (2 delta))^(k max(a, b))`` (volume)."""
    rho = math.sqrt(np.sum(s**2))
    k = np.arange(1, (s.size if p == 0 else min(a, b)) + 1)
    t = rho / np.sqrt(k) if p == 0 else np.minimum((np.sum(s**p) / k) ** (1 / p), rho / np.sqrt(k))
    return float(np.max(k * max(a, b) * (np.log(t / 2) - log_delta)))


def _table_terms(a):
    """Each matrix of an analysis as a covering term, from its tables (singular values, shape, scale)."""

    sv = a.singular_values
    return [
        matrix_term(
            MatrixSpectrum((row.rows, row.cols), sv[sv["matrix"] == i]["sigma"].to_numpy(), 0.0, 0.0),
            log_scale=row.log10_scale * math.log(10),
            n=a.model["N"],
            rank_tol=a.options["rank_tol"],
            grid=[0.0],
            budget_parts=a.model["L"],
        )
        for i, row in enumerate(a.matrices.itertuples())
    ]


def test_the_entropy_is_never_below_a_lower_bound_of_its_class(minilm_gaps):
    """Every index's entropy (docs/bounds.md 9: the rank truncation and Candes & Plan's net, the rank
    class at ``p = 0``) is an upper bound on the class's covering number, so it is never below the
    volumetric lower bound of :func:`_lower_entropy`, at any index of the grid and any resolution, on
    every matrix of all-MiniLM-L6-v2.  The former ``p > 0`` reading ``C(p)^2 (margin eps)^(-2p/(p+2))``,
    an entropy without a log factor, fell below it at ``p = 1/m``, ``eps = 1`` on all 156 matrices."""

    a = minilm_gaps[1.0]
    terms = _table_terms(a)
    logs = gap_log_scales(terms, 1.0)
    grid, n = schatten_grid(a.options["grid_m"]), a.model["N"]
    eps = np.array([1.0, 1e-3, 1e-12])
    former_below = 0
    for term, log_scale in zip(terms, logs):
        s, (rows, cols) = term.curve.kept, term.shape
        for p in grid:
            upper = log_covering_number(term, p, eps, log_scale)
            for e, u in zip(eps, upper):
                assert u >= _lower_entropy(s, rows, cols, p, math.log(e) - log_scale), (p, e)
        p = grid[1]
        former = np.sum(s**p) ** (2 / (p + 2)) * n ** (2 * (p + 1) / (p + 2)) * math.exp(log_scale * 2 * p / (p + 2))
        former_below += former < _lower_entropy(s, rows, cols, p, -log_scale)
    assert former_below == len(terms) == 156


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.lists(st.floats(-6, 3), min_size=1, max_size=9),
    st.integers(0, 24),
    st.floats(-10, 60),
    st.floats(-30, 0),
)
def test_the_entropy_bounds_a_lower_bound_on_random_classes(a, b, logs, index, log_scale, log_eps):
    s = np.sort(np.exp(np.array(logs[: min(a, b)])))[::-1]
    term = matrix_term(
        MatrixSpectrum((a, b), s, 0.0, 0.0),
        log_scale=log_scale,
        n=max(a, b),
        rank_tol=1e-10,
        grid=[0.0],
        budget_parts=1,
    )
    p = index / 12
    upper = float(log_covering_number(term, p, np.array([math.exp(log_eps)]), log_scale)[0])
    assert upper >= _lower_entropy(term.curve.kept, a, b, p, log_eps - log_scale)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 7),
    st.integers(1, 7),
    st.lists(st.floats(-4, 2), min_size=1, max_size=7),
    st.integers(1, 24),
    st.floats(-5, 40),
)
def test_the_closed_form_integral_is_the_entropys_integral(a, b, logs, index, log_scale):
    """``term_integral`` (the Abel sum over truncation ranks) against quadrature of ``log_covering_number``
    between its breakpoints."""

    s = np.sort(np.exp(np.array(logs[: min(a, b)])))[::-1]
    term = matrix_term(
        MatrixSpectrum((a, b), s, 0.0, 0.0),
        log_scale=log_scale,
        n=max(a, b),
        rank_tol=1e-10,
        grid=[0.0],
        budget_parts=1,
    )
    p = index / 12
    s = term.curve.kept
    f = lambda u: math.sqrt(float(log_covering_number(term, p, np.array([math.exp(-u)]), log_scale)[0])) * math.exp(-u)  # noqa: E731
    breaks = [-(math.log(18) + log_scale + 0.5 * math.log(np.sum(s**2)))]
    breaks += [-(math.log(2) + log_scale + (math.log(np.sum(s**p)) - math.log(j)) / p) for j in range(1, min(a, b) + 1)]
    breaks = sorted(u for u in breaks if 0 < u < 60)
    value = sum(quad(f, lo, hi, epsabs=0, epsrel=1e-12)[0] for lo, hi in zip([0] + breaks, breaks + [60]))
    assert term_integral(term, p, log_scale) == pytest.approx(value, rel=1e-9, abs=1e-300)
