"""Lipschitz and sensitivity factors beyond the BERT setting (docs/theory.md, section 3b)."""

import numpy as np
import pytest

from specbound.compute.propagation import LayerSpectralNorms, layer_lipschitz, sensitivities

QK, OV = np.array([0.25, 1.0]), np.array([1.0, 0.5])
ATTN = 1.0 * (1 + 4 * 0.25) + 0.5 * (1 + 4 * 1.0)  # = 4.5


def test_bert_layer_matches_spec_vector_b():
    n = LayerSpectralNorms(QK, OV, {"FF_in": 2.0, "FF_out": 1.5})
    assert layer_lipschitz(n, 1.13) == pytest.approx(15.255)
    g = sensitivities(n)
    assert g["QK"] == pytest.approx([6, 3]) and g["OV"] == pytest.approx([3, 3])
    assert g["FF_in"] == 1.5 and g["FF_out"] == 1.0


def test_gated_sequential_layer():
    ff = {"FF_gate": 2.0, "FF_up": 3.0, "FF_out": 0.5}
    n = LayerSpectralNorms(QK, OV, ff)
    l_phi = 1.0998  # SiLU; c_phi = 1
    assert layer_lipschitz(n, l_phi) == pytest.approx(ATTN * (l_phi + 1.0) * 2.0 * 3.0 * 0.5)
    g = sensitivities(n)
    # activation constants set to 1 in gamma*, as in the reference's BERT convention
    assert g["FF_gate"] == pytest.approx(3.0 * 0.5) and g["FF_up"] == pytest.approx(2.0 * 0.5)
    assert g["FF_out"] == 1.0
    assert g["OV"] == pytest.approx([2 * 3.0, 2 * 3.0])  # (1 + 1) c_g c_u c_d
    assert g["QK"] == pytest.approx(2 * OV * 6.0)


def test_parallel_layer_adds_and_attention_skips_feed_forward():
    n = LayerSpectralNorms(QK, OV, {"FF_in": 2.0, "FF_out": 1.5}, block="parallel")
    assert layer_lipschitz(n, 1.13) == pytest.approx(ATTN + 1.13 * 2.0 * 1.5)
    g = sensitivities(n)
    assert g["OV"] == pytest.approx([1.0, 1.0]) and g["QK"] == pytest.approx(2 * OV)
    assert g["FF_in"] == 1.5 and g["FF_out"] == 1.0


def test_gated_lipschitz_is_an_upper_bound_on_random_pairs():
    """(L_phi + c_phi) c_g c_u c_d bounds |g(x) - g(y)| / |x - y| for unit-ball rows (SiLU)."""
    rng = np.random.default_rng(0)
    wg, wu, wd = rng.standard_normal((8, 16)), rng.standard_normal((8, 16)), rng.standard_normal((16, 8))
    silu = lambda t: t / (1 + np.exp(-t))  # noqa: E731
    g = lambda x: (silu(x @ wg) * (x @ wu)) @ wd  # noqa: E731
    c = [np.linalg.norm(w, 2) for w in (wg, wu, wd)]
    bound = (1.0998 + 1.0) * c[0] * c[1] * c[2]
    for _ in range(2000):
        x, y = rng.standard_normal(8), rng.standard_normal(8)
        x, y = x / max(1, np.linalg.norm(x)), y / max(1, np.linalg.norm(y))
        assert np.linalg.norm(g(x) - g(y)) <= bound * np.linalg.norm(x - y) + 1e-12
