"""Bounds measured from initial weights: spectra of W - W0, factored for QK/OV and checked dense."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.numpy_bert import row_weights, write_tiny_bert

import specbound
from specbound.archs.model import LayerWeights, ModelDims, RotaryLayout
from specbound.bounds import REGISTRY
from specbound.bounds.adaptive import SPECTRAL_ADAPTIVE
from specbound.bounds.schatten import default_grid_m
from specbound.compute.distance import difference_spectra, rotary_difference_spectra, stacked_difference
from specbound.compute.layer_spectra import layer_spectra
from specbound.compute.measures import measure
from specbound.compute.rotary import doubled_layout, rotations
from specbound.compute.spectra import dense_spectrum, factored_spectra, numerical_rank
from specbound.errors import SpecboundError
from specbound.options import DEFAULT_RANK_TOL as RANK_TOL
from specbound.options import KernelOptions

L, N, H, D_FF = 2, 16, 4, 24
D_HEAD = N // H


@st.composite
def factor_pairs(draw):
    heads, d = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    n = draw(st.integers(d, 20))  # 2d may exceed n: the core is then n x n
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a, b, a0, b0 = (rng.standard_normal((heads, d, n)) for _ in range(4))
    if draw(st.booleans()):  # W0 = W on one factor: the difference has rank <= d
        a0 = a.copy()
    return a, b, a0, b0


@settings(max_examples=50, deadline=None)
@given(factor_pairs())
def test_factored_difference_equals_dense(factors):
    a, b, a0, b0 = factors
    for h, fs in enumerate(factored_spectra(*stacked_difference(a, b, a0, b0))):
        dense = a[h].T @ b[h] - a0[h].T @ b0[h]
        ds = dense_spectrum(dense)
        k = fs.singular_values.size
        np.testing.assert_allclose(
            fs.singular_values, ds.singular_values[:k], rtol=1e-9, atol=1e-12 * max(ds.spectral_norm, 1)
        )
        assert fs.shape == dense.shape
        assert fs.norm_2_1 == pytest.approx(ds.norm_2_1, rel=1e-9)
        assert fs.norm_1_1 == pytest.approx(ds.norm_1_1, rel=1e-9)
        assert numerical_rank(fs.singular_values, fs.dim, RANK_TOL) == np.linalg.matrix_rank(dense)
        assert numerical_rank(fs.singular_values, fs.dim, RANK_TOL) <= 2 * a.shape[1]


def test_measured_from_keeps_propagation_and_moves_the_complexity_terms():
    rng = np.random.default_rng(0)
    dims = ModelDims(L=2, N=8, H=2, H_kv=2, d_head=2, d_ff=12)

    def weights(layer):
        g = rng.standard_normal
        return LayerWeights(
            layer, g((2, 2, 8)), g((2, 2, 8)), g((2, 2, 8)), g((2, 2, 8)), {"FF_in": g((8, 12)), "FF_out": g((12, 8))}
        )

    w = [weights(0), weights(1)]
    ms = measure(
        [layer_spectra(x, KernelOptions()) for x in w],
        dims,
        l_phi=1.13,
        rank_tol=1e-10,
        grid_m=default_grid_m(dims.L, dims.N),
    )
    same = ms.measured_from([difference_spectra(x, x, KernelOptions()) for x in w])  # W0 = W
    assert not ms.from_init and same.from_init
    for a, b in zip(ms.matrices, same.matrices):
        assert b.spectrum is a.spectrum and b.scale == a.scale and b.target is b.delta
    assert SPECTRAL_ADAPTIVE.compute(same).value == pytest.approx(np.sqrt(2))  # every rank is 0
    assert SPECTRAL_ADAPTIVE.compute(ms).value > 10
    with pytest.raises(ValueError):
        ms.measured_from([difference_spectra(w[0], w[0], KernelOptions())])


@pytest.fixture(scope="module")
def trained_and_init(tiny_pair):
    src, init = tiny_pair
    return specbound.analyze(src, init=init, threads=1), src, init


def test_difference_columns_match_dense(trained_and_init):
    a, src, init = trained_and_init
    rows = a.matrices
    for layer in range(L):
        w, w0 = row_weights(src, layer), row_weights(init, layer)
        mats = []
        for role, (x, y) in (("QK", ("q", "k")), ("OV", ("v", "o"))):
            for h in range(H):
                cols = slice(h * D_HEAD, (h + 1) * D_HEAD)
                if role == "QK":  # W_Q^h.T W_K^h with head slices as columns of the row-oriented q, k
                    mats.append((role, h, w[x][:, cols] @ w[y][:, cols].T - w0[x][:, cols] @ w0[y][:, cols].T))
                else:  # W_V^h.T W_O^h: columns of v, rows of o
                    mats.append((role, h, w[x][:, cols] @ w[y][cols, :] - w0[x][:, cols] @ w0[y][cols, :]))
        mats += [("FF_in", None, w["ff_in"] - w0["ff_in"]), ("FF_out", None, w["ff_out"] - w0["ff_out"])]
        for role, head, dense in mats:
            sel = (rows["layer"] == layer) & (rows["role"] == role)
            if head is not None:
                sel &= rows["head"] == head
            (row,) = rows[sel].to_dict("records")
            s = np.linalg.svd(dense, compute_uv=False)
            assert row["delta_spectral_norm"] == pytest.approx(s[0], rel=1e-9)
            assert row["delta_frobenius_norm"] == pytest.approx(np.linalg.norm(dense), rel=1e-9)
            assert row["delta_norm_2_1"] == pytest.approx(np.linalg.norm(dense, axis=0).sum(), rel=1e-9)
            assert row["delta_norm_1_1"] == pytest.approx(np.abs(dense).sum(), rel=1e-9)
            assert row["delta_rank"] == np.linalg.matrix_rank(dense)
    # a random W - W0 of a head has rank 2 d_head (< N here), twice the head's own rank
    qk = rows[rows["role"] == "QK"]
    assert (qk["delta_rank"] == 2 * D_HEAD).all() and (qk["rank"] == D_HEAD).all()


def test_from_init_bounds_use_differences_and_trained_propagation(trained_and_init):
    a, _, _ = trained_and_init
    m = a.matrices
    assert set(a.from_init) == {k for k, b in REGISTRY.items() if b.distance}
    # BFT by hand from the table: prod Lambda (of W) * (sum (||W - W0||_{2,1} / ||W||_2)^(2/3))^(3/2)
    expected = np.prod(a.layers["lambda"]) * np.sum((m["delta_norm_2_1"] / m["spectral_norm"]) ** (2 / 3)) ** 1.5
    assert a.from_init["bft"] == pytest.approx(expected, rel=1e-9)
    assert a.from_init["spectral_adaptive"] == pytest.approx(m["delta_contribution"].sum() + np.sqrt(L), rel=1e-12)
    # the trained-weights bounds are untouched by init=
    plain = specbound.analyze(a.source, threads=1)
    for name, value in plain.all_bounds().items():
        assert a.all_bounds()[name] == pytest.approx(value, rel=1e-12), name


def test_dense_method_agrees_from_init(trained_and_init):
    a, src, init = trained_and_init
    dense = specbound.analyze(src, init=init, threads=1, method="dense")
    for name, value in a.from_init.items():
        assert dense.from_init[name] == pytest.approx(value, rel=1e-8), name


def test_zero_distance(tiny_pair):
    """W = W0 exactly: every difference is exactly zero, so every distance bound is exactly its
    value at zero (factors stacked as [A; -A0] would leave 1e-16 round-off, which alpha can raise to 1e13)."""
    src, _ = tiny_pair
    a = specbound.analyze(src, init=src, threads=1)
    assert (a.matrices["delta_rank"] == 0).all()
    for column in ("delta_spectral_norm", "delta_frobenius_norm", "delta_norm_2_1", "delta_norm_1_1"):
        assert (a.matrices[column] == 0).all(), column
    assert a.from_init["spectral_adaptive"] == pytest.approx(np.sqrt(L))  # every C(p) vanishes
    assert a.from_init["spectral_three_type"] == pytest.approx(np.sqrt(L))
    assert a.from_init["edelman"] == 1.0 and a.from_init["l11_proxy"] == 1.0
    assert a.from_init["bft"] == 0.0 and a.from_init["nbs"] == 0.0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1e-4, 1e-8, 1e-12]))
def test_close_weights_lose_no_digits(seed, eps):
    """W0 = W + eps E: the factored difference matches the cancellation-free dense oracle
    (A - A0).T B + A0.T (B - B0) to 1e-9 relative, far below the eps-relative error of forming
    A.T B - A0.T B0 (about 1e-16 / eps)."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((2, 1, 3, 12))
    a0, b0 = a + eps * rng.standard_normal(a.shape), b + eps * rng.standard_normal(b.shape)
    (fs,) = factored_spectra(*stacked_difference(a, b, a0, b0))
    oracle = (a[0] - a0[0]).T @ b[0] + a0[0].T @ (b[0] - b0[0])
    s = np.linalg.svd(oracle, compute_uv=False)
    k = fs.singular_values.size
    np.testing.assert_allclose(fs.singular_values, s[:k], rtol=1e-9)  # rank 2d = 6: all well above 0
    assert fs.norm_2_1 == pytest.approx(np.linalg.norm(oracle, axis=0).sum(), rel=1e-9)
    assert fs.norm_1_1 == pytest.approx(np.abs(oracle).sum(), rel=1e-9)


def test_init_of_another_architecture_is_refused(tiny_pair, tmp_path):
    src, _ = tiny_pair
    other = write_tiny_bert(tmp_path / "wide", seed=5, N=20, H=4)
    with pytest.raises(SpecboundError, match="do not match"):
        specbound.analyze(src, init=other)


def test_json_has_from_init(trained_and_init):
    a, _, init = trained_and_init
    doc = json.loads(a.to_json())
    assert doc["options"]["init"] == str(init)
    assert set(doc["from_init"]) == set(a.from_init)
    assert "delta_norm_2_1" in doc["matrices"][0]


def test_layers_in_parallel_from_init(trained_and_init):
    """With init= every layer is read twice (W and W0); in threads the numbers are the same."""
    a, src, init = trained_and_init
    b = specbound.analyze(src, init=init, threads=1, jobs=2)
    assert b.all_bounds() == a.all_bounds()
    assert b.to_json() == a.to_json()


@st.composite
def rotary_differences(draw):
    """Random rotary factors and their initial values: ``(a, b, a0, b0, layout)``, some differences of low
    rank (a factor unchanged, or changed by a rank-1 update)."""

    d = draw(st.sampled_from([2, 4, 6]))
    rot = draw(st.sampled_from([r for r in (2, 4, 6) if r <= d]))
    n, heads = draw(st.integers(d, 10)), draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a, b = rng.standard_normal((heads, d, n)), rng.standard_normal((heads, d, n))
    change = draw(st.sampled_from(["dense", "rank1", "none"]))
    step = {
        "dense": lambda w: rng.standard_normal(w.shape),
        "rank1": lambda w: rng.standard_normal((heads, d, 1)) @ rng.standard_normal((heads, 1, n)),
        "none": lambda w: np.zeros_like(w),
    }[change]
    layout = RotaryLayout(
        rotary_dim=rot,
        pairing=draw(st.sampled_from(["half", "interleaved"])),
        base=draw(st.sampled_from([3.0, 1e4])),
        max_positions=draw(st.integers(1, 12)),
    )
    return a, b, a - step(a), b - rng.standard_normal(b.shape) * draw(st.sampled_from([0.0, 1.0])), layout


@settings(max_examples=40, deadline=None)
@given(rotary_differences())
def test_a_rotary_heads_difference_holds_at_every_offset(case):
    """``W - W0`` of a rotary head (docs/theory.md 3c): every reported quantity is at least that of the dense
    ``A^T M(delta) B - A0^T M(delta) B0`` at every offset, the spectral norm its exact maximum, and the rank
    bound at least every offset's rank (the doubled layout's ``M2`` is ``diag(M, M)`` up to the permutation)."""

    a, b, a0, b0, layout = case
    heads, d, n = a.shape
    layout2, order = doubled_layout(layout, d)
    m, m2 = rotations(layout, d, layout.offsets), rotations(layout2, 2 * d, layout.offsets)
    blocks = np.zeros_like(m2)
    blocks[:, :d, :d], blocks[:, d:, d:] = m, m
    np.testing.assert_allclose(m2, blocks[:, order][:, :, order], atol=1e-15)
    w = lambda q, k: LayerWeights(0, q, k, k, q, {})  # noqa: E731
    spectra = rotary_difference_spectra(w(a, b), w(a0, b0), layout, rank_tol=RANK_TOL)
    for h, s in enumerate(spectra):
        x = np.einsum("ai,tij,jb->tab", a[h].T, m, b[h]) - np.einsum("ai,tij,jb->tab", a0[h].T, m, b0[h])
        sv = np.linalg.svd(x, compute_uv=False)
        tau = RANK_TOL * n * np.maximum(sv[:, 0], 1.0)
        rank = np.count_nonzero(sv > tau[:, None], axis=1).max()
        slack = 1 + 1e-9
        assert (
            s.spectral_norm * slack >= sv[:, 0].max()
            and s.frobenius_norm * slack >= np.linalg.norm(x, axis=(1, 2)).max()
        )
        assert s.nuclear_norm(RANK_TOL) * slack >= sv.sum(axis=1).max() and s.kept.size >= rank
        assert s.norm_2_1 * slack >= np.linalg.norm(x, axis=1).sum(axis=1).max()
        assert s.norm_1_1 * slack >= np.abs(x).sum(axis=(1, 2)).max()
        for p in (0.5, 1.0, 2.0):
            assert np.sum(s.kept**p) * slack >= max(np.sum(v[v > t] ** p) for v, t in zip(sv, tau))
        if s.exact_over_offsets:
            assert s.spectral_norm == pytest.approx(sv[:, 0].max(), rel=1e-9, abs=1e-12)


def test_a_rotary_init_of_equal_weights_is_exactly_zero():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    w = LayerWeights(0, a, b, b, a, {})
    for s in rotary_difference_spectra(w, w, RotaryLayout(4, "half", 1e4, 16), rank_tol=RANK_TOL):
        assert s.spectral_norm == 0 and s.kept.size == 0 and s.norm_1_1 == 0
