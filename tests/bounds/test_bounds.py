"""Every registered bound: a value computed by hand on a hand-built two-layer model, and the
properties it must have (bracketing, invariance under balanced rescaling, monotonicity)."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from support.hand_model import HAND_DIMS, hand_layers, spec

from specbound.archs.model import LatentDims, LayerWeights, MixtureOfExperts, ModelDims
from specbound.bounds import REGISTRY, compute_all, in_group
from specbound.bounds.param_count import parameter_count
from specbound.bounds.schatten import ContributionCurve, continuous_minima, default_grid_m
from specbound.compute.layer_spectra import LayerSpectra, layer_spectra
from specbound.compute.measures import measure
from specbound.options import KernelOptions

REL = 1e-9


@pytest.fixture(scope="module")
def hand():
    ms = measure(hand_layers(), HAND_DIMS, l_phi=1.0, rank_tol=1e-10, grid_m=default_grid_m(HAND_DIMS.L, HAND_DIMS.N))
    return ms, compute_all(ms)


def test_hand_model_propagation(hand):
    ms, _ = hand
    assert ms.lambdas == pytest.approx([20, 9], rel=REL)
    assert ms.alphas == pytest.approx([9, 1], rel=REL)
    assert ms.grid_m == 4  # ceil(2 + ln 4)


def test_spectral_product(hand):
    _, r = hand
    assert r["spectral_product"].value == pytest.approx(180, rel=REL)


def test_bft(hand):
    _, r = hand
    # ||W||_{2,1} / ||W||_2: layer 0: 2, 1.5, 2, 2; layer 1: 2, 2, 1.5, 4/3
    terms = 5 * 2 ** (2 / 3) + 2 * 1.5 ** (2 / 3) + (4 / 3) ** (2 / 3)
    assert r["bft"].value == pytest.approx(180 * terms**1.5, rel=REL)
    assert r["bft"].per_layer["bft_terms"] == pytest.approx(
        [3 * 2 ** (2 / 3) + 1.5 ** (2 / 3), 2 * 2 ** (2 / 3) + 1.5 ** (2 / 3) + (4 / 3) ** (2 / 3)], rel=REL
    )


def test_nbs(hand):
    _, r = hand
    # stable ranks F^2 / c^2: 1.25, 1, 1.25, 1 | 1, 2, 1, 1 -> 9.5; D = 8 matrices, h = max(4, 8) = 8
    expected = 8 * math.sqrt(8 * math.log(64)) * 180 * math.sqrt(9.5)
    assert r["nbs"].value == pytest.approx(expected, rel=REL)


def test_l11_proxy(hand):
    _, r = hand
    # weights (c_out c_in c_OV, c_out c_in, c_out, 1): layer 0 (4, 2, 1, 1), layer 1 (3, 3, 3, 1)
    xi0 = 12 ** (2 / 3) + 8 ** (2 / 3) + 6 ** (2 / 3) + 2.5 ** (2 / 3)
    xi1 = 4.5 ** (2 / 3) + 9 ** (2 / 3) + 6 ** (2 / 3) + 5 ** (2 / 3)
    assert r["l11_proxy"].per_layer["xi_1_1"] == pytest.approx([xi0, xi1], rel=REL)
    assert r["l11_proxy"].value == pytest.approx((1 + 9 ** (2 / 3) * xi0 + xi1) ** 1.5, rel=REL)


def test_edelman_on_hand_model(hand):
    _, r = hand
    xi0 = 8 ** (2 / 3) + 6 ** (2 / 3) + 4 ** (2 / 3) + 2 ** (2 / 3)
    xi1 = 3 ** (2 / 3) + 6 ** (2 / 3) + 4.5 ** (2 / 3) + 4 ** (2 / 3)
    assert r["edelman"].value == pytest.approx((1 + 9 ** (2 / 3) * xi0 + xi1) ** 1.5, rel=REL)


def test_frobenius_product(hand):
    _, r = hand
    lam_f0 = math.sqrt(5) * 1 * 2 * (1 + 4 * math.sqrt(1.25))
    lam_f1 = 1 * 3 * math.sqrt(2) * (1 + 4 * 0.5)
    assert r["frobenius_product"].value == pytest.approx(lam_f0 * lam_f1, rel=REL)


def test_param_count(hand):
    _, r = hand
    # per layer: q, k, v, o: 4 * (4 * 1 * 2) = 32; feed-forward 2 * 4 * 8 = 64
    assert r["param_count"].value == 2 * (32 + 64)


def test_fixed_p_variants(hand):
    ms, r = hand
    # ranks 2, 1, 2, 1 | 1, 2, 1, 1 and N = 4: C(0) = sqrt(4 r)
    assert r["spectral_fixed_p0"].value == pytest.approx(3 * math.sqrt(8) + 5 * 2 + math.sqrt(2), rel=REL)
    # scale = gamma* alpha L; gamma*: layer 0 (8, 2, 1, 1), layer 1 (6, 3, 3, 1); alpha (9, 1); L = 2
    scales = [144, 36, 18, 18, 12, 6, 6, 2]
    s2 = [1.25, 4, 5, 1, 0.25, 2, 1, 9]  # S_2 = ||W||_F^2
    c2 = [s**0.25 * k**0.5 * 4**0.75 for s, k in zip(s2, scales)]
    assert r["spectral_fixed_p2"].value == pytest.approx(sum(c2) + math.sqrt(2), rel=REL)
    s1 = [1.5, 2, 3, 1, 0.5, 2, 1, 3]  # nuclear norms
    c1 = [s ** (1 / 3) * k ** (1 / 3) * 4 ** (2 / 3) for s, k in zip(s1, scales)]
    assert r["spectral_fixed_p1"].value == pytest.approx(sum(c1) + math.sqrt(2), rel=REL)
    assert r["spectral_fixed_p1"].per_layer["adaptive_p1"] == pytest.approx([sum(c1[:4]), sum(c1[4:])], rel=REL)


def test_three_type_feed_forward_block(hand):
    ms, r = hand
    res = r["spectral_three_type"]
    # block diag(FF_in, FF_out): rank 2 + 1 in layer 0, 1 + 1 in layer 1; its scale is
    # 2 max(gamma*_in, gamma*_out) alpha L = 36 and 12, far above the spectrum, so p* = 0:
    # C_F(0) = sqrt((r_in + r_out) N)
    assert res.per_layer["three_type_ff_p_star"].tolist() == [0, 0]
    assert res.per_layer["three_type_ff"] == pytest.approx([math.sqrt(12), math.sqrt(8)], rel=REL)
    adaptive = r["spectral_adaptive"]
    attention = sum(c for c, mm in zip(adaptive.per_matrix["contribution"], ms.matrices) if mm.role in ("QK", "OV"))
    assert res.value == pytest.approx(attention + math.sqrt(12) + math.sqrt(8) + math.sqrt(2), rel=REL)


def test_three_type_picks_a_positive_index_when_the_scale_is_small():
    # one layer, tiny norms: the block's C_F(p) is minimised away from p = 0
    nn, nf, fn = (64, 64), (64, 64), (64, 64)
    s = 1e-3 * np.ones(64)
    layer = LayerSpectra(
        0, qk=[spec(nn, s, 1, 1)], ov=[spec(nn, s, 1, 1)], ff={"FF_in": spec(nf, s, 1, 1), "FF_out": spec(fn, s, 1, 1)}
    )
    ms = measure(
        [layer],
        ModelDims(L=1, N=64, H=1, H_kv=1, d_head=64, d_ff=64),
        l_phi=1.0,
        rank_tol=1e-10,
        grid_m=default_grid_m(1, 64),
    )
    res = REGISTRY["spectral_three_type"].compute(ms)
    p = res.per_layer["three_type_ff_p_star"][0]
    assert p > 0
    # by hand at that p: S_p = 128 * (1e-3)^p, scale = 2 * max(c_out, 1) * alpha * L = 2
    expected = (128 * 1e-3**p) ** (1 / (p + 2)) * 2 ** (p / (p + 2)) * 64 ** ((p + 1) / (p + 2))
    assert res.per_layer["three_type_ff"][0] == pytest.approx(expected, rel=REL)


def test_groups_and_references():
    assert set(in_group("bounds")) == {"spectral_adaptive", "edelman"}
    assert {"bft", "nbs", "l11_proxy", "frobenius_product", "spectral_product", "param_count"} <= set(
        in_group("baselines")
    )
    assert {"spectral_fixed_p0", "spectral_fixed_p1", "spectral_fixed_p2", "spectral_three_type"} <= set(
        in_group("adaptive_variants")
    )
    for bound in REGISTRY.values():
        assert bound.reference and bound.title and bound.needs, bound.name


# ---- properties on random layers built from real matrices --------------------------------------


def random_weights(rng, layer, n, heads, d_head, d_ff, scales):
    q, k, v, o, fi, fo = scales

    def g(*shape):
        return rng.standard_normal(shape)

    return LayerWeights(
        layer,
        q * g(heads, d_head, n),
        k * g(heads, d_head, n),
        v * g(heads, d_head, n),
        o * g(heads, d_head, n),
        {"FF_in": fi * g(n, d_ff), "FF_out": fo * g(d_ff, n)},
    )


@st.composite
def random_models(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    L = draw(st.integers(1, 3))
    n, heads, d_head, d_ff = 8, 2, 2, 12
    rng = np.random.default_rng(seed)
    exps = draw(st.lists(st.lists(st.floats(-2, 1), min_size=6, max_size=6), min_size=L, max_size=L))
    weights = [random_weights(rng, l, n, heads, d_head, d_ff, [10.0**e for e in exps[l]]) for l in range(L)]
    return weights, ModelDims(L=L, N=n, H=heads, H_kv=heads, d_head=d_head, d_ff=d_ff)


def results_for(weights, dims):
    layers = [layer_spectra(w, KernelOptions()) for w in weights]
    ms = measure(layers, dims, l_phi=1.13, rank_tol=1e-10, grid_m=default_grid_m(dims.L, dims.N))
    return ms, compute_all(ms)


@settings(max_examples=25, deadline=None)
@given(random_models())
def test_adaptive_is_below_every_fixed_p_and_three_type_below_p0(model):
    _, r = results_for(*model)
    adaptive = r["spectral_adaptive"]
    for p in (0, 1, 2):
        fixed = r[f"spectral_fixed_p{p}"]
        assert adaptive.value <= fixed.value * (1 + 1e-12)
        assert np.all(adaptive.per_layer["adaptive"] <= fixed.per_layer[f"adaptive_p{p}"] * (1 + 1e-12))
    assert r["spectral_three_type"].value <= r["spectral_fixed_p0"].value * (1 + 1e-12)


@settings(max_examples=25, deadline=None)
@given(random_models())
def test_l11_proxy_dominates_edelman_and_frobenius_dominates_spectral(model):
    _, r = results_for(*model)
    assert r["l11_proxy"].value >= r["edelman"].value * (1 - 1e-12)
    assert r["frobenius_product"].value >= r["spectral_product"].value * (1 - 1e-12)


BALANCE_INVARIANT = ("bft", "nbs", "spectral_product", "frobenius_product", "param_count")


@settings(max_examples=20, deadline=None)
@given(random_models(), st.floats(0.1, 10))
def test_balanced_rescaling_invariance(model, t):
    """(t FF_in^l, FF_out^l / t) and (t FF_in^0, FF_in^1 / t) compute the same function up to the
    activation's homogeneity; products of layer norms must not see them."""
    weights, dims = model
    _, base = results_for(weights, dims)
    w = [LayerWeights(x.layer, x.q, x.k, x.v, x.o, {r: m.copy() for r, m in x.ff.items()}) for x in weights]
    w[0].ff["FF_in"] *= t  # within layer 0: Lambda_0 unchanged
    w[0].ff["FF_out"] /= t
    if dims.L > 1:  # across layers: Lambda_0 / t, Lambda_{L-1} * t
        w[0].ff["FF_out"] /= t
        w[-1].ff["FF_in"] *= t
    _, moved = results_for(w, dims)
    for name in BALANCE_INVARIANT:
        assert moved[name].value == pytest.approx(base[name].value, rel=1e-8), name


def test_edelman_is_not_balance_invariant():
    """The chain-structured proxies weight FF_out by 1 and FF_in by c(FF_out): a balanced rescaling
    changes them (a documented property, docs/bounds.md)."""
    rng = np.random.default_rng(3)
    dims = ModelDims(L=1, N=8, H=2, H_kv=2, d_head=2, d_ff=12)
    w = random_weights(rng, 0, 8, 2, 2, 12, [1] * 6)
    _, base = results_for([w], dims)
    w2 = LayerWeights(0, w.q, w.k, w.v, w.o, {"FF_in": 10 * w.ff["FF_in"], "FF_out": w.ff["FF_out"] / 10})
    _, moved = results_for([w2], dims)
    assert moved["edelman"].value != pytest.approx(base["edelman"].value, rel=1e-3)


@settings(max_examples=20, deadline=None)
@given(random_models(), st.floats(1.0, 10))
def test_monotone_in_the_last_feed_forward_norm(model, t):
    """Scaling the last layer's FF_out up grows every norm-based bound (its norms, and through
    Lambda_{L-1} every earlier layer's alpha)."""
    weights, dims = model
    _, base = results_for(weights, dims)
    last = weights[-1]
    w = weights[:-1] + [
        LayerWeights(
            last.layer, last.q, last.k, last.v, last.o, {"FF_in": last.ff["FF_in"], "FF_out": t * last.ff["FF_out"]}
        )
    ]
    _, grown = results_for(w, dims)
    for name in (
        "spectral_adaptive",
        "edelman",
        "bft",
        "nbs",
        "l11_proxy",
        "frobenius_product",
        "spectral_product",
        "spectral_fixed_p1",
        "spectral_fixed_p2",
        "spectral_three_type",
    ):
        assert grown[name].value >= base[name].value * (1 - 1e-12), name


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-6, 6), min_size=1, max_size=40), st.floats(-30, 60), st.integers(2, 5000))
def test_continuous_minimum_is_the_global_minimum(log_s, log_scale, n):
    """ln C is quasiconvex in p, so the minimiser found from the sign of its derivative is global:
    never above C anywhere on a fine grid, nor above any of several other curves' evaluations."""

    curve = ContributionCurve.from_kept(np.sort(np.exp(log_s))[::-1], log_scale=log_scale, n=n)
    p, value = continuous_minima([curve])
    fine = np.linspace(0.0, 2.0, 2001)
    assert value[0] <= curve.on_grid(fine).min() * (1 + 1e-12)
    assert 0.0 <= p[0] <= 2.0 and value[0] == pytest.approx(curve(float(p[0])), rel=1e-12)
    if 0.0 < p[0] < 2.0:  # an interior minimum: C is no smaller a little to either side
        for q in (p[0] - 1e-6, p[0] + 1e-6):
            assert value[0] <= curve(q) * (1 + 1e-14)


def test_continuous_minima_batch_equals_one_at_a_time():
    rng = np.random.default_rng(3)
    curves = [
        ContributionCurve.from_kept(np.sort(rng.lognormal(0, 1, r))[::-1], log_scale=rng.uniform(-5, 25), n=384)
        for r in (1, 5, 64, 300)
    ]
    curves.append(
        ContributionCurve.from_kept(np.array([]), log_scale=math.log(10.0), n=384)
    )  # nothing above the rank tolerance
    p, value = continuous_minima(curves)
    for i, curve in enumerate(curves):
        assert curve.continuous_minimum() == (p[i], value[i])
    assert (p[-1], value[-1]) == (0.0, 0.0)


@pytest.mark.parametrize("log_scale", [-3.0, -2.0, -1.0, -0.5])
def test_continuous_minimum_interior_root(log_scale):
    """Where the minimum is interior, d ln C / dp = 0 there (central difference), and a bounded
    scalar search (scipy) finds no smaller value."""

    curve = ContributionCurve.from_kept(np.array([3.0, 1.0, 0.2, 0.01]), log_scale=log_scale, n=100)
    p, value = curve.continuous_minimum()
    assert 0.0 < p < 2.0
    eps = 1e-5
    slope = (math.log(curve(p + eps)) - math.log(curve(p - eps))) / (2 * eps)
    assert abs(slope) < 1e-8
    other = minimize_scalar(lambda q: curve(q), bounds=(0.0, 2.0), method="bounded", options={"xatol": 1e-10})
    assert value <= other.fun * (1 + 1e-14) and p == pytest.approx(other.x, abs=1e-6)


def test_param_count_is_the_documented_formula_for_gated_blocks_experts_and_latent_attention():
    """docs/bounds.md 8's ``param_count``: ``k = 3`` for a gated block, every routed expert and the shared block
    counted (``k N (E d_ff + d_ff_shared)``), a dense layer among them ``k N d_ff_dense``, latent attention's stored
    projections (the page gave BERT's ``L (2 N H d_h + 2 N H_kv d_h + 2 N d_ff)`` for every family)."""

    text = (Path(__file__).resolve().parents[2] / "docs" / "bounds.md").read_text()
    for phrase in (
        "`k = 3` for a gated block",
        "`F_l = k N (E d_ff + d_ff_shared)`",
        "`k N d_ff_dense`",
        "`N r_q + r_q H (d_nope +\n    d_rope)`",
        "`+ r_kv H (d_nope + d_v)`",
    ):
        assert phrase in text, phrase
    N, H, H_kv, d_h, d_ff, E, shared, dense = 16, 4, 2, 4, 12, 5, 24, 40
    count = lambda dims: parameter_count(SimpleNamespace(dims=dims))  # noqa: E731
    attention = N * H * d_h + 2 * N * H_kv * d_h + H * d_h * N
    gated = ModelDims(L=3, N=N, H=H, H_kv=H_kv, d_head=d_h, d_ff=d_ff, feed_forward="gated")
    assert count(gated) == 3 * (attention + 3 * N * d_ff)
    moe = MixtureOfExperts(experts=E, top_k=2, shared_d_ff=shared, layers=(1, 2), dense_d_ff=dense)
    experts = ModelDims(L=3, N=N, H=H, H_kv=H_kv, d_head=d_h, d_ff=d_ff, feed_forward="gated", moe=moe)
    assert count(experts) == 3 * attention + 2 * 3 * N * (E * d_ff + shared) + 3 * N * dense
    r_q, r_kv, nope, rope, d_v = 6, 5, 3, 2, 4
    latent = LatentDims(q_rank=r_q, kv_rank=r_kv, d_nope=nope, d_rope=rope, d_v=d_v, q_eps=1e-6, kv_eps=1e-6)
    mla = ModelDims(L=2, N=N, H=H, H_kv=H, d_head=d_v, d_ff=d_ff, feed_forward="gated", latent=latent)
    mla_attention = N * r_q + r_q * H * (nope + rope) + N * (r_kv + rope) + r_kv * H * (nope + d_v) + H * d_v * N
    assert count(mla) == 2 * (mla_attention + 3 * N * d_ff)
