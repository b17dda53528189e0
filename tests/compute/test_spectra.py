"""Factored spectra and norms equal dense ones (SPEC section 1); Schatten and rank rules."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specbound.compute.spectra as spectra
from specbound.bounds.schatten import schatten_power
from specbound.compute.spectra import dense_spectrum, factored_spectra, gram_singular_values, numerical_rank
from specbound.options import DEFAULT_RANK_TOL as RANK_TOL
from specbound.options import KernelOptions


@st.composite
def head_factors(draw):
    heads = draw(st.integers(1, 3))
    d = draw(st.integers(1, 6))
    n = draw(st.integers(d, 24))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    a = rng.standard_normal((heads, d, n)) * scale
    b = rng.standard_normal((heads, d, n))
    if draw(st.booleans()):  # a rank-deficient head: duplicated factor rows
        a[:, -1, :] = a[:, 0, :]
    return a, b


@settings(max_examples=60, deadline=None)
@given(head_factors())
def test_factored_equals_dense(factors):
    a, b = factors
    for h, fs in enumerate(factored_spectra(a, b)):
        dense = a[h].T @ b[h]
        ds = dense_spectrum(dense)
        s_dense = np.linalg.svd(dense, compute_uv=False)
        assert fs.shape == dense.shape
        k = fs.singular_values.size
        np.testing.assert_allclose(fs.singular_values, s_dense[:k], rtol=1e-9, atol=1e-12 * s_dense[0])
        assert np.all(s_dense[k:] <= 1e-12 * max(s_dense[0], 1))
        assert fs.norm_2_1 == pytest.approx(np.linalg.norm(dense, axis=0).sum(), rel=1e-9)
        assert fs.norm_1_1 == pytest.approx(np.abs(dense).sum(), rel=1e-9)
        assert fs.frobenius_norm == pytest.approx(np.linalg.norm(dense), rel=1e-9)
        assert numerical_rank(fs.singular_values, fs.dim, RANK_TOL) == numerical_rank(
            ds.singular_values, ds.dim, RANK_TOL
        )
        assert numerical_rank(ds.singular_values, ds.dim, RANK_TOL) == np.linalg.matrix_rank(dense)
        for p in (0.0, 0.05, 0.5, 1.0, 2.0):
            assert schatten_power(fs.singular_values, p, fs.dim, RANK_TOL) == pytest.approx(
                schatten_power(ds.singular_values, p, ds.dim, RANK_TOL), rel=1e-9
            )


@pytest.mark.parametrize("n_a, n_b", [(10, 10), (7, 11)])
def test_streamed_norm_1_1_uses_several_tiles(monkeypatch, n_a, n_b):
    monkeypatch.setattr(spectra, "_TILE", 4)  # 4 x 4 tiles, the last ones partial in both directions
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, n_a)), rng.standard_normal((3, n_b))
    assert spectra._streamed_norm_1_1(a, b) == pytest.approx(np.abs(a.T @ b).sum(), rel=1e-12)


def test_norm_1_1_tiles_cut_a_side_into_equal_tiles():
    """At most ``_TILE`` a side, as few tiles as that allows, equal but for the last: N = 768 is two
    tiles of 384 (not 512 + 256); up to 512, and at multiples of 512, the tiles are what they were."""

    assert [spectra._tile_side(n) for n in (1, 384, 512, 513, 768, 1000, 4096, 8192)] == [
        1,
        384,
        512,
        257,
        384,
        500,
        512,
        512,
    ]
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((8, 768)), rng.standard_normal((8, 700))
    assert spectra._streamed_norm_1_1(a, b) == pytest.approx(np.abs(a.T @ b).sum(), rel=1e-12)


def test_schatten_power_definitions():
    s = np.array([3.0, 2.0, 1.0, 0.5, 0.0])
    assert schatten_power(s, 0, 5, RANK_TOL) == 4
    assert schatten_power(s, 1, 5, RANK_TOL) == pytest.approx(6.5)
    assert schatten_power(s, 2, 5, RANK_TOL) == pytest.approx(9 + 4 + 1 + 0.25)
    # rounding noise below the tolerance does not count, however small p is
    noisy = np.concatenate([s[:4], np.full(100, 1e-15)])
    assert schatten_power(noisy, 1 / 19, 104, RANK_TOL) == pytest.approx(schatten_power(s, 1 / 19, 5, RANK_TOL))
    assert numerical_rank(np.zeros(3), 3, RANK_TOL) == 0


def test_the_nuclear_norm_is_s1_over_the_values_above_the_tolerance():
    """``nuclear_norm`` is ``S_1``: the singular values above ``tau = rank_tol dim max(s_1, 1)``, as ``S_p`` and the
    rank count them (docs/spec.md section 2, docs/schema.md), not the noise below it.  A rank-2 ``64 x 48`` matrix
    with 46 values of ``1e-9`` (below ``tau = 1e-10 * 48 * 3 = 1.44e-8``, together ``4.6e-8``): 5 exactly, where the
    sum of every value was ``5 + 4.6e-8``."""
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.standard_normal((64, 48)))
    v, _ = np.linalg.qr(rng.standard_normal((48, 48)))
    s = np.concatenate([[3.0, 2.0], np.full(46, 1e-9)])
    w = (u * s) @ v.T
    spectrum = dense_spectrum(w)
    assert spectrum.singular_values[2:].min() > 0.9e-9  # the dense SVD returns the small values
    assert numerical_rank(spectrum.singular_values, spectrum.dim, RANK_TOL) == 2
    assert spectrum.nuclear_norm(RANK_TOL) == pytest.approx(5.0, rel=1e-12)
    assert spectrum.nuclear_norm(RANK_TOL) == pytest.approx(
        schatten_power(spectrum.singular_values, 1, 48, RANK_TOL), rel=1e-15
    )
    assert spectrum.nuclear_norm(1e-12) == pytest.approx(5.0 + 46e-9, rel=1e-12)  # a tolerance below them: counted


def test_dense_spectrum_norms_row_orientation():
    w = np.array([[3.0, 0.0], [4.0, -1.0], [0.0, 0.0]])  # 3 x 2: columns are outputs
    sp = dense_spectrum(w)
    assert sp.norm_2_1 == pytest.approx(5.0 + 1.0)
    assert sp.norm_1_1 == pytest.approx(8.0)
    assert sp.shape == (3, 2) and sp.dim == 2
    assert sp.frobenius_norm == pytest.approx(np.sqrt(26))
    assert sp.stable_rank == pytest.approx(26 / sp.spectral_norm**2)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 12), st.integers(12, 40), st.booleans())
def test_gram_path_within_its_proven_bound(seed, n, k, transpose):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k))
    w = w.T if transpose else w
    s_gram, bound = gram_singular_values(w)
    s_svd = np.linalg.svd(w, compute_uv=False)
    assert s_gram.shape == s_svd.shape
    rel = np.abs(s_gram - s_svd) / s_gram
    assert np.all(rel <= bound)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 9), st.integers(10, 40), st.integers(1, 12), st.booleans())
def test_gram_path_in_several_blocks_within_its_proven_bound(seed, n, k, block, transpose):
    """The Gram matrix accumulated over column blocks of any width (uneven last block too) gives
    the SVD's values within the bound, and the bound is the one for that blocking's depth."""

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k))
    w = w.T if transpose else w
    original = spectra._GRAM_BLOCK
    spectra._GRAM_BLOCK = block
    try:
        s_gram, bound = spectra.gram_singular_values(w)
    finally:
        spectra._GRAM_BLOCK = original
    s_svd = np.linalg.svd(w, compute_uv=False)
    assert np.all(np.abs(s_gram - s_svd) / s_gram <= bound)
    u = np.finfo(np.float64).eps / 2
    b = min(block, k)
    depth = b + -(-k // b) + 1
    delta = depth * u / (1 - depth * u) * np.sum(w**2) + n * u * s_gram[0] ** 2
    assert bound == pytest.approx(delta / s_gram[-1] ** 2, rel=1e-9)


def test_gram_path_falls_back_to_svd_when_unresolved():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 20))
    w[-1] = w[0]  # rank deficient: the Gram path cannot resolve the zero singular value
    sp = dense_spectrum(w, KernelOptions(gram_rtol=1e-8))
    assert sp.sv_method == "svd" and sp.sv_rel_error_bound == 0.0
    good = dense_spectrum(rng.standard_normal((6, 20)), KernelOptions(gram_rtol=1e-8))
    assert good.sv_method == "gram" and 0 < good.sv_rel_error_bound <= 1e-8


@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_blockwise_norms_match_direct(monkeypatch, order):
    monkeypatch.setattr(spectra, "_BLOCK_ENTRIES", 7)  # many uneven blocks
    rng = np.random.default_rng(5)
    base = rng.standard_normal((13, 9))
    w = {"C": base, "F": np.asfortranarray(base), "strided": rng.standard_normal((26, 9))[::2]}[order]
    np.testing.assert_allclose(spectra.column_sq_norms(w), (w**2).sum(axis=0), rtol=1e-13)
    sp = spectra.dense_spectrum(w, KernelOptions(gram_rtol=1e-6))
    assert sp.norm_1_1 == pytest.approx(np.abs(w).sum(), rel=1e-13)
    assert sp.norm_2_1 == pytest.approx(np.linalg.norm(w, axis=0).sum(), rel=1e-13)
    np.testing.assert_allclose(sp.singular_values, np.linalg.svd(w, compute_uv=False), rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", ["C", "F"])
def test_one_pass_norms_equal_two_passes_and_leave_w_alone(monkeypatch, order, dtype):
    """The column norms and the abs-sum from one pass over the blocks are the two passes' numbers, bit
    for bit; a float64 ``w``'s blocks are views, made absolute into a temporary, never in place."""

    monkeypatch.setattr(spectra, "_BLOCK_ENTRIES", 40)
    w = np.asarray(np.random.default_rng(6).standard_normal((23, 17)), dtype=dtype, order=order)
    kept = w.copy()
    col_sq, abs_sum = spectra.column_sq_norms_and_abs_sum(w)
    assert np.array_equal(w, kept)
    assert np.array_equal(col_sq, spectra.column_sq_norms(w))
    two_pass = sum(np.abs(np.asarray(block, dtype=np.float64)).sum() for _, block in spectra._row_blocks(w))
    assert abs_sum == two_pass and spectra.dense_spectrum(w).norm_1_1 == two_pass


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_blocked_gram_is_the_lower_triangle_of_w_w_transpose(monkeypatch, layout):
    """Symmetric rank-k updates per column block (uneven last block), only the lower triangles added:
    ``W W^T`` to the summation error of the proven bound's depth, the strict upper triangle zero."""

    monkeypatch.setattr(spectra, "_ADD_COLUMNS", 5)  # the lower-triangle addition in several column tiles
    rng = np.random.default_rng(7)
    base = rng.standard_normal((13, 47))
    w = {"C": base, "F": np.asfortranarray(base), "strided": rng.standard_normal((26, 47))[::2]}[layout]
    gram = spectra.blocked_gram(w, 10)
    u = np.finfo(np.float64).eps / 2
    depth = 10 + 5 + 1
    np.testing.assert_array_less(np.abs(np.tril(gram - w @ w.T)), 2 * depth * u * (np.abs(w) @ np.abs(w).T) + 1e-300)
    assert gram.flags.f_contiguous and np.all(np.triu(gram, 1) == 0)


@pytest.mark.parametrize("stored", [np.float32, np.float16])
@pytest.mark.parametrize("transpose", [False, True])
def test_a_matrix_in_its_stored_precision_gives_the_numbers_of_its_float64_copy(stored, transpose):
    """The Gram path, the column norms and the abs-sum upcast each block: a float32 (float16) matrix
    gives every number of its exact float64 copy, bit for bit; so does the SVD fallback."""
    rng = np.random.default_rng(8)
    w = (0.02 * rng.standard_normal((40, 1300))).astype(stored)
    w = w.T if transpose else w
    for kernel in (KernelOptions(), KernelOptions(gram_rtol=0.0)):
        ours, copy = dense_spectrum(w, kernel), dense_spectrum(w.astype(np.float64), kernel)
        assert ours.sv_method == copy.sv_method == ("gram" if kernel.gram_rtol else "svd")
        np.testing.assert_array_equal(ours.singular_values, copy.singular_values)
        assert (ours.norm_1_1, ours.norm_2_1, ours.sv_rel_error_bound) == (
            copy.norm_1_1,
            copy.norm_2_1,
            copy.sv_rel_error_bound,
        )


def test_the_gram_path_never_holds_a_float64_copy_of_a_stored_matrix():
    w = np.random.default_rng(9).standard_normal((16, 1 << 16)).astype(np.float32)  # float64 copy: 8 MiB
    tracemalloc.start()
    try:
        spectrum = dense_spectrum(w, KernelOptions())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert spectrum.sv_method == "gram" and peak < 0.5 * 8 * w.size
