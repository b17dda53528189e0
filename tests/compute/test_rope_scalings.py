"""Every rope type transformers knows (default, linear, dynamic, yarn, longrope, llama3), read as the
model computes it, and brute force over every pair of positions with the model's own ``rotary_emb``.

* the frequencies and the attention factor specbound reads equal those of transformers' own
  ``ROPE_INIT_FUNCTIONS`` (hypothesis over the parameters) and of the module after a forward;
* a tiny LLaMA with each rope type, saved and analysed with no spec: its ``rotary_emb`` on one
  sequence of all positions gives ``cos, sin`` (for LongRoPE one factor set per sequence length:
  both are tried), every pair ``(t, s)`` gives the logit matrix ``W_Q^T C(t) C(s)^T W_K`` (``C(t)`` the
  row-vector map ``q -> q cos_t + rotate_half(q) sin_t``), and no reported QK quantity is below that
  matrix's;
* an unknown rope type is refused in one line; no Python warning reaches the caller.

Slack: transformers builds ``cos, sin`` in float32 (angles ``t theta`` rounded at ~6e-8 relative,
``|cos|^2 + |sin|^2 = a^2`` to ~1e-7), so a bound exact at float64 angles may sit below the module's
matrix by ~1e-6 relative at these positions; ``SLACK = 1e-5`` is ten times that and far below any real
under-report (the attention factor alone is 14-30% here).
"""

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402, TID253

import specbound  # noqa: E402
from specbound import SpecboundError  # noqa: E402
from specbound.archs.rotary import parse_rotary  # noqa: E402

N, H, KV, D, P = 16, 2, 1, 8, 32
SLACK = 1e-5
P_GRID = (0.05, 0.5, 1.0, 2.0)
TYPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 8},
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 16,
        "long_factor": [1.0, 2.5, 4.0, 9.0],
        "short_factor": [1.0, 1.1, 1.3, 1.7],
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 16,
    },
}


def _config(rope, positions=P):
    return transformers.LlamaConfig(
        hidden_size=N,
        num_hidden_layers=1,
        num_attention_heads=H,
        num_key_value_heads=KV,
        intermediate_size=24,
        vocab_size=32,
        max_position_embeddings=positions,
        head_dim=D,
        rope_parameters=dict(rope),
    )


def _model(rope, seed=0):
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(_config(rope)).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return model


def _cos_sin(model, length):
    """The module's cos, sin on one sequence of positions 0..length-1, float64, (length, D)."""
    rope = model.model.rotary_emb
    x = torch.zeros(1, length, N)
    with torch.no_grad():
        cos, sin = rope(x, torch.arange(length)[None])
    return cos[0].double().numpy(), sin[0].double().numpy()


def _rotation_maps(cos, sin):
    """C(t) with q_rot = q @ C(t) = q cos_t + rotate_half(q) sin_t, (T, D, D)."""
    eye = np.eye(D)
    half = np.concatenate([-eye[:, D // 2 :], eye[:, : D // 2]], axis=1)  # rotate_half of each row of I
    return eye[None] * cos[:, None, :] + half[None] * sin[:, None, :]


def _kept(s, dim):
    return s[s > 1e-10 * dim * max(s[0], 1.0)]


# ------------------------------------------------------------------------------------------------
# The frequencies and the attention factor, as transformers computes them
# ------------------------------------------------------------------------------------------------


def _hf(rope, positions=P):
    kind = rope["rope_type"]
    config = _config(rope, positions)
    if kind == "default":
        return transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[kind](config, None)


def _ours(rope, positions=P):
    return parse_rotary(_config(rope, positions).to_dict(), D, "half")


@settings(max_examples=40, deadline=None)
@given(
    theta=st.floats(100.0, 1e6),
    factor=st.floats(1.0, 40.0),
    original=st.integers(4, 64),
    beta_fast=st.sampled_from([None, 16.0, 32.0]),
    beta_slow=st.sampled_from([None, 1.0, 2.0]),
    mscale=st.sampled_from([None, (1.0, 1.0), (0.707, 1.0)]),
    truncate=st.booleans(),
)
def test_yarn_frequencies_and_attention_factor_equal_transformers(
    theta, factor, original, beta_fast, beta_slow, mscale, truncate
):
    rope = {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": factor,
        "original_max_position_embeddings": original,
        "truncate": truncate,
    }
    if beta_fast:
        rope["beta_fast"] = beta_fast
    if beta_slow:
        rope["beta_slow"] = beta_slow
    if mscale:
        rope["mscale"], rope["mscale_all_dim"] = mscale
    inv_freq, attention = _hf(rope, positions=4 * original)
    layout = _ours(rope, positions=4 * original)
    # transformers computes in float32 (its blend of two float32 frequency sets loses a few ulps: 2.04e-6
    # relative was drawn at theta 100, factor 26, original 63); ours is float64
    np.testing.assert_allclose(layout.thetas, inv_freq.double().numpy(), rtol=1e-5)
    assert layout.attention_factor == pytest.approx(attention, rel=1e-12)


def llama3_float32_rtol(factor, low, high):
    """How far transformers' float32 llama3 frequencies may lie from ours (float64), relative: its
    ``inv_freq = 1 / theta^(2i/D)`` within ``e = 4u`` (``u = 2^-24``; 2i/D exact, theta rounded to
    float32, pow within an ulp, the reciprocal rounded); a smoothed value adds five roundings and the
    error of its weight ``s = (original / wavelength - low) / (high - low)``, whose numerator carries
    ``(e + 4u) original / wavelength <= (e + 4u) high``; a weight error moves the value by ``f (1 - 1 /
    factor)`` against a value of at least ``f / factor``, so it counts ``factor - 1`` times.  Twice that
    (3000 random draws here reached 0.12 of it, 7.3e-6 at factor 32, low 1.76, high 2.38, beyond the
    2e-6 this test used before); never below 2e-6."""
    u = 2.0**-24
    e = 4 * u
    return max(2e-6, 2 * (e + 5 * u + (factor - 1) * ((e + 4 * u) * high / (high - low) + u)))


@settings(max_examples=40, deadline=None)
@given(
    theta=st.floats(100.0, 1e6),
    factor=st.floats(1.0, 40.0),
    low=st.floats(0.5, 2.0),
    gap=st.floats(0.5, 8.0),
    original=st.integers(4, 8192),
)
@example(
    theta=684.6788303251644, factor=32.20938266519098, low=1.7634232776445755, gap=0.6210348137111044, original=1488
)  # 7.3e-6 relative: beyond the 2e-6 this test used before
def test_llama3_and_linear_frequencies_equal_transformers(theta, factor, low, gap, original):
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": low + gap,
        "original_max_position_embeddings": original,
    }
    linear = {"rope_type": "linear", "rope_theta": theta, "factor": factor}
    for rope, rtol in ((llama3, llama3_float32_rtol(factor, low, low + gap)), (linear, 2e-6)):
        inv_freq, attention = _hf(rope)
        layout = _ours(rope)
        np.testing.assert_allclose(layout.thetas, inv_freq.double().numpy(), rtol=rtol)
        assert layout.attention_factor == attention == 1.0


@settings(max_examples=40, deadline=None)
@given(theta=st.floats(100.0, 1e6), factor=st.floats(1.0, 40.0), low=st.floats(0.5, 4.0), original=st.integers(4, 8192))
def test_llama3_without_a_smoothing_band_equals_transformers(theta, factor, low, original):
    """``high_freq_factor == low_freq_factor`` (Llama 4 Scout: 1.0 and 1.0): every wavelength is scaled
    by the factor or left, as transformers computes it (its smoothing band is empty)."""
    rope = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": low,
        "original_max_position_embeddings": original,
    }
    inv_freq, attention = _hf(rope)
    assume(np.isfinite(inv_freq.numpy()).all())  # a wavelength exactly on the boundary: NaN there (refused below)
    layout = _ours(rope)
    np.testing.assert_allclose(layout.thetas, inv_freq.double().numpy(), rtol=2e-6)
    assert layout.attention_factor == attention == 1.0


def test_llama4_scouts_rope_equals_transformers():
    scout = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    }
    inv_freq, _ = _hf(scout)
    assert (inv_freq.double().numpy() < _hf({"rope_type": "default", "rope_theta": 500000.0})[0].double().numpy()).any()
    np.testing.assert_allclose(_ours(scout).thetas, inv_freq.double().numpy(), rtol=2e-6)


@settings(max_examples=30, deadline=None)
@given(
    theta=st.floats(100.0, 1e6),
    original=st.integers(4, 64),
    ratio=st.integers(1, 8),
    long=st.lists(st.floats(1.0, 30.0), min_size=4, max_size=4),
    short=st.lists(st.floats(1.0, 3.0), min_size=4, max_size=4),
    given_factor=st.sampled_from([None, 0.9, 1.7]),
)
def test_longrope_sets_and_attention_factor_equal_transformers(theta, original, ratio, long, short, given_factor):
    rope = {
        "rope_type": "longrope",
        "rope_theta": theta,
        "original_max_position_embeddings": original,
        "long_factor": long,
        "short_factor": short,
    }
    if given_factor:
        rope["attention_factor"] = given_factor
    positions = ratio * original
    config = _config(rope, positions)
    short_freq, attention = ROPE_INIT_FUNCTIONS["longrope"](config, None)
    long_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=original + 1)
    layout = _ours(rope, positions)
    np.testing.assert_allclose(layout.thetas, long_freq.double().numpy(), rtol=2e-6)
    assert layout.attention_factor == pytest.approx(attention, rel=1e-12)
    assert not layout.offset_invariant  # both sets and a cache mixing them: the bounds for every rotation
    assert short_freq.shape == long_freq.shape


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_the_module_uses_the_frequencies_read(kind):
    """After a forward over the whole context (dynamic and LongRoPE update their frequencies there)."""
    model = _model(TYPES[kind])
    _cos_sin(model, P)
    layout = _ours(TYPES[kind])
    np.testing.assert_allclose(layout.thetas, model.model.rotary_emb.inv_freq.double().numpy(), rtol=2e-6)
    assert layout.attention_factor == pytest.approx(model.model.rotary_emb.attention_scaling, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# Brute force over every pair of positions, with the model's own rotary_emb
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=sorted(TYPES))
def analysed(request, tmp_path_factory):
    kind = request.param
    model = _model(TYPES[kind], seed=len(kind))
    folder = tmp_path_factory.mktemp(kind)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Python warning from a normal analysis
        analysis = specbound.analyze(folder, threads=1)
    return kind, model.double(), analysis


def test_no_qk_quantity_is_below_any_pair_of_positions(analysed):
    kind, model, a = analysed
    attn = model.model.layers[0].self_attn
    q = attn.q_proj.weight.detach().numpy().reshape(H, D, N)
    k = attn.k_proj.weight.detach().numpy().reshape(KV, D, N)
    lengths = (P, TYPES[kind]["original_max_position_embeddings"]) if kind == "longrope" else (P,)
    rows = a.matrices[a.matrices["role"] == "QK"]
    sv = a.singular_values
    for length in lengths:  # LongRoPE: the long set (P > original) and the short one
        c = _rotation_maps(*_cos_sin(model, length))
        pair = np.einsum("tij,skj->tsik", c, c)  # C(t) C(s)^T, (T, T, D, D)
        for h, (i, row) in enumerate(rows.iterrows()):
            g = h // (H // KV)
            mats = np.einsum("ia,tsij,jb->tsab", q[h], pair, k[g]).reshape(-1, N, N)  # every (t, s)
            s = np.linalg.svd(mats, compute_uv=False)
            envelope = np.sort(sv[sv["matrix"] == i]["sigma"].to_numpy())[::-1][: int(row["rank"])]
            assert s[:, 0].max() <= row["spectral_norm"] * (1 + SLACK), (kind, length, h)
            assert np.sqrt(np.sum(s**2, axis=1)).max() <= row["frobenius_norm"] * (1 + SLACK)
            assert np.linalg.norm(mats, axis=1).sum(axis=1).max() <= row["norm_2_1"] * (1 + SLACK)
            assert np.abs(mats).sum(axis=(1, 2)).max() <= row["norm_1_1"] * (1 + SLACK)
            for sp in s:
                kept = _kept(sp, N)
                assert kept.size <= row["rank"]
                for p in P_GRID:
                    assert np.sum(kept**p) <= np.sum(envelope**p) * (1 + SLACK)
            if kind != "longrope" and length == P:  # exact over the offsets at the model's frequencies
                assert row["spectral_norm"] == pytest.approx(s[:, 0].max(), rel=1e-4)


def test_the_attention_factor_is_in_the_numbers_and_the_assumptions(analysed):
    kind, model, a = analysed
    rope = model.model.rotary_emb
    assert a.model["rotary"]["attention_factor"] == pytest.approx(rope.attention_scaling, rel=1e-12)
    named = {e["name"]: e for e in a.assumptions if e["applies"]}
    if kind == "default":
        assert "rope_scaling" not in named and a.model["rotary"]["scaling"] is None
        return
    assert a.model["rotary"]["scaling"] == kind and kind in named["rope_scaling"]["effect"]
    if rope.attention_scaling != 1.0:
        assert f"a = {rope.attention_scaling:.6g}" in named["rope_scaling"]["effect"]
        assert f"rotary: rope scaling {kind} with attention factor a = " in str(a)  # and in the text summary


def test_an_unknown_rope_type_is_refused_in_one_line(tmp_path):
    model = _model(TYPES["default"])
    transformers.logging.set_verbosity_error()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecboundError, match="rope type 'proportional' is not one specbound models") as info:
        specbound.analyze(tmp_path, threads=1)
    assert "\n" not in str(info.value)


def test_the_older_rope_scaling_form_reads_the_same():
    """transformers 4's config.json: rope_theta at the top, rope_scaling = {"type": ..., ...}."""
    v5 = _ours(TYPES["yarn"])
    old = {
        "rope_theta": 10000.0,
        "max_position_embeddings": P,
        "head_dim": D,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    }
    assert parse_rotary(old, D, "half") == v5
    assert math.isclose(v5.attention_factor, 0.1 * math.log(4.0) + 1.0)
