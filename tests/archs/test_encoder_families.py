"""What the encoder families bring beyond a BERT chain, each held against the module or the config it
comes from: ModernBERT's fused GeGLU and its per-layer-type rotary bases (in both config formats),
DINOv2's LayerScale folded into the matrices, and the structures said in ``assumptions``."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import shutil

import specbound  # noqa: E402
from specbound.cli import main
from specbound.pipeline import open_model, read_layer  # noqa: E402

N, H, D_FF = 32, 4, 48


def _save(model, folder):
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(folder)
    return model.double().eval()


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("modernbert")
    model = _save(
        transformers.ModernBertModel(
            transformers.ModernBertConfig(
                hidden_size=N,
                num_hidden_layers=4,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=60,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                cls_token_id=1,
                sep_token_id=2,
            )
        ),
        folder,
    )
    return folder, model


def test_modernbert_geglu_gate_is_the_activated_half(modernbert):
    """The module computes Wo(gelu(x Wi)[:d_ff] * (x Wi)[d_ff:]): specbound's FF_gate is the half the
    activation acts on, FF_up the other, FF_out Wo."""
    folder, model = modernbert
    opened = open_model(folder)
    weights = read_layer(opened, 1)
    mlp = model.layers[1].mlp
    x = torch.randn(5, N, dtype=torch.float64)
    with torch.no_grad():
        out = mlp(x).numpy()
    xn = x.numpy()
    act = mlp.act
    with torch.no_grad():
        gated = act(torch.tensor(xn @ weights.ff["FF_gate"])).numpy()
    mine = (gated * (xn @ weights.ff["FF_up"])) @ weights.ff["FF_out"]
    np.testing.assert_allclose(out, mine, rtol=0, atol=1e-9)
    opened.ckpt.close()


def test_modernbert_layer_types_each_rotate_with_their_base(modernbert):
    folder, model = modernbert
    result = specbound.analyze(folder, threads=1)
    config = model.config
    expected = [config.rope_parameters[t]["rope_theta"] for t in config.layer_types]
    assert [r["base"] for r in result.model["rotary"]["by_layer"]] == expected and len(set(expected)) == 2
    assert "sliding_window_attention" in {a["name"] for a in result.assumptions if a["applies"]}


def test_modernbert_config_before_transformers_5_reads_the_same(modernbert, tmp_path):
    """Released ModernBERT configs (transformers 4.x) state global_rope_theta, local_rope_theta and
    global_attn_every_n_layers instead of layer_types and per-type rope_parameters."""

    folder, model = modernbert
    shutil.copy(folder / "model.safetensors", tmp_path / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    params = config.pop("rope_parameters")
    types = config.pop("layer_types")
    every = types[1:].index("full_attention") + 1
    config.update(
        global_rope_theta=params["full_attention"]["rope_theta"],
        local_rope_theta=params["sliding_attention"]["rope_theta"],
        global_attn_every_n_layers=every,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    new, old = specbound.analyze(folder, threads=1), specbound.analyze(tmp_path, threads=1)
    assert old.model["rotary"] == new.model["rotary"]
    assert old.all_bounds() == new.all_bounds()


def test_dinov2_bounds_see_the_scaled_matrices(tmp_path):
    """LayerScale folded: with lambda = t * ones the OV and FF_out matrices are t times the unscaled
    ones, exactly; lambda = 1 gives the unscaled numbers."""
    torch.manual_seed(1)
    model = transformers.Dinov2Model(
        transformers.Dinov2Config(
            hidden_size=N, num_hidden_layers=2, num_attention_heads=H, mlp_ratio=2, image_size=8, patch_size=4
        )
    )
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    results = {}
    for t in (1.0, 0.25):
        for layer in model.encoder.layer:
            torch.nn.init.constant_(layer.layer_scale1.lambda1, t)
            torch.nn.init.constant_(layer.layer_scale2.lambda1, t)
        model.save_pretrained(tmp_path / str(t))
        results[t] = specbound.analyze(tmp_path / str(t), threads=1).matrices
    one, quarter = results[1.0], results[0.25]
    scaled = one["role"].isin(["OV", "FF_out"])
    np.testing.assert_allclose(quarter["spectral_norm"][scaled], 0.25 * one["spectral_norm"][scaled], rtol=1e-6)
    np.testing.assert_allclose(quarter["spectral_norm"][~scaled], one["spectral_norm"][~scaled], rtol=0)


@pytest.mark.parametrize(
    "family, build, structure",
    [
        (
            "mpnet",
            lambda: transformers.MPNetModel(
                transformers.MPNetConfig(
                    hidden_size=N, num_hidden_layers=1, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
                )
            ),
            "relative_position_bias",
        ),
        (
            "wav2vec2",
            lambda: transformers.HubertModel(
                transformers.HubertConfig(
                    hidden_size=N,
                    num_hidden_layers=1,
                    num_attention_heads=H,
                    intermediate_size=D_FF,
                    conv_dim=(8,),
                    conv_stride=(2,),
                    conv_kernel=(3,),
                    num_conv_pos_embeddings=4,
                    num_conv_pos_embedding_groups=2,
                )
            ),
            "front_end_as_embedding",
        ),
    ],
)
def test_structures_are_said(tmp_path, family, build, structure):
    torch.manual_seed(0)
    build().save_pretrained(tmp_path)
    result = specbound.analyze(tmp_path, threads=1)
    assert result.model["family"] == family
    entry = next(a for a in result.assumptions if a["name"] == structure)
    assert entry["applies"] and entry["kind"] in ("theorem", "convention", "extension")


def test_wav2vec2_adapter_is_refused_naming_it(tmp_path, capsys):
    torch.manual_seed(0)
    transformers.Wav2Vec2Model(
        transformers.Wav2Vec2Config(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            intermediate_size=D_FF,
            conv_dim=(8,),
            conv_stride=(2,),
            conv_kernel=(3,),
            num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2,
            add_adapter=True,
            output_hidden_size=N,
            num_adapter_layers=1,
        )
    ).save_pretrained(tmp_path)
    capsys.readouterr()
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "adapter" in err and len(err.splitlines()) == 1


def test_modernbert_rotary_qk_norm_is_the_max_over_every_position_pair(tmp_path):
    """Five layers with a global layer every third (3 does not divide 5), a local window and two small
    bases: each head's reported c(QK) is max over all query and key positions ``t, s <
    max_position_embeddings`` of ``||rot_t(W_Q) rot_s(W_K)^T||_2``, the rotation applied by the module's own
    ``apply_rotary_pos_emb`` with the base of the layer's type in its config.  (The module's ``cos``,
    ``sin`` are float32, so the reference recomputes them in float64 from the same base: docs/rotary.md.)"""
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    positions = 12
    torch.manual_seed(3)
    model = _save(
        transformers.ModernBertModel(
            transformers.ModernBertConfig(
                hidden_size=N,
                num_hidden_layers=5,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=60,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                cls_token_id=1,
                sep_token_id=2,
                global_attn_every_n_layers=3,
                local_attention=4,
                max_position_embeddings=positions,
                global_rope_theta=300.0,
                local_rope_theta=20.0,
            )
        ),
        tmp_path,
    )
    matrices = specbound.analyze(tmp_path, threads=1).matrices
    config, d = model.config, N // H
    assert config.layer_types == [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
    ]
    eye = torch.eye(N, dtype=torch.float64)
    for i, layer in enumerate(model.layers):
        base = config.rope_parameters[layer.attention_type]["rope_theta"]
        angles = torch.arange(positions, dtype=torch.float64)[:, None] / base ** (
            torch.arange(0, d, 2, dtype=torch.float64) / d
        )
        emb = torch.cat([angles, angles], dim=-1)[None, :, None]  # (1, positions, 1, d)
        module_cos, _ = model.rotary_emb(eye[None, :positions], torch.arange(positions)[None], layer.attention_type)
        np.testing.assert_allclose(module_cos[0].numpy(), emb.cos()[0, :, 0].numpy(), rtol=0, atol=1e-6)
        with torch.no_grad():
            q, k, _ = (layer.attn.Wqkv(eye) - layer.attn.Wqkv(0 * eye[:1])).view(N, 3, H, d).unbind(1)
            # every basis row at every position: (1, positions, N, H, d) -> rotated
            rq, rk = apply_rotary_pos_emb(
                q.expand(1, positions, N, H, d), k.expand(1, positions, N, H, d), emb.cos(), emb.sin(), unsqueeze_dim=2
            )
        reported = matrices[(matrices["layer"] == i) & (matrices["role"] == "QK")]["spectral_norm"].to_numpy()
        for h in range(H):
            logits = torch.einsum("tnd,smd->tsnm", rq[0, :, :, h], rk[0, :, :, h])  # (t, s, N, N)
            exact = torch.linalg.matrix_norm(logits, 2).max().item()
            assert reported[h] == pytest.approx(exact, rel=1e-9), (i, layer.attention_type, h)


def test_dinov2_swiglu_is_analysed_with_the_activation_its_module_applies(tmp_path):
    """DINOv2's SwiGLU block computes ``silu(x W_g) * (x W_u)`` whatever ``hidden_act`` says (GELU by
    default): the analysis names SiLU and uses its constant (1.0999), not GELU's 1.13.  The module is
    checked to apply SiLU, so a transformers that honoured hidden_act there would fail this test."""
    model = transformers.Dinov2Model(
        transformers.Dinov2Config(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            mlp_ratio=2,
            image_size=8,
            patch_size=4,
            use_swiglu_ffn=True,
        )
    )
    assert model.config.hidden_act == "gelu"
    mlp = model.encoder.layer[0].mlp
    x = torch.randn(3, N)
    with torch.no_grad():
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        torch.testing.assert_close(mlp(x), mlp.down_proj(torch.nn.functional.silu(gate) * up))
    model.save_pretrained(tmp_path)
    a = specbound.analyze(tmp_path, threads=1)
    assert a.model["activation"] == "silu" and a.options["l_phi"] == pytest.approx(1.0999)
    assert "silu" in a.options["l_phi_source"]
