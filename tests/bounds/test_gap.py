"""Generalisation-gap bounds in the theorem's form (SPEC section 7)."""

import json
import math

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


def test_gap_bounds_on_hand_model():
    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    n, params = 10_000, GapParameters(n=10_000, margin=1.0, delta=0.01)
    gaps = gap_bounds(ms, results, params)
    # measures without a margin-bound form get none
    assert set(gaps) == {k for k, b in REGISTRY.items() if b.log_factor is not None and (b.applies is None or b.applies(ms))}
    assert not {"param_count", "spectral_product", "frobenius_product"} & set(gaps)
    # 8 matrices, m = 4: the grid costs 8 ln 9; three types: 2 heads' QK/OV + 2 FF blocks -> 6 ln 9
    assert gaps["spectral_adaptive"]["union_cost"] == pytest.approx(8 * math.log(9))
    assert gaps["spectral_three_type"]["union_cost"] == pytest.approx(6 * math.log(9))
    assert gaps["spectral_fixed_p0"]["union_cost"] == 0
    assert gaps["nbs"]["union_cost"] == pytest.approx(math.log(8 * n))
    assert gaps["spectral_adaptive"]["log_factor"] == 1.0  # Dudley's integral converges: no ln n (docs/bounds.md 9)
    assert gaps["bft"]["log_factor"] == pytest.approx(math.log(16) * math.log(n))  # ln(2W) ln n, W = 8
    b = results["spectral_adaptive"].value
    assert gaps["spectral_adaptive"]["gap"] == pytest.approx(
        b / math.sqrt(n) + math.sqrt((math.log(100) + 8 * math.log(9)) / n))
    # margin 1: the margin-inside form is the same bound
    inside = gaps["spectral_adaptive"]["margin_inside"]
    assert inside["complexity"] == pytest.approx(b, rel=1e-12) and inside["gap"] == pytest.approx(
        gaps["spectral_adaptive"]["gap"], rel=1e-12)
    assert set(gaps) - {"spectral_adaptive"} == {k for k in gaps if "margin_inside" not in gaps[k]}


@pytest.mark.parametrize("margin", [0.01, 0.3, 3.0, 100.0])
def test_margin_inside_scales_each_term_by_its_own_power(margin):
    """``B_margin = sum_i min_p margin^(-p/(p+2)) C_i(p) + sqrt(L)``, checked term by term on the grid."""
    from specbound.bounds.schatten import ContributionCurve, schatten_grid

    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    results = compute_all(ms)
    gaps = gap_bounds(ms, results, GapParameters(n=1000, margin=margin))
    grid = schatten_grid(ms.grid_m)
    expected = math.sqrt(HAND_DIMS.L)
    for mm in ms.matrices:
        c = ContributionCurve(mm.target, log_scale=mm.log_scale, n=HAND_DIMS.N, rank_tol=1e-10).on_grid(grid)
        expected += min(margin ** (-p / (p + 2)) * v for p, v in zip(grid, c))
    inside = gaps["spectral_adaptive"]["margin_inside"]
    assert inside["complexity"] == pytest.approx(expected, rel=1e-10)
    assert inside["leading"] == pytest.approx(expected / math.sqrt(1000), rel=1e-10)  # no 1/margin outside
    # never above the outside form's complexity scaled the worse way, never below the margin-free rank terms
    assert inside["complexity"] <= max(1.0, 1 / margin) * results["spectral_adaptive"].value * (1 + 1e-12)


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
    for name, terms in g["bounds"].items():
        assert terms["vacuous"] == (terms["gap"] >= 1), name
        assert terms["gap"] == pytest.approx(terms["leading"] + terms["confidence"])
    assert "gap_bound" not in specbound.analyze(src, threads=1).to_dict()
