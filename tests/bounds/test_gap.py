"""Generalisation-gap bounds in this project's proxy forms (SPEC section 7, docs/bounds.md section 9)."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specbound
from specbound.bounds import REGISTRY, compute_all
from specbound.errors import SpecboundError
from specbound.bounds.gap import GapParameters, gap_bounds, gap_terms
from specbound.bounds.schatten import default_grid_m
from specbound.compute.measures import measure
from support.hand_model import HAND_DIMS, hand_layers


def test_gap_terms_by_hand():
    params = GapParameters(n=100, margin=0.5, delta=math.exp(-1))
    # leading 10 * 2 / (0.5 * 10) = 4; confidence sqrt((1 + 3) / 100) = 0.2
    t = gap_terms(10.0, 2.0, 3.0, params)
    assert t["leading"] == pytest.approx(4.0) and t["confidence"] == pytest.approx(0.2)
    assert t["gap"] == pytest.approx(4.2) and t["vacuous"] is True
    t = gap_terms(0.1, 2.0, 3.0, params)
    assert t["gap"] == pytest.approx(0.24) and t["vacuous"] is False
    t = gap_terms(10.0, 2.0, 3.0, GapParameters(n=100, margin=0.5, delta=math.exp(-1), lead_constant=0.5,
                                                  confidence_constant=2.0))
    assert t["gap"] == pytest.approx(2.0 + 0.4)


def _entropy_oracle(ms, margin, fixed_p=None):
    """The spectrum-adaptive gap's numerator restated from docs/bounds.md section 9, by quadrature:
    each matrix at the grid minimiser of ``C(p; scale / margin)``; at ``p = 0``
    ``sqrt(D) int_0^1 sqrt(ln(9 scale ||W||_F / (margin eps))) d eps``, ``D = min(r (a + b + 1), a b)``;
    at ``p > 0`` ``C (p + 2) / 2``.  Returns ``(B_margin, integral)``."""
    from scipy.integrate import quad

    from specbound.bounds.schatten import kept_singular_values, schatten_grid

    grid = schatten_grid(ms.grid_m) if fixed_p is None else np.array([float(fixed_p)])
    n = ms.dims.N
    complexity = integral = math.sqrt(ms.dims.L)
    for mm in ms.matrices:
        s = kept_singular_values(mm.target, 1e-10)
        if s.size == 0:
            continue
        c = [float(np.sum(s**p) if p else s.size) ** (1 / (p + 2)) * (mm.scale / margin) ** (p / (p + 2))
             * n ** ((p + 1) / (p + 2)) for p in grid]
        best = int(np.argmin(c))
        p = grid[best]
        complexity += c[best]
        if p == 0:
            a, b = mm.target.shape
            dim = min(s.size * (a + b + 1), a * b)
            log_r = math.log(9 * mm.scale * math.sqrt(np.sum(s**2)) / margin)
            # t = -ln eps: int_0^inf sqrt(max(0, log_r + t)) e^-t dt
            value, _ = quad(lambda t: math.sqrt(max(0.0, log_r + t)) * math.exp(-t), max(0.0, -log_r), math.inf)
            integral += math.sqrt(dim) * value
        else:
            integral += c[best] * (p + 2) / 2
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
    assert g["gap"] == pytest.approx(integral / math.sqrt(n) + math.sqrt((math.log(100) + 8 * math.log(9)) / n),
                                     rel=1e-9)
    for p in (0, 1, 2):
        complexity, integral = _entropy_oracle(ms, 1.0, fixed_p=p)
        assert gaps[f"spectral_fixed_p{p}"]["leading"] == pytest.approx(integral / math.sqrt(n), rel=1e-9)
    assert {k for k, v in gaps.items() if v["margin_form"].startswith("inside")} == {
        k for k in gaps if k.startswith("spectral_")}


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
@given(st.floats(0.01, 100.0), st.sampled_from(["spectral_adaptive", "spectral_three_type", "spectral_fixed_p0",
                                                "spectral_fixed_p2", "spectral_shared"]))
def test_a_wider_margin_never_widens_the_adaptive_gap(margin, name):
    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    narrow = gap_bounds(ms, results, GapParameters(n=1000, margin=margin))[name]
    wide = gap_bounds(ms, results, GapParameters(n=1000, margin=2 * margin))[name]
    assert wide["gap"] <= narrow["gap"] * (1 + 1e-12)


def test_dudley_integral_closed_form():
    from scipy.integrate import quad

    from specbound.bounds.covering import dudley_log_integral

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


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=1, margin=1.0), "n "), (dict(n=10.5, margin=1.0), "n "), (dict(n=True, margin=1.0), "n "),
    (dict(n=10, margin=0.0), "margin"), (dict(n=10, margin=math.inf), "margin"),
    (dict(n=10, margin=1.0, delta=1.0), "delta"), (dict(n=10, margin=1.0, delta=0), "delta"),
    (dict(n=10, margin=1.0, lead_constant=-1), "lead_constant"),
])
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
    assert g["parameters"] == {"n": 5000, "margin": 0.25, "delta": 0.1, "lead_constant": 1.0,
                               "confidence_constant": 1.0}
    assert g["loss_range"] == [0.0, 1.0] and "unstated" in g["assumptions"]
    assert g["kind"] != "theorem" and "theorems' forms" not in g["assumptions"] and "proxies" in g["assumptions"]
    for name, terms in g["bounds"].items():
        assert terms["vacuous"] == (terms["gap"] >= 1), name
        assert terms["gap"] == pytest.approx(terms["leading"] + terms["confidence"])
    assert "gap_bound" not in specbound.analyze(src, threads=1).to_dict()


def test_covering_terms_restate_each_bound():
    """At margin 1 the covering terms' minima add up to the bound's own value, for every bound of the
    spectrum-adaptive family (the gap form covers the class the bound measures)."""
    from specbound.bounds.covering import gap_complexity

    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    family = [name for name, b in REGISTRY.items() if b.covering_terms is not None and name in results]
    assert {"spectral_adaptive", "spectral_three_type", "spectral_shared", "spectral_fixed_p1"} <= set(family)
    for name in family:
        form = gap_complexity(REGISTRY[name].covering_terms(ms), math.sqrt(HAND_DIMS.L), 1.0)
        assert form["complexity"] == pytest.approx(results[name].value, rel=1e-12), name


@pytest.fixture(scope="module")
def minilm_gaps():
    return {margin: specbound.analyze(threads=1, n=10**6, margin=margin) for margin in (1.0, 1.8)}


def test_the_default_models_gap_carries_the_derived_entropy_integral(minilm_gaps):
    """all-MiniLM-L6-v2 at n = 10^6, margin 1: every matrix at p* = 0, so the leading term is
    ``(sum_i sqrt(D_i) I(ln(9 scale_i ||W_i||_F)) + sqrt(6)) / 10^3`` (docs/bounds.md 9), restated from
    the matrices table by quadrature: a log factor well above 1, not the former 1."""
    from scipy.integrate import quad

    a = minilm_gaps[1.0]
    m = a.matrices
    assert (m["p_star"] == 0).all()
    integral = math.sqrt(6)
    for row in m.itertuples():
        log_r = math.log(9) + row.log10_scale * math.log(10) + math.log(row.frobenius_norm)
        value, _ = quad(lambda t: math.sqrt(max(0.0, log_r + t)) * math.exp(-t), 0, math.inf)
        integral += math.sqrt(min(row.rank * (row.rows + row.cols + 1), row.rows * row.cols)) * value
    g = a.gap_bound["bounds"]["spectral_adaptive"]
    assert g["log_factor"] == pytest.approx(integral / a.bounds["spectral_adaptive"], rel=1e-8)
    assert g["log_factor"] > 5 and g["leading"] == pytest.approx(integral / 1000, rel=1e-8)


def test_a_margin_above_one_never_lowers_the_headline_below_the_margin_inside_form(minilm_gaps):
    """At margin 1.8 the former headline divided B by the margin (11.45 on this model) while the
    margin-inside form is B_margin / sqrt(n) + confidence (20.60): the headline is at least the latter."""
    a = minilm_gaps[1.8]
    g = a.gap_bound["bounds"]["spectral_adaptive"]
    inside = g["complexity"] / 1000 + g["confidence"]
    outside = a.bounds["spectral_adaptive"] / (1.8 * 1000) + g["confidence"]
    assert g["gap"] >= inside > 1.5 * outside
    assert g["margin_form"].startswith("inside")
