"""2D rotary layouts (vision towers, docs/rotary.md section 9): each pair turns with one axis of the patch grid,
offsets are ``(dy, dx)``; the rotation, the offsets and every QK number against dense products at every offset."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbound.archs.model import UNBOUNDED_POSITIONS, RotaryLayout
from specbound.archs.rotary import grid_frequencies
from specbound.compute.rotary import doubled_layout, rotary_qk_envelope, rotations

SLACK = 1 + 1e-9


@st.composite
def layouts(draw, max_grid=4):
    """A 2D layout of a head of ``d`` features (``rot <= d`` rotate), each pair's axis and frequency drawn."""
    half = draw(st.integers(1, 4))
    d = 2 * half + 2 * draw(st.integers(0, 1))
    axes = tuple(draw(st.lists(st.sampled_from([0, 1]), min_size=half, max_size=half)))
    thetas = tuple(draw(st.lists(st.floats(0.01, 3.0), min_size=half, max_size=half)))
    grid = (draw(st.integers(1, max_grid)), draw(st.integers(1, max_grid)))
    layout = RotaryLayout(
        2 * half,
        draw(st.sampled_from(["half", "interleaved"])),
        1e4,
        max(grid),
        inv_freq=thetas,
        axes=axes,
        grid=grid,
        shared_shift=False,
        grid_origin=draw(st.booleans()),
    )
    return layout, d


def _positions(layout):
    """Every token position the layout's grid holds: rows and columns from 0, or from 1 with the class token at 0."""
    rows, cols = layout.grid
    start = 1 if layout.grid_origin else 0
    y, x = np.meshgrid(np.arange(start, start + rows), np.arange(start, start + cols), indexing="ij")
    grid = np.stack([y.ravel(), x.ravel()], axis=1)
    return np.concatenate([grid, [[0, 0]]]) if layout.grid_origin else grid


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(drawn=layouts())
def test_the_offsets_are_every_difference_of_two_positions_once(drawn):
    layout, _ = drawn
    p = _positions(layout)
    differences = {tuple(a - b) for a in p for b in p}
    offsets = layout.offsets
    assert offsets.shape == (layout.max_offset_count, 2)
    assert len({tuple(o) for o in offsets}) == len(offsets) and {tuple(o) for o in offsets} == differences


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(drawn=layouts(), data=st.data())
def test_rotating_two_positions_is_rotating_by_their_offset(drawn, data):
    """``M(p) M(p')^T = M(p - p')``: the logit of tokens at ``p`` and ``p'`` depends on ``p - p'`` alone, and pair
    ``i`` turns by ``p[axes[i]] theta_i``."""
    layout, d = drawn
    p, q = (np.array(data.draw(st.tuples(st.integers(-6, 6), st.integers(-6, 6)))) for _ in range(2))
    m_p, m_q, m_pq = rotations(layout, d, [p, q, p - q])
    np.testing.assert_allclose(m_p @ m_q.T, m_pq, atol=1e-12)
    u, v = layout.pairs
    angles = p[np.asarray(layout.axes)] * layout.thetas
    np.testing.assert_allclose(m_p[u, u], np.cos(angles), atol=1e-12)
    np.testing.assert_allclose(m_p[u, v], np.sin(angles), atol=1e-12)


def test_a_2d_layout_is_checked_when_built():
    base = dict(rotary_dim=4, pairing="half", base=1e4, max_positions=3, inv_freq=(1.0, 0.1))
    for bad, match in (
        (dict(grid=(3, 3)), "axes"),
        (dict(grid_origin=True), "axes"),
        (dict(axes=(0,), grid=(3, 3)), "each of the 2"),
        (dict(axes=(0, -1), grid=(3, 3)), "axis"),
        (dict(axes=(0, 1), grid=(3,)), "grid"),
        (dict(axes=(0, 1), grid=(3, 0)), "grid"),
        (dict(axes=(0, 1), grid=(True, 3)), "grid"),
        (dict(axes=(0, 1), grid=(3, 3), grid_origin=True), "class token"),
    ):
        with pytest.raises(ValueError, match=match):
            RotaryLayout(**base, **bad)
    with pytest.raises(ValueError, match=r"\(K, 2\)"):
        rotations(RotaryLayout(**base, axes=(0, 1), grid=(3, 3), shared_shift=False), 4, [1, 2, 3])


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(drawn=layouts(), seed=st.integers(0, 2**16), kv=st.booleans())
def test_every_qk_number_holds_at_every_offset_and_the_exact_one_is_the_maximum(drawn, seed, kv):
    """``rotary_qk_envelope`` on a 2D layout against ``W_Q^T M(dy, dx) W_K`` formed densely at every offset: every
    number at least the dense one everywhere, the exact spectral norm their maximum, attained at ``argmax_offset``;
    over budget the product bound, still at least every offset's."""
    layout, d = drawn
    rng = np.random.default_rng(seed)
    n, heads = 6, 2
    q = rng.normal(size=(heads, d, n))
    k = rng.normal(size=(1 if kv else heads, d, n))
    kv_index = np.zeros(heads, int) if kv else None
    m = rotations(layout, d, layout.offsets)
    for budget in (10**6, 1):
        for h, env in enumerate(rotary_qk_envelope(q, k, kv_index, layout, rank_tol=1e-10, max_core_svds=budget)):
            dense = np.einsum("ia,tij,jb->tab", q[h], m, k[0 if kv else h])
            s = np.linalg.svd(dense, compute_uv=False)
            assert env.spectral_sup * SLACK >= s[:, 0].max()
            assert env.frobenius_sup * SLACK >= np.sqrt((s**2).sum(1)).max()
            assert env.nuclear_sup * SLACK >= s.sum(1).max()
            assert np.all(env.sigma_bounds * SLACK >= s[:, : env.sigma_bounds.size].max(axis=0))
            assert env.norm_2_1_sup * SLACK >= np.linalg.norm(dense, axis=1).sum(1).max()
            assert env.norm_1_1_bound * SLACK >= np.abs(dense).sum(axis=(1, 2)).max()
            if budget > 1:
                assert env.spectral_method == "exact_over_offsets"
                assert env.spectral_sup == pytest.approx(s[:, 0].max(), rel=1e-9)
                at = np.linalg.svd(
                    q[h].T @ rotations(layout, d, [env.argmax_offset])[0] @ k[0 if kv else h], compute_uv=False
                )[0]
                assert at == pytest.approx(env.spectral_sup, rel=1e-9) and isinstance(env.argmax_offset, tuple)
            else:
                assert env.spectral_method == "product_bound" and env.argmax_offset is None


def test_an_unbounded_grid_gets_the_bounds_for_every_rotation_without_listing_offsets():
    layout = RotaryLayout(
        4,
        "half",
        1e4,
        UNBOUNDED_POSITIONS,
        inv_freq=(1.0, 0.1),
        axes=(0, 1),
        grid=(UNBOUNDED_POSITIONS, UNBOUNDED_POSITIONS),
        shared_shift=False,
    )
    assert layout.max_offset_count > 2**120
    rng = np.random.default_rng(0)
    (env,) = rotary_qk_envelope(rng.normal(size=(1, 4, 5)), rng.normal(size=(1, 4, 5)), None, layout, rank_tol=1e-10)
    assert env.spectral_method == "product_bound" and env.spectral_sup == env.spectral_bound


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(drawn=layouts(max_grid=3), seed=st.integers(0, 2**16))
def test_the_doubled_layout_rotates_a_stacked_factor_as_the_layout_each_half(drawn, seed):
    """``W - W0`` of a 2D head (compute.distance): the doubled layout keeps each pair's axis."""
    layout, d = drawn
    layout2, order = doubled_layout(layout, d)
    assert layout2.axes == layout.axes + layout.axes
    offsets = layout.offsets
    m, m2 = rotations(layout, d, offsets), rotations(layout2, 2 * d, offsets)
    z = np.zeros_like(m)
    block = np.concatenate([np.concatenate([m, z], 2), np.concatenate([z, m], 2)], 1)
    np.testing.assert_allclose(block[:, order][:, :, order], m2, atol=1e-12)


def test_the_grid_frequencies_are_the_modules_own():
    """Pixtral's ``inv_freq`` (even text indices on the rows, odd on the columns) and Qwen's (``base^(-4j/d)`` on
    each axis), as the modules compute them (in float32)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLVisionRotaryEmbedding

    for d in (8, 10, 12, 64):  # 10: the rows get one pair more
        pixtral = PixtralVisionRotaryEmbedding(
            transformers.PixtralVisionConfig(
                hidden_size=4 * d, num_attention_heads=4, rope_parameters={"rope_theta": 500.0, "rope_type": "axial"}
            )
        )
        thetas, axes = grid_frequencies("alternating", 500.0, d)
        np.testing.assert_allclose(thetas, pixtral.inv_freq.double().numpy(), rtol=1e-6)
        assert axes == (0,) * ((d + 2) // 4) + (1,) * (d // 4)
        if d % 4 == 0:
            qwen = Qwen2VLVisionRotaryEmbedding(
                transformers.Qwen2VLVisionConfig(
                    embed_dim=4 * d, num_heads=4, rope_parameters={"rope_theta": 500.0, "rope_type": "axial"}
                )
            )
            thetas, axes = grid_frequencies("split", 500.0, d)
            np.testing.assert_allclose(thetas, np.tile(qwen.inv_freq.double().numpy(), 2), rtol=1e-6)
            assert axes == (0,) * (d // 4) + (1,) * (d // 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        grid_frequencies("split", 1e4, 6)
