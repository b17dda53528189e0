"""SPEC section 6: the independently computed test vectors, to 1e-6 relative."""

import math

import numpy as np
import pytest

from specbound.archs.model import ModelDims
from specbound.bounds import REGISTRY
from specbound.bounds.edelman import EDELMAN
from specbound.bounds.schatten import ContributionCurve, default_grid_m, schatten_grid
from specbound.compute.layer_spectra import LayerSpectra
from specbound.compute.measures import measure
from specbound.compute.spectra import MatrixSpectrum, numerical_rank

REL = 1e-6


def curve(s, scale, n):
    s = np.asarray(s, dtype=float)
    return ContributionCurve(
        MatrixSpectrum((s.size, s.size), s, math.nan, math.nan), log_scale=math.log(scale), n=n, rank_tol=1e-10
    )


def grid_minimum(c, m):
    grid = schatten_grid(m)
    values = c.on_grid(grid)
    best = int(np.argmin(values))
    return grid[best], values[best], grid


def test_vector_a():
    s = np.array([3, 2, 1, 0.5, 0])
    assert default_grid_m(2, 8) == 5
    assert len(schatten_grid(5)) == 11
    assert numerical_rank(s, 5, 1e-10) == 4
    c = curve(s, 2.0, 8)
    assert c(0) == pytest.approx(5.656854, rel=REL)
    assert c(1) == pytest.approx(9.405339, rel=REL)
    assert c(2) == pytest.approx(13.070320, rel=REL)
    p, value, _ = grid_minimum(c, 5)
    assert p == 0 and value == pytest.approx(5.656854, rel=REL)


@pytest.mark.parametrize("scale, p_star, c_star", [(1.0, 26 / 19, 149.255902), (100.0, 10 / 19, 666.554641)])
def test_vector_c(scale, p_star, c_star):
    s = 1.0 / np.arange(1, 769)
    assert default_grid_m(12, 768) == 19
    assert len(schatten_grid(19)) == 39
    c = curve(s, scale, 768)
    if scale == 1.0:
        assert c(0) == pytest.approx(768, rel=REL)
        assert c(1) == pytest.approx(162.101270, rel=REL)
        assert c(2) == pytest.approx(165.185574, rel=REL)
    p, value, _ = grid_minimum(c, 19)
    assert p == pytest.approx(p_star, abs=1e-12)
    assert value == pytest.approx(c_star, rel=REL)


def _norm_only(c, n21):
    return MatrixSpectrum((4, 4), np.array([c]), n21, math.nan)


def test_vector_b():
    layers = [
        LayerSpectra(
            0,
            qk=[_norm_only(0.25, 3), _norm_only(1, 4)],
            ov=[_norm_only(1, 5), _norm_only(0.5, 6)],
            ff={"FF_in": _norm_only(2, 10), "FF_out": _norm_only(1.5, 12)},
        ),
        LayerSpectra(
            1,
            qk=[_norm_only(0.5, 2), _norm_only(0.1, 2.5)],
            ov=[_norm_only(0.7, 4), _norm_only(0.9, 4.5)],
            ff={"FF_in": _norm_only(1.2, 8), "FF_out": _norm_only(0.8, 9)},
        ),
    ]
    dims = ModelDims(L=2, N=4, H=2, H_kv=2, d_head=2, d_ff=4)
    ms = measure(layers, dims, l_phi=1.13, rank_tol=1e-10, grid_m=default_grid_m(dims.L, dims.N))
    assert ms.lambdas == pytest.approx([15.255, 3.644928], rel=REL)
    assert ms.alphas == pytest.approx([3.644928, 1.0], rel=REL)
    gammas = {(mm.layer, mm.role, mm.head): mm.gamma for mm in ms.matrices}
    expected = {
        (0, "QK", 0): 6,
        (0, "QK", 1): 3,
        (0, "OV", 0): 3,
        (0, "OV", 1): 3,
        (0, "FF_in", None): 1.5,
        (0, "FF_out", None): 1,
        (1, "QK", 0): 1.344,
        (1, "QK", 1): 1.728,
        (1, "OV", 0): 0.96,
        (1, "OV", 1): 0.96,
        (1, "FF_in", None): 0.8,
        (1, "FF_out", None): 1,
    }
    for key, value in expected.items():
        assert gammas[key] == pytest.approx(value, rel=REL), key
    # scale = gamma * alpha * L
    scales = {(mm.layer, mm.role, mm.head): mm.scale for mm in ms.matrices}
    assert scales[(0, "QK", 0)] == pytest.approx(6 * 3.644928 * 2, rel=REL)
    result = EDELMAN.compute(ms)
    assert result.per_layer["xi"] == pytest.approx([31.902848, 15.767375], rel=REL)
    assert result.value == pytest.approx(887.139298, rel=REL)


def test_shared_count_by_hand():
    """Two depths sharing one stored layer: each matrix once, scale = 1 * (gamma_0 alpha_0 + gamma_1 alpha_1)."""

    def spec(c, s2):
        return MatrixSpectrum((4, 4), np.array([c, s2]), 1.0, 1.0)

    layer = dict(qk=[spec(0.5, 0.2)], ov=[spec(1.5, 0.3)], ff={"FF_in": spec(2.0, 1.0), "FF_out": spec(1.2, 0.4)})
    layers = [LayerSpectra(0, **layer), LayerSpectra(1, **layer)]
    dims = ModelDims(L=2, N=4, H=1, H_kv=1, d_head=2, d_ff=4, stored=(0, 0))
    ms = measure(layers, dims, l_phi=1.13, rank_tol=1e-10, grid_m=default_grid_m(dims.L, dims.N))
    lam = 1.13 * 2.0 * 1.2 * 1.5 * (1 + 4 * 0.5)
    assert ms.alphas == pytest.approx([lam, 1.0])
    gamma = {"QK": 2 * 1.5 * 1.2 * 2.0, "OV": 1.2 * 2.0, "FF_in": 1.2, "FF_out": 1.0}
    grid = schatten_grid(ms.grid_m)
    expected = math.sqrt(2)
    for role, s in (
        ("QK", layer["qk"][0]),
        ("OV", layer["ov"][0]),
        ("FF_in", layer["ff"]["FF_in"]),
        ("FF_out", layer["ff"]["FF_out"]),
    ):
        scale = 1 * (gamma[role] * lam + gamma[role] * 1.0)
        expected += min(ContributionCurve(s, log_scale=math.log(scale), n=4, rank_tol=1e-10)(float(p)) for p in grid)
    assert REGISTRY["spectral_shared"].compute(ms).value == pytest.approx(expected, rel=1e-12)
    assert REGISTRY["spectral_shared"].compute(ms).value < REGISTRY["spectral_adaptive"].compute(ms).value
