"""Bounds measured from initial weights: spectra of W - W0, factored for QK/OV and checked dense."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbound.distance import stacked_difference
from specbound.spectra import dense_spectrum, factored_spectra, numerical_rank


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
        np.testing.assert_allclose(fs.singular_values, ds.singular_values[:k], rtol=1e-9,
                                   atol=1e-12 * max(ds.spectral_norm, 1))
        assert fs.shape == dense.shape
        assert fs.norm_2_1 == pytest.approx(ds.norm_2_1, rel=1e-9)
        assert fs.norm_1_1 == pytest.approx(ds.norm_1_1, rel=1e-9)
        assert numerical_rank(fs.singular_values, fs.dim) == np.linalg.matrix_rank(dense)
        assert numerical_rank(fs.singular_values, fs.dim) <= 2 * a.shape[1]


def test_measured_from_keeps_propagation_and_moves_the_complexity_terms():
    from specbound.analysis import layer_spectra
    from specbound.bounds.adaptive import SPECTRAL_ADAPTIVE
    from specbound.distance import difference_spectra
    from specbound.extract import LayerWeights, ModelDims
    from specbound.measures import measure

    rng = np.random.default_rng(0)
    dims = ModelDims(L=2, N=8, H=2, H_kv=2, d_head=2, d_ff=12)

    def weights(layer):
        g = rng.standard_normal
        return LayerWeights(layer, g((2, 2, 8)), g((2, 2, 8)), g((2, 2, 8)), g((2, 2, 8)), g((8, 12)), g((12, 8)))

    w = [weights(0), weights(1)]
    ms = measure([layer_spectra(x) for x in w], dims, l_phi=1.13, rank_tol=1e-10)
    same = ms.measured_from([difference_spectra(x, x) for x in w])  # W0 = W
    assert not ms.from_init and same.from_init
    for a, b in zip(ms.matrices, same.matrices):
        assert b.spectrum is a.spectrum and b.scale == a.scale and b.target is b.delta
    assert SPECTRAL_ADAPTIVE.compute(same).value == pytest.approx(np.sqrt(2))  # every rank is 0
    assert SPECTRAL_ADAPTIVE.compute(ms).value > 10
    with pytest.raises(ValueError):
        ms.measured_from([difference_spectra(w[0], w[0])])
