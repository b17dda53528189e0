"""The M-RoPE text towers of Qwen2-VL and Qwen2.5-VL (both read by qwen2_vl_text) and Qwen3-VL (qwen3_vl_text;
docs/rotary.md section 7), held by brute force on transformers' own attention modules.

* The queries and keys are captured before and after the module's own rotation (``apply_rotary_pos_emb``,
  one batch row per input basis vector, one sequence of position-id triples with unequal components): the
  logit of every pair of positions equals ``q M(t - s) k^T`` with specbound's layout (for Qwen2-VL, whose
  queries and keys are linear, ``x W_Q^T M(t - s) W_K x^T`` with the checkpoint's weights).
* Every offset vector of the derived set (``RotaryLayout.offsets``, the whole cube ``|delta_a| <= P - 1``
  for a text tower) is produced by the module at positions ``max(delta, 0)`` and ``max(-delta, 0)``; the
  reported QK row bounds every one of those ``N x N`` logit matrices and its spectral norm is their maximum.
* The same weights saved as ``qwen2`` / ``qwen3`` (1D rotary): the OV and feed-forward rows are the same
  numbers, the M-RoPE QK rows never below the 1D ones (Qwen3-VL's QK-norm rows do not depend on the rotation:
  equal).

The modules build cos/sin in float32, so comparisons allow 1e-6 relative (float32 rounding of the angles;
a wrong axis or frequency moves these numbers by tens of percent).
"""

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import load_file
from support.offset_checks import check_offset_matrix  # noqa: E402

import specbound  # noqa: E402
from specbound.archs.registry import builtin_specs, spec_for_config  # noqa: E402
from specbound.archs.rotary import rotary_layout  # noqa: E402
from specbound.archs.spec import parse_spec
from specbound.compute.rotary import rotation  # noqa: E402
from specbound.errors import SpecboundError  # noqa: E402
from specbound.records.view import format_summary  # noqa: E402

N, H, H_KV, D, P = 16, 2, 1, 8, 4  # hidden size, heads, key heads, head dim, context
SECTION = [1, 2, 1]  # 4 frequencies: Qwen2-VL's axes (0, 1, 1, 2), Qwen3-VL's (0, 1, 2, 0)
REL = 1e-6
FAMILIES = ("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text")  # the model types; qwen2_vl_text reads Qwen2.5-VL's
READ_BY = {"qwen2_5_vl_text": "qwen2_vl_text"}


def _classes(family):
    return {
        "qwen2_vl_text": ("Qwen2VLTextConfig", "Qwen2VLTextModel", "qwen2_vl"),
        "qwen2_5_vl_text": ("Qwen2_5_VLTextConfig", "Qwen2_5_VLTextModel", "qwen2_5_vl"),
        "qwen3_vl_text": ("Qwen3VLTextConfig", "Qwen3VLTextModel", "qwen3_vl"),
    }[family]


def _build(family, path, rope=None):
    """A tiny text tower of ``family`` with weights drawn at 0.3, saved to ``path``; the model in float64."""
    config_class, model_class, _ = _classes(family)
    rope = rope or {"rope_type": "default", "rope_theta": 100.0, "mrope_section": SECTION}
    config = getattr(transformers, config_class)(
        hidden_size=N,
        num_hidden_layers=1,
        num_attention_heads=H,
        num_key_value_heads=H_KV,
        head_dim=D,
        intermediate_size=24,
        vocab_size=32,
        max_position_embeddings=P,
        rope_parameters=rope,
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(11)
    model = getattr(transformers, model_class)(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(path)
    return model.double()


def _rotated(family, model, positions, monkeypatch):
    """``(q, k, q_rot, k_rot)``, each ``(N + 1, heads, len(positions), d)``: the module's queries and keys before
    and after its rotation for input ``e_i`` (row ``i < N``) or 0 (row ``N``) at every position-id triple."""
    modeling = __import__(f"transformers.models.{_classes(family)[2]}.modeling_{_classes(family)[2]}", fromlist=["x"])
    seen, original = {}, modeling.apply_rotary_pos_emb

    def capture(q, k, cos, sin, *args, **kwargs):
        seen["q"], seen["k"] = q, k
        seen["q_rot"], seen["k_rot"] = original(q, k, cos, sin, *args, **kwargs)
        return seen["q_rot"], seen["k_rot"]

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", capture)
    x = torch.zeros(N + 1, len(positions), N, dtype=torch.float64)
    x[:N] = torch.eye(N, dtype=torch.float64)[:, None, :]
    pos = torch.as_tensor(np.asarray(positions).T)[:, None, :].expand(3, N + 1, len(positions))
    with torch.no_grad():
        model.layers[0].self_attn(x, attention_mask=None, position_embeddings=model.rotary_emb(x, pos))
    return tuple(seen[key].numpy() for key in ("q", "k", "q_rot", "k_rot"))


def _layout(family, path):
    config = json.loads((path / "config.json").read_text())
    return rotary_layout(spec_for_config(config), config, D, where=str(path))


def _weights(path):
    w = load_file(str(path / "model.safetensors"))
    return (
        w["layers.0.self_attn.q_proj.weight"].astype(np.float64).reshape(H, D, N),
        w["layers.0.self_attn.k_proj.weight"].astype(np.float64).reshape(H_KV, D, N),
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_the_modules_logits_are_the_layouts_rotation(family, tmp_path, monkeypatch):
    model = _build(family, tmp_path)
    layout = _layout(family, tmp_path)
    assert layout.axes == ((0, 1, 2, 0) if family == "qwen3_vl_text" else (0, 1, 1, 2))
    rng = np.random.default_rng(3)
    positions = np.concatenate([rng.integers(0, 12, (9, 3)), [[5, 5, 5], [0, 0, 0], [2, 7, 1]]])
    q, k, q_rot, k_rot = _rotated(family, model, positions, monkeypatch)
    w_q, w_k = _weights(tmp_path)
    for h in range(H):
        g = h * H_KV // H
        for a, b in np.ndindex(len(positions), len(positions)):
            m = rotation(layout, D, positions[a] - positions[b])
            logits = q_rot[:, h, a] @ k_rot[:, g, b].T  # (N + 1) x (N + 1): every pair of inputs
            np.testing.assert_allclose(logits, q[:, h, a] @ m @ k[:, g, b].T, rtol=REL, atol=REL * np.abs(logits).max())
            if family != "qwen3_vl_text":  # linear queries and keys: x W_Q^T M W_K x^T with the checkpoint's weights
                linear = (q_rot[:N, h, a] - q_rot[N, h, a]) @ (k_rot[:N, g, b] - k_rot[N, g, b]).T
                np.testing.assert_allclose(linear, w_q[h].T @ m @ w_k[g], rtol=REL, atol=REL * np.abs(linear).max())


@pytest.mark.parametrize("family", ("qwen2_vl_text", "qwen2_5_vl_text"))
def test_every_derived_offset_stays_below_the_reported_row(family, tmp_path, monkeypatch):
    model = _build(family, tmp_path)
    layout = _layout(family, tmp_path)
    offsets = layout.offsets
    assert len(offsets) == (2 * P - 1) ** 3  # a text tower: every offset vector of the context
    positions = np.array(sorted({tuple(np.maximum(s * d, 0)) for d in offsets for s in (1, -1)}))
    index = {tuple(p): i for i, p in enumerate(positions)}
    _, _, q_rot, k_rot = _rotated(family, model, positions, monkeypatch)
    q_rot, k_rot = q_rot[:N] - q_rot[N], k_rot[:N] - k_rot[N]  # the linear part (biases removed)
    a = specbound.analyze(tmp_path, threads=1)
    assert a.model["rotary"]["mrope"] == {"kind": "sections", "axes": [0, 1, 1, 2], "grid": None}
    assert "M-RoPE (sections): rotary pairs 1 on time, 2 on height, 1 on width" in format_summary(a)
    assert any(x["name"] == "mrope_positions" and "at most 3 in absolute value" in x["effect"] for x in a.assumptions)
    rows = a.matrices[a.matrices["role"] == "QK"]
    sv = a.singular_values
    slack = 1 + REL
    for h, (i, row) in enumerate(rows.iterrows()):
        assert row["sv_method"] == "rotary_exact_over_offsets"
        envelope = np.sort(sv[sv["matrix"] == i]["sigma"].to_numpy())[::-1][: int(row["rank"])]
        best, best_text = 0.0, 0.0
        for d in offsets:  # query at max(d, 0), key at max(-d, 0): offset d
            x = q_rot[:, h, index[tuple(np.maximum(d, 0))]] @ k_rot[:, h * H_KV // H, index[tuple(np.maximum(-d, 0))]].T
            top = check_offset_matrix(x, row, envelope, slack)
            best = max(best, top)
            if d[0] == d[1] == d[2]:
                best_text = max(best_text, top)
        assert row["spectral_norm"] == pytest.approx(best, rel=REL)  # the exact maximum over the derived offsets
        assert best > best_text * (1 + 1e-3)  # image offsets reach further than the text ones here


def _saved_as_1d(family, model, path):
    """The same weights saved as Qwen2 / Qwen3 (1D rotary, the same base and context)."""
    one_d = "Qwen3" if family == "qwen3_vl_text" else "Qwen2"
    config = getattr(transformers, f"{one_d}Config")(
        hidden_size=N,
        num_hidden_layers=1,
        num_attention_heads=H,
        num_key_value_heads=H_KV,
        head_dim=D,
        intermediate_size=24,
        vocab_size=32,
        max_position_embeddings=P,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0},
        bos_token_id=None,
        eos_token_id=None,
    )
    other = getattr(transformers, f"{one_d}Model")(config)
    other.load_state_dict(model.float().state_dict())
    other.save_pretrained(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_same_weights_read_as_the_1d_family(family, tmp_path):
    model = _build(family, tmp_path / "mrope")
    _saved_as_1d(family, model, tmp_path / "flat")
    mrope, flat = specbound.analyze(tmp_path / "mrope", threads=1), specbound.analyze(tmp_path / "flat", threads=1)
    assert mrope.model["family"] == READ_BY.get(family, family)
    assert flat.model["family"] == ("qwen3" if family == "qwen3_vl_text" else "llama")
    a, b = mrope.matrices, flat.matrices
    assert list(a["role"]) == list(b["role"])
    numeric = [
        c
        for c in ("spectral_norm", "frobenius_norm", "nuclear_norm", "stable_rank", "norm_2_1", "norm_1_1", "rank")
        if c in a
    ]
    other = a["role"] != "QK"
    np.testing.assert_array_equal(a.loc[other, numeric].to_numpy(float), b.loc[other, numeric].to_numpy(float))
    qk = a["role"] == "QK"
    if family == "qwen3_vl_text":  # QK-norm rows hold at every offset as they stand
        np.testing.assert_array_equal(a.loc[qk, numeric].to_numpy(float), b.loc[qk, numeric].to_numpy(float))
    else:
        assert (b.loc[qk, "sv_method"] == "rotary_exact_over_offsets").all()
        assert (a.loc[qk, "spectral_norm"].to_numpy() >= b.loc[qk, "spectral_norm"].to_numpy() * (1 - 1e-12)).all()
        assert (a.loc[qk, "spectral_norm"].to_numpy() > b.loc[qk, "spectral_norm"].to_numpy() * (1 + 1e-3)).any()


def test_older_configs_and_bad_sections(tmp_path):
    """transformers-4 configs say ``rope_scaling: {"type": "mrope", "mrope_section": [...]}``: the same layout;
    a section that does not cover the frequencies is one line naming it."""
    _build("qwen2_vl_text", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    layout = _layout("qwen2_vl_text", tmp_path)
    older = {k: v for k, v in config.items() if k != "rope_parameters"}
    older.update(rope_theta=100.0, rope_scaling={"type": "mrope", "mrope_section": SECTION})
    assert rotary_layout(builtin_specs()["qwen2_vl_text"], older, D, where="older") == layout
    config["rope_parameters"]["mrope_section"] = [1, 1, 1]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecboundError, match=r"mrope_section \[1, 1, 1\] adds up to 3, not to the 4"):
        specbound.analyze(tmp_path, threads=1)


def test_a_config_without_sections_gets_transformers_default(tmp_path, monkeypatch):
    """No ``mrope_section``: transformers' Qwen3-VL uses [24, 20, 20] (interleaved over 4 frequencies here:
    height at 1, width at 2); the module's logits follow the layout read with the spec's default."""
    model = _build("qwen3_vl_text", tmp_path, rope={"rope_type": "default", "rope_theta": 100.0})
    assert model.rotary_emb.mrope_section == [24, 20, 20]
    layout = _layout("qwen3_vl_text", tmp_path)
    assert layout.axes == (0, 1, 2, 0)
    positions = np.array([[0, 3, 1], [2, 0, 5], [4, 4, 4]])
    q, k, q_rot, k_rot = _rotated("qwen3_vl_text", model, positions, monkeypatch)
    for a, b in np.ndindex(3, 3):
        logits = q_rot[:, 0, a] @ k_rot[:, 0, b].T
        m = rotation(layout, D, positions[a] - positions[b])
        np.testing.assert_allclose(logits, q[:, 0, a] @ m @ k[:, 0, b].T, rtol=REL, atol=REL * np.abs(logits).max())


def test_a_spec_with_a_bad_mrope_is_one_line():
    doc = json.loads((Path(specbound.__file__).parent / "archs" / "data" / "qwen2_vl_text.json").read_text())
    for bad in (
        {"kind": "diagonal", "default_section": [1, 2, 1]},
        {"kind": "sections"},
        {"kind": "sections", "default_section": [1, -2]},
        [16, 24, 24],
    ):
        doc["rotary"]["mrope"] = bad
        with pytest.raises(SpecboundError, match="'rotary' mrope must be an object") as info:
            parse_spec(doc, "qwen2_vl_text.json")
        assert "\n" not in str(info.value)
