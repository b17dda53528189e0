"""Rotary layouts with several position axes (M-RoPE; a vision tower's 2D patch grid): docs/rotary.md section 7.

* the offset set ``RotaryLayout.offsets`` is exactly the set of differences of the positions it describes
  (brute force over every position of small configurations, both enumeration routes);
* ``M(delta)`` of an offset vector turns pair ``i`` by ``delta[axes[i]] theta_i``; a text-text offset
  ``(d, d, d)`` is the 1D rotation by ``d``, to the bit;
* the axis assignment of ``mrope_section`` is transformers' own ``recomposition_frequencies`` (Qwen2-VL's
  contiguous sections, Qwen3-VL's interleaved ones);
* property tests: at every offset vector the dense ``N x N`` product's norms never exceed the reported
  bounds, the exact maxima are attained, and they are never below the 1D maxima at the same frequencies.

Slack as in test_rotary.py: ``REL = 1e-12`` over rounding near ``N eps``.
"""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbound.archs.model import LayerWeights, RotaryLayout
from specbound.archs.rotary import mrope_axes
from specbound.compute.distance import rotary_difference_spectra
from specbound.compute.rotary import doubled_layout, exact_qk_at_offsets, rotary_qk_envelope, rotation, rotations

REL = 1e-12
RANK_TOL = 1e-10


def leq(a, b):
    return a <= b * (1 + REL) + 1e-300


def positions(p, grid, shared_shift):
    """Every position the layout describes, by brute force: a block's ``g`` with ``0 <= g_a < grid_a``, shifted
    by ``s (1, ..., 1)`` for every ``s >= 0`` when ``shared_shift``, each component at most ``P - 1``."""
    shifts = range(p) if shared_shift else [0]
    out = set()
    for s in shifts:
        for g in itertools.product(*(range(min(x, p)) for x in grid)):
            v = tuple(s + x for x in g)
            if max(v) <= p - 1:
                out.add(v)
    return out


@pytest.mark.parametrize(
    "p, grid, shared_shift",
    [
        (5, None, True),
        (4, (1, 3, 2), True),
        (6, (2, 2, 2), True),
        (7, (1, 1, 1), True),
        (9, (1, 2, 4), True),
        (3, (5, 1, 2), True),
        (4, (3, 2), False),
        (5, (2, 4), False),
        (3, (7, 1), False),
        (4, (2, 3), True),
    ],
)
def test_offsets_are_the_differences_of_the_positions(p, grid, shared_shift):
    axes = (0, 1, 2) if grid is None or len(grid) == 3 else (0, 1)
    layout = RotaryLayout(2 * len(axes), "half", 100.0, p, axes=axes, grid=grid, shared_shift=shared_shift)
    pos = positions(p, grid or (p,) * len(axes), shared_shift)
    expected = sorted({tuple(a - b for a, b in zip(u, v)) for u in pos for v in pos})
    got = layout.offsets
    assert got.shape == (len(expected), len(axes)) and got.dtype.kind == "i"
    assert [tuple(int(x) for x in row) for row in got] == expected  # lexicographic, no repeats
    assert len(got) <= layout.max_offset_count
    if grid is None:  # the grid spanning the context: the count is exact, the whole cube
        assert len(got) == layout.max_offset_count == (2 * p - 1) ** 3


def test_both_enumerations_of_the_shifted_offsets_agree():
    """The cube filter and the shifted boxes are two routes to one set; each layout takes the cheaper."""
    small = RotaryLayout(6, "half", 100.0, 12, axes=(0, 1, 2), grid=(1, 2, 2))  # the shifted boxes
    large = RotaryLayout(6, "half", 100.0, 12, axes=(0, 1, 2), grid=(12, 11, 12))  # the cube
    for layout in (small, large):
        g = layout.extents
        shifted = (
            np.arange(-11, 12)[:, None, None]
            + np.stack(np.meshgrid(*[np.arange(-(x - 1), x) for x in g], indexing="ij"), -1).reshape(1, -1, 3)
        ).reshape(-1, 3)
        want = np.unique(shifted[np.abs(shifted).max(axis=1) <= 11], axis=0)
        np.testing.assert_array_equal(layout.offsets, want)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rotation_of_an_offset_vector(pairing):
    axes = (0, 0, 1, 2, 1)
    layout = RotaryLayout(10, pairing, 50.0, 16, axes=axes)
    flat = RotaryLayout(10, pairing, 50.0, 16)
    u, v = layout.pairs
    rng = np.random.default_rng(1)
    for delta in ([3, -2, 5], [0, 0, 0], [-7, 4, 1], [2.5, 0.5, -1.0]):
        m = rotation(layout, 12, delta)
        want = np.eye(12)
        for i, (a, b) in enumerate(zip(u, v)):
            ang = delta[axes[i]] * layout.thetas[i]
            want[a, a] = want[b, b] = np.cos(ang)
            want[a, b], want[b, a] = np.sin(ang), -np.sin(ang)
        np.testing.assert_array_equal(m, want)
        np.testing.assert_allclose(m @ m.T, np.eye(12), atol=1e-15)
        np.testing.assert_allclose(m.T, rotation(layout, 12, [-x for x in delta]), atol=1e-15)
        other = rng.integers(-5, 6, 3)
        np.testing.assert_allclose(
            m @ rotation(layout, 12, other), rotation(layout, 12, np.add(delta, other)), atol=1e-14
        )
    for d in range(-15, 16):  # a text-text offset (d, d, d) is the 1D rotation, to the bit
        np.testing.assert_array_equal(rotation(layout, 12, [d, d, d]), rotation(flat, 12, d))
    stack = rotations(layout, 12, layout.offsets[:40])
    np.testing.assert_array_equal(stack[7], rotation(layout, 12, layout.offsets[7]))


def _recomposed_axes(module_class, sections, half):
    """The axis transformers' ``recomposition_frequencies`` gives each frequency: axis ``a``'s row of ``freq``
    holds ``a`` everywhere, so the recomposed row reads off the axes."""
    import torch

    freq = torch.arange(3, dtype=torch.float64)[:, None, None, None].expand(3, 1, 1, half).clone()
    out = module_class.recomposition_frequencies(SimpleNamespace(mrope_section=list(sections)), freq)
    return tuple(int(x) for x in out[0, 0, :half])


@pytest.mark.parametrize("sections, half", [([16, 24, 24], 64), ([1, 1, 2], 4), ([2, 0, 1], 3), ([3, 2, 3], 8)])
def test_mrope_sections_are_transformers_qwen2_vl(sections, half):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    axes = mrope_axes(sections, half, "sections")
    assert axes == _recomposed_axes(Qwen2VLRotaryEmbedding, sections, half)
    assert axes == _recomposed_axes(Qwen2_5_VLRotaryEmbedding, sections, half)


@pytest.mark.parametrize(
    "sections, half", [([24, 20, 20], 64), ([1, 1, 1], 3), ([2, 1, 1], 4), ([1, 3, 1], 8), ([4, 4, 4], 6)]
)
def test_mrope_interleaved_is_transformers_qwen3_vl(sections, half):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    axes = mrope_axes(sections, half, "interleaved")
    assert axes == _recomposed_axes(Qwen3VLTextRotaryEmbedding, sections, half)
    if sections == [24, 20, 20]:  # Qwen3-VL's own: T H W T H W ... then time for the last 4
        assert axes[:6] == (0, 1, 2, 0, 1, 2) and axes[60:] == (0, 0, 0, 0) and axes.count(1) == 20


@pytest.mark.parametrize(
    "sections, half, kind, match",
    [
        ([16, 24, 23], 64, "sections", "adds up to 63"),
        ([2, -1, 1], 2, "sections", "non-negative"),
        ([1, 1], 4, "interleaved", "3 lengths"),
        ((1.5, 1, 1), 4, "sections", "non-negative"),
        ([1, 1, 2], 4, "diagonal", "kind"),
    ],
)
def test_mrope_axes_refuse_bad_sections(sections, half, kind, match):
    with pytest.raises(ValueError, match=match):
        mrope_axes(sections, half, kind)


@st.composite
def heads_and_axes_layout(draw):
    d = draw(st.sampled_from([4, 6, 8]))
    n = draw(st.integers(1, 12))
    rot = draw(st.sampled_from([r for r in (2, 4, 6, 8) if r <= d]))
    n_axes = draw(st.integers(2, 3))
    axes = tuple(draw(st.lists(st.integers(0, n_axes - 1), min_size=rot // 2, max_size=rot // 2)))
    p = draw(st.integers(1, 5))
    grid = draw(st.one_of(st.none(), st.tuples(*[st.integers(1, 6)] * n_axes)))
    layout = RotaryLayout(
        rot,
        draw(st.sampled_from(["half", "interleaved"])),
        draw(st.sampled_from([10000.0, 100.0, 2.5])),
        p,
        axes=axes,
        grid=grid,
        shared_shift=draw(st.booleans()),
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0]))
    h_kv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    q = rng.standard_normal((h_kv * group, d, n)) * scale
    k = rng.standard_normal((h_kv, d, n)) * scale
    return q, k, np.arange(h_kv * group) // group, layout


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(heads_and_axes_layout())
def test_reported_bounds_dominate_every_offset_vector(case):
    q, k, kv_index, layout = case
    d, n = q.shape[1:]
    envs = rotary_qk_envelope(
        q,
        k,
        kv_index,
        layout,
        rank_tol=RANK_TOL,
        exact_norm_2_1=True,
        max_core_svds=q.shape[0] * layout.max_offset_count,
    )
    bound = rotary_qk_envelope(
        q, k, kv_index, layout, rank_tol=RANK_TOL, max_core_svds=q.shape[0] * layout.max_offset_count - 1
    )
    flat = RotaryLayout(layout.rotary_dim, layout.pairing, layout.base, layout.max_positions)
    flat_envs = rotary_qk_envelope(q, k, kv_index, flat, rank_tol=RANK_TOL, max_core_svds=10**6)
    offsets = layout.offsets
    for env, b, f in zip(envs, bound, flat_envs):
        wq, wk = q[env.head], k[env.kv_head]
        assert env.spectral_method == env.norm_2_1_method == "exact_over_offsets"
        assert b.spectral_method == "product_bound" and b.argmax_offset is None
        x = np.einsum("ai,tij,jb->tab", wq.T, rotations(layout, d, offsets), wk)
        sv = np.linalg.svd(x, compute_uv=False)
        n21 = np.linalg.norm(x, axis=1).sum(axis=1)
        assert env.spectral_sup == pytest.approx(sv[:, 0].max(), rel=1e-12, abs=1e-300)
        assert env.norm_2_1_sup == pytest.approx(n21.max(), rel=1e-12, abs=1e-300)
        assert all(leq(a, c) for a, c in zip(sv.max(axis=0), env.sigma_bounds))
        assert leq(np.linalg.norm(x, axis=(1, 2)).max(), env.frobenius_sup)
        assert leq(sv.sum(axis=1).max(), env.nuclear_sup)
        assert leq(np.abs(x).sum(axis=(1, 2)).max(), env.norm_1_1_bound)
        for e in (env, b):
            assert leq(sv[:, 0].max(), e.spectral_sup) and leq(sv[:, 0].max(), e.spectral_bound)
        assert len(env.argmax_offset) == layout.n_axes
        s_arg = np.linalg.svd(wq.T @ rotation(layout, d, env.argmax_offset) @ wk, compute_uv=False)[0]
        assert s_arg == pytest.approx(env.spectral_sup, rel=1e-12, abs=1e-300)
        if layout.shared_shift:  # the offsets (d, ..., d) are among them: never below the 1D maximum
            assert leq(f.spectral_sup, env.spectral_sup)
            np.testing.assert_array_equal(env.envelope, f.envelope)
        got = exact_qk_at_offsets(wq, wk, layout, offsets)
        np.testing.assert_allclose(got, sv[:, : got.shape[1]], rtol=0, atol=1e-12 * max(sv[0, 0], 1e-300) + 1e-300)


def test_an_unused_last_axis_changes_no_maximum():
    """Pairs on axes 0 and 1 only: the offsets on two axes are the three-axis set's projection (a text tower
    whose mrope_section leaves the width axis empty), so the exact maxima agree."""
    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((2, 8, 10)), rng.standard_normal((1, 8, 10))
    two = RotaryLayout(8, "half", 30.0, 3, axes=(0, 0, 1, 1))
    three = RotaryLayout(8, "half", 30.0, 3, axes=(0, 0, 1, 1), grid=(3, 3, 3))
    assert (two.n_axes, three.n_axes, len(two.offsets), len(three.offsets)) == (2, 3, 25, 125)
    for a, b in zip(
        rotary_qk_envelope(q, k, [0, 0], two, rank_tol=RANK_TOL, max_core_svds=10**4),
        rotary_qk_envelope(q, k, [0, 0], three, rank_tol=RANK_TOL, max_core_svds=10**4),
    ):
        assert a.spectral_method == b.spectral_method == "exact_over_offsets"
        assert a.spectral_sup == pytest.approx(b.spectral_sup, rel=1e-13)
        np.testing.assert_allclose(a.sigma_bounds, b.sigma_bounds, rtol=1e-13)


def test_doubled_layout_keeps_the_axes():
    layout = RotaryLayout(6, "half", 30.0, 8, axes=(2, 0, 1))
    layout2, order = doubled_layout(layout, 8)
    assert layout2.axes == (2, 0, 1, 2, 0, 1)
    for delta in ([1, -3, 2], [4, 4, 4], [0, 5, -6]):
        m, m2 = rotation(layout, 8, delta), rotation(layout2, 16, delta)
        blocks = np.zeros((16, 16))
        blocks[:8, :8], blocks[8:, 8:] = m, m
        np.testing.assert_allclose(m2, blocks[order][:, order], atol=1e-15)


@pytest.mark.parametrize("shared_shift", [True, False])
def test_the_difference_from_init_at_every_offset_vector(shared_shift):
    """``--init`` on an M-RoPE head: ``A^T M B - A0^T M B0`` through the doubled layout, against the dense
    differences at every offset vector (as tests/compute/test_distance.py does in 1D)."""

    rng = np.random.default_rng(9)
    heads, d, n = 2, 6, 9
    a, b = rng.standard_normal((heads, d, n)), rng.standard_normal((heads, d, n))
    a0, b0 = a + 0.3 * rng.standard_normal(a.shape), b + 0.3 * rng.standard_normal(b.shape)
    layout = RotaryLayout(6, "half", 20.0, 3, axes=(2, 0, 1), shared_shift=shared_shift, grid=(2, 3, 3))
    w = lambda q, k: LayerWeights(0, q, k, k, q, {})  # noqa: E731
    spectra = rotary_difference_spectra(w(a, b), w(a0, b0), layout, rank_tol=RANK_TOL)
    m = rotations(layout, d, layout.offsets)
    for h, s in enumerate(spectra):
        x = np.einsum("ai,tij,jb->tab", a[h].T, m, b[h]) - np.einsum("ai,tij,jb->tab", a0[h].T, m, b0[h])
        sv = np.linalg.svd(x, compute_uv=False)
        assert s.exact_over_offsets and s.spectral_norm == pytest.approx(sv[:, 0].max(), rel=1e-9)
        slack = 1 + 1e-9  # the core route and the dense one round differently
        assert s.frobenius_norm * slack >= np.linalg.norm(x, axis=(1, 2)).max()
        assert s.nuclear_norm(RANK_TOL) * slack >= sv.sum(axis=1).max()
        assert s.norm_2_1 * slack >= np.linalg.norm(x, axis=1).sum(axis=1).max()
        assert s.norm_1_1 * slack >= np.abs(x).sum(axis=(1, 2)).max()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(axes=(0, 1)), "axes must give"),
        (dict(axes=(0, 1, -1)), "axes must give"),
        (dict(axes=(0, 1, 2), grid=(3, 3)), "grid must give"),
        (dict(axes=(0, 1, 2), grid=(3, 0, 3)), "grid must give"),
        (dict(grid=(2, 2)), "needs the pairs' axes"),
        (dict(axes=(0, 1, 1), offset_invariant=False), "LongRoPE"),
    ],
)
def test_axes_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryLayout(6, "half", 1e4, 8, **kwargs)
    with pytest.raises(ValueError, match=r"shape \(K, 3\)"):
        rotation(RotaryLayout(6, "half", 1e4, 8, axes=(0, 1, 2)), 6, [1, 2])
