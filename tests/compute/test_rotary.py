"""Rotary position embeddings in the QK matrices (specbound.compute.rotary, docs/rotary.md).

* the rotation convention against HF's own ``apply_rotary_pos_emb`` (LLaMA, GPT-NeoX partial
  rotary, GPT-J interleaved);
* a head whose rotation-blind ``W_Q^T W_K`` is 0 but whose rotary logits are not;
* property tests: at every offset (and at random orthogonal matrices) the dense ``N x N`` product's
  spectral norm, numerical rank, ``S_p``, (2,1)- and (1,1)-norms never exceed the reported bounds.

Slack.  Reported and dense values are computed by different float64 routes (a ``k x k`` core SVD vs
a dense ``N x N`` product and SVD), so they agree only to rounding: backward-stable SVDs and products
of size ``<= 24`` put relative errors near ``N * eps ~ 5e-15``.  ``REL = 1e-12`` leaves a ~200x margin
above that and is still far below any real violation (those would be O(1) relative).
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbound.archs.model import RotaryLayout
from specbound.archs.rotary import parse_rotary
from specbound.compute.rotary import (
    DEFAULT_MAX_CORE_SVDS,
    exact_qk_at_offsets,
    rotary_qk_envelope,
    rotation,
    rotations,
)

REL = 1e-12
RANK_TOL = 1e-10  # the project's default rank tolerance (project_rank below restates it)
P_GRID = (1e-3, 0.05, 0.25, 0.5, 1.0, 1.5, 2.0)


def leq(a, b):
    return a <= b * (1 + REL) + 1e-300


def project_rank(s, dim, rank_tol=1e-10):
    """The project's numerical rank (spectra.numerical_rank), restated so the test is standalone."""
    s1 = float(s[0]) if s.size else 0.0
    return int(np.count_nonzero(s > rank_tol * max(dim, 1) * max(s1, 1.0)))


def project_schatten(s, p, dim, rank_tol=1e-10):
    """The project's S_p = sum over s_i above the rank tolerance (spectra.schatten_power)."""
    s1 = float(s[0]) if s.size else 0.0
    kept = s[s > rank_tol * max(dim, 1) * max(s1, 1.0)]
    return float(kept.size) if p == 0 else float(np.sum(kept**p))


def dense_qk(wq, wk, layout, delta):
    return wq.T @ rotation(layout, wq.shape[0], delta) @ wk


# ------------------------------------------------------------------------------------------------
# The rotation against HF transformers
# ------------------------------------------------------------------------------------------------


def _hf_cos_sin_half(layout, positions):
    """cos/sin exactly as HF's default rope builds them (emb = cat(freqs, freqs)), but in float64:
    HF computes them in float32, which would limit the comparison to ~1e-5."""
    import torch

    dim = layout.rotary_dim
    inv_freq = 1.0 / (layout.base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.as_tensor(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None], emb.sin()[None]  # (1, seq, rot)


def _check_logits(wq, wk, layout, positions, q_rot, k_rot, x):
    """q_rot[t] . k_rot[s] == x_t W_Q^T M(t - s) W_K x_s^T, and q_rot[t] == q[t] @ M(t)."""
    d = wq.shape[0]
    q = x @ wq.T
    for a, t in enumerate(positions):
        np.testing.assert_allclose(q_rot[a], q[a] @ rotation(layout, d, t), rtol=0, atol=1e-12)
        for b, s in enumerate(positions):
            hf = float(q_rot[a] @ k_rot[b])
            ours = float(x[a] @ wq.T @ rotation(layout, d, t - s) @ wk @ x[b])
            assert abs(hf - ours) <= 1e-10 * max(1.0, abs(hf)), (t, s, hf, ours)


POSITIONS = [0, 1, 5, 17, 40, 63]


def test_rotation_matches_hf_llama():
    torch = pytest.importorskip("torch")
    ml = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        intermediate_size=48,
        num_hidden_layers=1,
    )
    layout = parse_rotary(config.to_dict(), 16, "half")
    assert layout == RotaryLayout(16, "half", 10000.0, 64)
    # HF's own (float32) tables agree with our angles to float32 accuracy.
    rope = ml.LlamaRotaryEmbedding(config)
    np.testing.assert_allclose(rope.inv_freq.double().numpy(), layout.thetas, rtol=1e-6)
    cos32, sin32 = rope(torch.zeros(1, dtype=torch.float32), torch.tensor([POSITIONS]))
    cos64, sin64 = _hf_cos_sin_half(layout, POSITIONS)
    np.testing.assert_allclose(cos32.double().numpy(), cos64.numpy(), atol=2e-5)
    np.testing.assert_allclose(sin32.double().numpy(), sin64.numpy(), atol=2e-5)

    rng = np.random.default_rng(0)
    w_q, w_k = rng.standard_normal((32, 32)), rng.standard_normal((32, 32))  # q_proj / k_proj weights
    x = rng.standard_normal((len(POSITIONS), 32))
    q = torch.from_numpy(x @ w_q.T).view(1, len(POSITIONS), 2, 16).transpose(1, 2)  # (batch, heads, seq, d)
    k = torch.from_numpy(x @ w_k.T).view(1, len(POSITIONS), 2, 16).transpose(1, 2)
    q_rot, k_rot = ml.apply_rotary_pos_emb(q, k, cos64, sin64)
    for h in range(2):
        rows = slice(16 * h, 16 * (h + 1))
        _check_logits(w_q[rows], w_k[rows], layout, POSITIONS, q_rot[0, h].numpy(), k_rot[0, h].numpy(), x)


def test_rotation_matches_hf_gpt_neox_partial():
    torch = pytest.importorskip("torch")
    mn = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")
    from transformers import GPTNeoXConfig

    config = GPTNeoXConfig(
        hidden_size=32,
        num_attention_heads=2,
        rotary_pct=0.25,
        max_position_embeddings=64,
        intermediate_size=48,
        num_hidden_layers=1,
    )
    layout = parse_rotary(config.to_dict(), 16, "half")
    assert (layout.rotary_dim, layout.pairing, layout.max_positions) == (4, "half", 64)
    rope = mn.GPTNeoXRotaryEmbedding(config)
    np.testing.assert_allclose(rope.inv_freq.double().numpy(), layout.thetas, rtol=1e-6)
    cos32, _ = rope(torch.zeros(1, dtype=torch.float32), torch.tensor([POSITIONS]))
    cos64, sin64 = _hf_cos_sin_half(layout, POSITIONS)
    assert cos32.shape[-1] == 4
    np.testing.assert_allclose(cos32.double().numpy(), cos64.numpy(), atol=2e-5)

    rng = np.random.default_rng(1)
    w_q, w_k = rng.standard_normal((32, 32)), rng.standard_normal((32, 32))
    x = rng.standard_normal((len(POSITIONS), 32))
    q = torch.from_numpy(x @ w_q.T).view(1, len(POSITIONS), 2, 16).transpose(1, 2)
    k = torch.from_numpy(x @ w_k.T).view(1, len(POSITIONS), 2, 16).transpose(1, 2)
    q_rot, k_rot = mn.apply_rotary_pos_emb(q, k, cos64, sin64)
    for h in range(2):
        rows = slice(16 * h, 16 * (h + 1))
        np.testing.assert_array_equal(q_rot[0, h, :, 4:].numpy(), q[0, h, :, 4:].numpy())  # unrotated tail
        _check_logits(w_q[rows], w_k[rows], layout, POSITIONS, q_rot[0, h].numpy(), k_rot[0, h].numpy(), x)


def test_rotation_matches_hf_gptj_interleaved():
    torch = pytest.importorskip("torch")
    mj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
    from transformers import GPTJConfig

    config = GPTJConfig(n_embd=32, n_head=2, rotary_dim=8, n_positions=64, n_layer=1)
    layout = parse_rotary(config.to_dict(), 16, "interleaved")
    assert layout == RotaryLayout(8, "interleaved", 10000.0, 64)
    table32 = mj.create_sinusoidal_positions(64, 8)  # (positions, [sin | cos]) in float32
    ang = np.asarray(POSITIONS, dtype=float)[:, None] * layout.thetas[None, :]
    np.testing.assert_allclose(
        table32[POSITIONS].double().numpy(), np.concatenate([np.sin(ang), np.cos(ang)], 1), atol=2e-5
    )

    rng = np.random.default_rng(2)
    w_q, w_k = rng.standard_normal((32, 32)), rng.standard_normal((32, 32))
    x = rng.standard_normal((len(POSITIONS), 32))
    sin, cos = torch.from_numpy(np.sin(ang))[None], torch.from_numpy(np.cos(ang))[None]  # (1, seq, rot/2)

    def rope(t):  # GPTJAttention.forward: rotate the first rotary_dim dims, pass the rest
        t = t.view(1, len(POSITIONS), 2, 16)
        return torch.cat([mj.apply_rotary_pos_emb(t[..., :8], sin, cos), t[..., 8:]], dim=-1)

    q_rot, k_rot = rope(torch.from_numpy(x @ w_q.T)), rope(torch.from_numpy(x @ w_k.T))
    for h in range(2):
        rows = slice(16 * h, 16 * (h + 1))
        _check_logits(w_q[rows], w_k[rows], layout, POSITIONS, q_rot[0, :, h].numpy(), k_rot[0, :, h].numpy(), x)


# ------------------------------------------------------------------------------------------------
# Rotation matrices
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rotations_group_and_orthogonality(pairing):
    layout = RotaryLayout(6, pairing, 10.0, 32)
    deltas = np.array([-7.0, 0.0, 2.5, 3.0, 31.0])
    stack = rotations(layout, 8, deltas)
    assert stack.shape == (5, 8, 8)
    for m, t in zip(stack, deltas):
        np.testing.assert_array_equal(m, rotation(layout, 8, t))
        np.testing.assert_allclose(m @ m.T, np.eye(8), atol=1e-15)
        np.testing.assert_allclose(m.T, rotation(layout, 8, -t), atol=1e-15)
        np.testing.assert_array_equal(m[6:, 6:], np.eye(2))  # unrotated dims
        assert not m[6:, :6].any() and not m[:6, 6:].any()
    np.testing.assert_allclose(
        rotation(layout, 8, 2.5) @ rotation(layout, 8, 3.0), rotation(layout, 8, 5.5), atol=1e-15
    )
    np.testing.assert_array_equal(rotation(layout, 8, 0), np.eye(8))


def test_interleaved_is_half_conjugated_by_a_permutation():
    half, inter = RotaryLayout(8, "half", 100.0, 16), RotaryLayout(8, "interleaved", 100.0, 16)
    u_h, v_h = half.pairs
    u_i, v_i = inter.pairs
    perm = np.empty(8, dtype=int)  # interleaved dim -> half dim
    perm[u_i], perm[v_i] = u_h, v_h
    for t in (-5, 1, 9):
        np.testing.assert_array_equal(rotation(inter, 8, t), rotation(half, 8, t)[np.ix_(perm, perm)])


# ------------------------------------------------------------------------------------------------
# A head whose rotation-blind QK is 0 while its rotary QK is not
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("pair", [0, 1, 3])
def test_zero_rotation_blind_qk_but_nonzero_rotary(pairing, pair):
    d = 8
    layout = RotaryLayout(8, pairing, 10000.0, 64)
    a, b = layout.pairs[0][pair], layout.pairs[1][pair]
    e = np.eye(d)
    wq, wk = 3 * np.outer(e[a], e[a]), 3 * np.outer(e[b], e[b])  # W_Q = 3 e_a e_a^T, W_K = 3 e_b e_b^T
    assert not (wq.T @ wk).any()  # the rotation-blind QK matrix is exactly 0: rank 0, S_p = 0
    deltas = layout.offsets
    expected = 9 * np.abs(np.sin(deltas * layout.thetas[pair]))
    exact = exact_qk_at_offsets(wq, wk, layout, deltas)
    np.testing.assert_allclose(exact[:, 0], expected, rtol=1e-13, atol=1e-14)
    for t in (1, 11, -11):
        s = np.linalg.svd(dense_qk(wq, wk, layout, t), compute_uv=False)
        assert s[0] == pytest.approx(9 * abs(math.sin(t * layout.thetas[pair])), rel=1e-13)
    (env,) = rotary_qk_envelope(wq[None], wk[None], None, layout, rank_tol=RANK_TOL)
    assert env.spectral_method == "exact_over_offsets"
    assert env.spectral_sup == pytest.approx(expected.max(), rel=1e-13)
    assert env.spectral_sup >= expected.max() * (1 - REL) and env.spectral_bound == pytest.approx(9.0)
    assert env.rank_bound >= 1 and env.schatten_power(1.0) >= expected.max() * (1 - REL)
    (blind,) = rotary_qk_envelope(wq[None], wk[None], None, layout, rank_tol=RANK_TOL, max_core_svds=0)
    assert blind.spectral_method == "product_bound" and blind.spectral_sup == pytest.approx(9.0)


# ------------------------------------------------------------------------------------------------
# Property tests against the dense N x N oracle
# ------------------------------------------------------------------------------------------------


def _random_factor(rng, d, n, rank, scale):
    w = rng.standard_normal((d, n)) * scale
    if rank < min(d, n):  # exactly rank-deficient: project the rows onto a rank-`rank` subspace
        basis = np.linalg.qr(rng.standard_normal((n, max(rank, 1))))[0][:, :rank]
        w = w @ basis @ basis.T
    return w


@st.composite
def heads_and_layout(draw):
    d = draw(st.sampled_from([2, 4, 8]))
    n = draw(st.integers(1, 24))
    rot = draw(st.sampled_from([r for r in (2, 4, 6, 8) if r <= d]))
    layout = RotaryLayout(
        rot,
        draw(st.sampled_from(["half", "interleaved"])),
        draw(st.sampled_from([10000.0, 100.0, 2.5])),
        draw(st.integers(1, 64)),
    )
    h_kv = draw(st.integers(1, 2))
    group = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 0.05, 1.0, 30.0]))
    k_min = min(d, n)
    q = np.stack([_random_factor(rng, d, n, draw(st.integers(0, k_min)), scale) for _ in range(h_kv * group)])
    k = np.stack([_random_factor(rng, d, n, draw(st.integers(0, k_min)), scale) for _ in range(h_kv)])
    return q, k, np.arange(h_kv * group) // group, layout


def _check_all_bounds(x, env, n):
    s = np.linalg.svd(x, compute_uv=False)
    assert leq(s[0], env.spectral_sup) and leq(s[0], env.spectral_bound)
    assert project_rank(s, n) <= env.rank_bound
    for p in P_GRID:
        assert leq(project_schatten(s, p, n), env.schatten_power(p)), p
    assert leq(float(np.sqrt(np.sum(s**2))), env.frobenius_bound)
    n21 = float(np.linalg.norm(x, axis=0).sum())
    assert leq(n21, env.norm_2_1_sup) and leq(n21, env.norm_2_1_bound)
    assert leq(float(np.abs(x).sum()), env.norm_1_1_bound)
    return s[0], n21


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads_and_layout())
def test_reported_bounds_dominate_every_offset(case):
    q, k, kv_index, layout = case
    d, n = q.shape[1:]
    envs = rotary_qk_envelope(q, k, kv_index, layout, rank_tol=RANK_TOL, exact_norm_2_1=True, max_core_svds=10**6)
    rng = np.random.default_rng(0)
    for env in envs:
        wq, wk = q[env.head], k[env.kv_head]
        assert env.kv_head == kv_index[env.head] and env.n == n
        assert env.spectral_method == env.norm_2_1_method == "exact_over_offsets"
        assert np.all(np.diff(env.envelope) <= 0) and env.envelope.size == min(d, n)
        assert 0 <= env.rank_bound <= min(d, n)
        tops, n21s = zip(*(_check_all_bounds(dense_qk(wq, wk, layout, t), env, n) for t in layout.offsets))
        # the exact maxima are attained (to rounding) by the dense products
        assert env.spectral_sup == pytest.approx(max(tops), rel=1e-12, abs=1e-300)
        assert env.norm_2_1_sup == pytest.approx(max(n21s), rel=1e-12, abs=1e-300)
        if env.argmax_offset is not None:
            s_arg = np.linalg.svd(dense_qk(wq, wk, layout, env.argmax_offset), compute_uv=False)[0]
            assert s_arg == pytest.approx(env.spectral_sup, rel=1e-12, abs=1e-300)
        # the envelope, rank and norm bounds hold for every orthogonal matrix, not only rotations
        for _ in range(3):
            r = np.linalg.qr(rng.standard_normal((d, d)))[0]
            s = np.linalg.svd(wq.T @ r @ wk, compute_uv=False)
            assert leq(s[0], env.spectral_bound) and project_rank(s, n) <= env.rank_bound
            for p in P_GRID:
                assert leq(project_schatten(s, p, n), env.schatten_power(p))
            x = wq.T @ r @ wk
            assert leq(float(np.linalg.norm(x, axis=0).sum()), env.norm_2_1_bound)
            assert leq(float(np.abs(x).sum()), env.norm_1_1_bound)


@settings(max_examples=25, deadline=None)
@given(heads_and_layout())
def test_exact_qk_at_offsets_matches_dense(case):
    q, k, kv_index, layout = case
    d, n = q.shape[1:]
    deltas = np.array([-(layout.max_positions - 1), -1, 0, 3, layout.max_positions - 1], dtype=float)
    got = exact_qk_at_offsets(q[0], k[kv_index[0]], layout, deltas)
    assert got.shape == (5, min(d, n))
    for row, t in zip(got, deltas):
        s = np.linalg.svd(dense_qk(q[0], k[kv_index[0]], layout, t), compute_uv=False)[: min(d, n)]
        np.testing.assert_allclose(row, s, rtol=0, atol=1e-12 * max(s[0], 1e-300) + 1e-300)


def test_rank_tolerance_needs_the_factor_rule():
    """Thresholding the envelope itself would undercount: e_2 = eps^2 is below tau while the
    product at an offset with cos ~ 0 has s_2 ~ eps^2 / |cos| well above it."""
    eps = 1e-5
    layout = RotaryLayout(2, "half", 10000.0, 16)  # one pair, theta_0 = 1 rad; cos(11) = 0.0044
    wq = wk = np.diag([1.0, eps])
    (env,) = rotary_qk_envelope(wq[None], wk[None], None, layout, rank_tol=RANK_TOL)
    tau = 1e-10 * 2 * max(env.envelope[0], 1.0)
    assert np.count_nonzero(env.envelope > tau) == 1  # the naive rule
    s = np.linalg.svd(dense_qk(wq, wk, layout, 11), compute_uv=False)
    assert project_rank(s, 2) == 2 and env.rank_bound == 2
    for p in P_GRID:
        assert leq(project_schatten(s, p, 2), env.schatten_power(p))


# ------------------------------------------------------------------------------------------------
# Layouts, partial rotary, offsets, budget, grouped-query attention
# ------------------------------------------------------------------------------------------------


def test_layouts_share_envelope_but_not_exact_values():
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 8, 12)), rng.standard_normal((2, 8, 12))
    half, inter = RotaryLayout(8, "half", 100.0, 32), RotaryLayout(8, "interleaved", 100.0, 32)
    for a, b in zip(
        rotary_qk_envelope(q, k, None, half, rank_tol=RANK_TOL),
        rotary_qk_envelope(q, k, None, inter, rank_tol=RANK_TOL),
    ):
        np.testing.assert_array_equal(a.envelope, b.envelope)
        assert (a.rank_bound, a.spectral_bound, a.norm_2_1_bound, a.norm_1_1_bound) == (
            b.rank_bound,
            b.spectral_bound,
            b.norm_2_1_bound,
            b.norm_1_1_bound,
        )
    ex_h = exact_qk_at_offsets(q[0], k[0], half, half.offsets)
    ex_i = exact_qk_at_offsets(q[0], k[0], inter, inter.offsets)
    np.testing.assert_allclose(ex_h[half.max_positions - 1], ex_i[half.max_positions - 1], rtol=1e-12)  # delta 0
    assert np.abs(ex_h - ex_i).max() > 1e-3 * ex_h.max()


def test_partial_rotary_leaves_tail_unrotated():
    rng = np.random.default_rng(4)
    layout = RotaryLayout(4, "half", 10000.0, 32)
    wq, wk = np.zeros((8, 10)), np.zeros((8, 10))
    wq[4:], wk[4:] = rng.standard_normal((4, 10)), rng.standard_normal((4, 10))  # only unrotated dims
    ex = exact_qk_at_offsets(wq, wk, layout, layout.offsets)
    blind = np.linalg.svd(wq.T @ wk, compute_uv=False)[:8]
    np.testing.assert_allclose(ex, np.broadcast_to(blind, ex.shape), rtol=1e-12, atol=1e-12 * blind[0])
    wq[:4], wk[:4] = rng.standard_normal((4, 10)), rng.standard_normal((4, 10))  # rotated dims: values move
    ex = exact_qk_at_offsets(wq, wk, layout, layout.offsets)
    assert np.ptp(ex[:, 0]) > 1e-3


def test_offsets_are_not_symmetric_but_swap_roles():
    """s(W_Q^T M(-delta) W_K) differs from s(W_Q^T M(delta) W_K) in general (so both signs are
    computed), but equals s(W_K^T M(delta) W_Q) (the transpose)."""
    rng = np.random.default_rng(5)
    layout = RotaryLayout(8, "half", 10000.0, 64)
    wq, wk = rng.standard_normal((8, 12)), rng.standard_normal((8, 12))
    pos = exact_qk_at_offsets(wq, wk, layout, np.arange(1, 64))
    neg = exact_qk_at_offsets(wq, wk, layout, -np.arange(1, 64))
    assert np.abs(pos[:, 0] - neg[:, 0]).max() > 1e-2 * pos[:, 0].max()
    np.testing.assert_allclose(neg, exact_qk_at_offsets(wk, wq, layout, np.arange(1, 64)), rtol=1e-12)


def test_budget_and_scaling_select_the_method():
    rng = np.random.default_rng(6)
    q, k = rng.standard_normal((3, 4, 9)), rng.standard_normal((3, 4, 9))
    layout = RotaryLayout(4, "half", 10000.0, 20)  # 3 heads x 39 offsets = 117 cores
    exact = rotary_qk_envelope(q, k, None, layout, rank_tol=RANK_TOL, max_core_svds=117)
    bound = rotary_qk_envelope(q, k, None, layout, rank_tol=RANK_TOL, max_core_svds=116)
    for e, b in zip(exact, bound):
        assert e.spectral_method == "exact_over_offsets" and b.spectral_method == "product_bound"
        assert e.argmax_offset is not None and b.argmax_offset is None
        assert e.spectral_sup <= b.spectral_sup == b.spectral_bound == e.spectral_bound
        assert b.norm_2_1_method == "bound" and b.norm_2_1_sup == b.norm_2_1_bound
    assert DEFAULT_MAX_CORE_SVDS < 32 * (2 * 4096 - 1)  # a LLaMA-7B layer gets the bound by default
    # a rope scaling's frequencies are modelled: the exact path runs at them ...
    halved = tuple(float(t) / 2 for t in layout.thetas)
    scaled = RotaryLayout(4, "half", 10000.0, 20, scaling="linear", inv_freq=halved)
    assert all(
        e.spectral_method == "exact_over_offsets" and e.norm_2_1_method == "exact_over_offsets"
        for e in rotary_qk_envelope(q, k, None, scaled, rank_tol=RANK_TOL, exact_norm_2_1=True)
    )
    # ... but LongRoPE's pairs are not a function of their offset alone: the bounds for every rotation
    mixed = RotaryLayout(4, "half", 10000.0, 20, scaling="longrope", inv_freq=halved, offset_invariant=False)
    assert all(
        e.spectral_method == "product_bound" and e.norm_2_1_method == "bound"
        for e in rotary_qk_envelope(q, k, None, mixed, rank_tol=RANK_TOL, exact_norm_2_1=True)
    )


def test_grouped_query_heads_use_their_kv_head():
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((4, 4, 10)), rng.standard_normal((2, 4, 10))
    layout = RotaryLayout(4, "interleaved", 500.0, 16)
    kv_index = np.arange(4) // 2
    grouped = rotary_qk_envelope(q, k, kv_index, layout, rank_tol=RANK_TOL, exact_norm_2_1=True)
    repeated = rotary_qk_envelope(q, k[kv_index], None, layout, rank_tol=RANK_TOL, exact_norm_2_1=True)
    for g, r in zip(grouped, repeated):
        assert g.kv_head == kv_index[g.head]
        for field in (
            "spectral_sup",
            "spectral_bound",
            "rank_bound",
            "norm_2_1_sup",
            "norm_2_1_bound",
            "norm_1_1_bound",
        ):
            assert getattr(g, field) == pytest.approx(getattr(r, field), rel=1e-14), field
    with pytest.raises(ValueError, match="kv_index"):
        rotary_qk_envelope(q, k, [0, 1, 2, 0], layout, rank_tol=RANK_TOL)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rotary_dim=3, pairing="half", base=1e4, max_positions=8), "rotary_dim"),
        (dict(rotary_dim=4, pairing="diag", base=1e4, max_positions=8), "pairing"),
        (dict(rotary_dim=4, pairing="half", base=-2.0, max_positions=8), "base"),
        (dict(rotary_dim=4, pairing="half", base=1e4, max_positions=0), "max_positions"),
    ],
)
def test_layout_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryLayout(**kwargs)
    with pytest.raises(ValueError, match="exceeds the head dimension"):
        rotation(RotaryLayout(8, "half", 1e4, 8), 4, 1)
