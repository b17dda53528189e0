"""Layers of several kinds (Gemma 3: five local layers, rope base 10000, to one global layer, base
1e6 with the checkpoint's rope scaling): each layer gets the layout its own ``rotary_emb`` branch
uses, from transformers 5's per-layer-type ``rope_parameters`` and from the older flat config
(``rope_local_base_freq``, ``sliding_window_pattern``, ``rope_scaling``) alike; Gemma 3's QK rows, its
heads' normalised factors, hold whatever the rotation (every position pair of a rotary head without
QK-norm: ModernBERT's layers of two kinds, tests/archs/test_encoder_families.py)."""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import shutil

import specbound  # noqa: E402
from specbound.archs import builtin_specs  # noqa: E402
from specbound.archs.rotary import rotary_layouts  # noqa: E402

N, L, H, KV, D, P = 32, 6, 4, 2, 16, 20
GLOBAL = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
LOCAL = {"rope_type": "default", "rope_theta": 1e4}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    config = transformers.Gemma3TextConfig(
        hidden_size=N,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=D,
        intermediate_size=48,
        vocab_size=50,
        max_position_embeddings=P,
        rope_parameters={"full_attention": dict(GLOBAL), "sliding_attention": dict(LOCAL)},
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    folder = tmp_path_factory.mktemp("gemma3")
    transformers.logging.set_verbosity_error()
    model.save_pretrained(folder)
    return folder, model.double()


def _legacy(config):
    """The same model's config as transformers 4 wrote it (flat rope settings, no layer_types)."""
    old = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types")}
    old.update(
        rope_theta=GLOBAL["rope_theta"],
        rope_local_base_freq=LOCAL["rope_theta"],
        sliding_window_pattern=6,
        rope_scaling={"rope_type": "linear", "factor": GLOBAL["factor"]},
    )
    return old


def test_each_layer_gets_its_types_layout_in_both_config_forms(gemma3):
    folder, model = gemma3
    config = json.loads((folder / "config.json").read_text())
    spec = builtin_specs()["gemma3_text"]
    new = rotary_layouts(spec, config, D, L, where="m")
    old = rotary_layouts(spec, _legacy(config), D, L, where="m")
    assert new == old
    rope = model.model.rotary_emb
    for layer, layout in enumerate(new):
        kind = config["layer_types"][layer]
        np.testing.assert_allclose(layout.thetas, getattr(rope, f"{kind}_inv_freq").double().numpy(), rtol=2e-6)
        assert layout.scaling == (None if kind == "sliding_attention" else "linear")
    assert [lay.base for lay in new] == [1e4] * 5 + [1e6]


def test_a_qk_norm_layers_rows_are_its_factors_whatever_its_rotation(gemma3, tmp_path):
    """Gemma 3 normalises its queries and keys: each QK row is the head's stacked raw factors
    ``[W_Q^h; W_K^g]`` (docs/theory.md 3d), on which no rotation acts, so the local and the global layers'
    rows are those factors' norms, and the older flat config gives the same analysis."""
    folder, model = gemma3
    a = specbound.analyze(folder, threads=1)
    assert [r["base"] for r in a.model["rotary"]["by_layer"]] == [1e4] * 5 + [1e6]
    qk = a.matrices[a.matrices["role"] == "QK"]
    assert (qk["rows"] == N).all() and (qk["cols"] == 2 * D).all() and (qk["sv_method"] != "rotary_product_bound").all()
    for layer in (0, 5):
        attn = model.model.layers[layer].self_attn
        q = attn.q_proj.weight.detach().numpy().reshape(H, D, N)
        k = attn.k_proj.weight.detach().numpy().reshape(KV, D, N)
        for h, (_, row) in enumerate(qk[qk["layer"] == layer].iterrows()):
            z = np.concatenate([q[h], k[h // (H // KV)]]).T
            s = np.linalg.svd(z, compute_uv=False)
            assert row["spectral_norm"] == pytest.approx(s[0], rel=1e-9)
            assert row["frobenius_norm"] == pytest.approx(np.linalg.norm(z), rel=1e-9)
            assert row["norm_1_1"] == pytest.approx(np.abs(z).sum(), rel=1e-9)

    for name in ("model.safetensors",):
        shutil.copy(folder / name, tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps(_legacy(json.loads((folder / "config.json").read_text()))))
    legacy = specbound.analyze(tmp_path, threads=1)
    pd.testing.assert_frame_equal(legacy.matrices, a.matrices)
