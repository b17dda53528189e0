"""Layers of several kinds (Gemma 3: five local layers, rope base 10000, to one global layer, base
1e6 with the checkpoint's rope scaling): each layer gets the layout its own ``rotary_emb`` branch
uses, from transformers 5's per-layer-type ``rope_parameters`` and from the older flat config
(``rope_local_base_freq``, ``sliding_window_pattern``, ``rope_scaling``) alike, and every QK quantity
of a layer holds for every pair of positions under that layer's cos and sin."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specbound  # noqa: E402
from specbound.archs import builtin_specs  # noqa: E402
from specbound.archs.rotary import rotary_layouts  # noqa: E402

N, L, H, KV, D, P = 32, 6, 4, 2, 16, 20
GLOBAL = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
LOCAL = {"rope_type": "default", "rope_theta": 1e4}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    config = transformers.Gemma3TextConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV, head_dim=D,
        intermediate_size=48, vocab_size=50, max_position_embeddings=P,
        rope_parameters={"full_attention": dict(GLOBAL), "sliding_attention": dict(LOCAL)})
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
    old.update(rope_theta=GLOBAL["rope_theta"], rope_local_base_freq=LOCAL["rope_theta"], sliding_window_pattern=6,
               rope_scaling={"rope_type": "linear", "factor": GLOBAL["factor"]})
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


def test_every_layers_qk_quantities_hold_under_its_own_rotation(gemma3):
    folder, model = gemma3
    a = specbound.analyze(folder, threads=1)
    assert [r["base"] for r in a.model["rotary"]["by_layer"]] == [1e4] * 5 + [1e6]
    qk = a.matrices[a.matrices["role"] == "QK"]
    rope = model.model.rotary_emb
    eye = np.eye(D)
    half = np.concatenate([-eye[:, D // 2:], eye[:, :D // 2]], axis=1)
    for layer in (0, 5):
        kind = model.config.layer_types[layer]
        with torch.no_grad():
            cos, sin = rope(torch.zeros(1, P, N), torch.arange(P)[None], kind)
        cos, sin = cos[0].double().numpy(), sin[0].double().numpy()
        c = eye[None] * cos[:, None, :] + half[None] * sin[:, None, :]
        pair = np.einsum("tij,skj->tsik", c, c)
        attn = model.model.layers[layer].self_attn
        gq = (1.0 + attn.q_norm.weight.detach().float()).double().numpy()  # (1 + w), as test_families checks
        gk = (1.0 + attn.k_norm.weight.detach().float()).double().numpy()
        q = attn.q_proj.weight.detach().numpy().reshape(H, D, N) * gq[None, :, None]
        k = attn.k_proj.weight.detach().numpy().reshape(KV, D, N) * gk[None, :, None]
        rows = qk[qk["layer"] == layer]
        for h, (_, row) in enumerate(rows.iterrows()):
            mats = np.einsum("ia,tsij,jb->tsab", q[h], pair, k[h // (H // KV)]).reshape(-1, N, N)
            s = np.linalg.svd(mats, compute_uv=False)
            assert np.sqrt(np.sum(s ** 2, axis=1)).max() <= row["frobenius_norm"] * (1 + 1e-5)
            assert np.abs(mats).sum(axis=(1, 2)).max() <= row["norm_1_1"] * (1 + 1e-5)
            assert s[:, 0].max() <= row["spectral_norm"] * (1 + 1e-5)  # the max over offsets (float32 rope)
