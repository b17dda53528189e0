"""Encoder-decoders (T5, mT5, Flan-T5, BART, mBART, Marian, Whisper): every matrix of both stacks,
every cross-attention head included, equal to a reference built by calling the model's own modules;
the counts complete (``H (L_e + 2 L_d)`` QK matrices); the propagation factors of docs/theory.md 3i
recomputed from the reported norms by an independent oracle; cross-attention's two Lipschitz
constants checked on a real module."""

import json
import math

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import shutil
from importlib.resources import files

import specbound  # noqa: E402
from specbound.archs.spec import parse_spec
from specbound.cli import main
from specbound.compute.propagation import ACTIVATIONS
from specbound.errors import SpecboundError

N, H, D_FF = 32, 4, 48
L_E, L_D = 2, 3  # unequal, so that a stack read with the other's depth fails


def _proj(module, n_in):
    with torch.no_grad():
        eye = torch.eye(n_in, dtype=torch.float64)
        out = module(eye) - module(torch.zeros(1, n_in, dtype=torch.float64))
    return out.numpy()


def _attention(mod, names):
    return {r: _proj(getattr(mod, n), N) for r, n in zip("qkvo", names)}


def _t5(gated, cls="T5ForConditionalGeneration", cfg="T5Config", **extra):
    def build():
        config = getattr(transformers, cfg)(
            d_model=N,
            d_kv=8,
            num_layers=L_E,
            num_decoder_layers=L_D,
            num_heads=H,
            d_ff=D_FF,
            vocab_size=50,
            feed_forward_proj="gated-gelu" if gated else "relu",
            **extra,
        )
        return getattr(transformers, cls)(config)

    def ff(block):
        d = block.DenseReluDense
        if gated:
            return {"FF_gate": _proj(d.wi_0, N), "FF_up": _proj(d.wi_1, N), "FF_out": _proj(d.wo, D_FF)}
        return {"FF_in": _proj(d.wi, N), "FF_out": _proj(d.wo, D_FF)}

    def refs(m):
        enc = [{**_attention(b.layer[0].SelfAttention, "qkvo"), **ff(b.layer[1])} for b in m.encoder.block]
        dec = [
            {
                **_attention(b.layer[0].SelfAttention, "qkvo"),
                **ff(b.layer[2]),
                "cross": _attention(b.layer[1].EncDecAttention, "qkvo"),
            }
            for b in m.decoder.block
        ]
        return enc, dec

    return build, refs


def _bart(cls, cfg, base="model", d_ff_dec=40, **extra):
    def build():
        return getattr(transformers, cls)(
            getattr(transformers, cfg)(
                d_model=N,
                encoder_layers=L_E,
                decoder_layers=L_D,
                encoder_attention_heads=H,
                decoder_attention_heads=H,
                encoder_ffn_dim=D_FF,
                decoder_ffn_dim=d_ff_dec,
                **extra,
            )
        )

    names = ("q_proj", "k_proj", "v_proj", "out_proj")

    def refs(m):
        core = getattr(m, base)
        enc = [
            {**_attention(b.self_attn, names), "FF_in": _proj(b.fc1, N), "FF_out": _proj(b.fc2, D_FF)}
            for b in core.encoder.layers
        ]
        dec = [
            {
                **_attention(b.self_attn, names),
                "FF_in": _proj(b.fc1, N),
                "FF_out": _proj(b.fc2, d_ff_dec),
                "cross": _attention(b.encoder_attn, names),
            }
            for b in core.decoder.layers
        ]
        return enc, dec

    return build, refs


_SEQ = dict(
    vocab_size=60, max_position_embeddings=16, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2
)
FAMILIES = {
    "t5": ("t5", *_t5(gated=False)),
    "flan_t5": ("t5", *_t5(gated=True)),
    "mt5": ("t5", *_t5(gated=True, cls="MT5ForConditionalGeneration", cfg="MT5Config")),
    "bart": ("bart", *_bart("BartForConditionalGeneration", "BartConfig", **_SEQ)),
    "mbart": ("bart", *_bart("MBartForConditionalGeneration", "MBartConfig", **_SEQ)),
    "marian": ("bart", *_bart("MarianMTModel", "MarianConfig", **_SEQ)),
    "whisper": (
        "whisper",
        *_bart(
            "WhisperForConditionalGeneration",
            "WhisperConfig",
            vocab_size=60,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            num_mel_bins=8,
            max_source_positions=8,
            max_target_positions=8,
        ),
    ),
}


def reference_rows(enc, dec):
    """``[(stack, layer, role, matrix)]`` in the analysis' order: encoder layers, then decoder layers
    numbered on; per layer QK heads, OV heads, cross QK and OV heads, feed-forward."""
    d = N // H

    def cols(m, h):
        return m[:, h * d : (h + 1) * d]

    def heads(w):
        return [("QK", cols(w["q"], h) @ cols(w["k"], h).T) for h in range(H)] + [
            ("OV", cols(w["v"], h) @ w["o"][h * d : (h + 1) * d]) for h in range(H)
        ]

    rows = []
    for stack, layers, first in (("encoder", enc, 0), ("decoder", dec, len(enc))):
        for i, w in enumerate(layers):
            items = heads(w)
            if "cross" in w:
                items += [(r + "_cross", m) for r, m in heads(w["cross"])]
            items += [(r, w[r]) for r in ("FF_in", "FF_gate", "FF_up", "FF_out") if r in w]
            rows += [(stack, first + i, role, m) for role, m in items]
    return rows


def save_family(name, folder):
    """``(name, family, folder, reference rows)`` of FAMILIES[name], built with random weights and saved."""
    family, build, refs = FAMILIES[name]
    torch.manual_seed(0)
    model = build().eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(folder)
    return name, family, folder, reference_rows(*refs(model.double()))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved(request, tmp_path_factory):
    return save_family(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def analysed(saved):
    return specbound.analyze(saved[2], threads=1)


def test_every_matrix_matches_the_module(saved, analysed):
    name, family, _, ref = saved
    m = analysed.matrices
    assert analysed.model["family"] == family
    assert list(zip(m["stack"], m["layer"], m["role"])) == [(s, l, r) for s, l, r, _ in ref]
    for (_, _, role, w), (_, row) in zip(ref, m.iterrows()):
        s = np.linalg.svd(w, compute_uv=False)
        assert row["spectral_norm"] == pytest.approx(s[0], rel=1e-9), (name, role)
        assert row["frobenius_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-9), (name, role)
        assert row["nuclear_norm"] == pytest.approx(s[s > 1e-10 * len(s) * max(s[0], 1)].sum(), rel=1e-9)
        assert row["norm_2_1"] == pytest.approx(np.linalg.norm(w, axis=0).sum(), rel=1e-9), (name, role)
        assert row["norm_1_1"] == pytest.approx(np.abs(w).sum(), rel=1e-9), (name, role)
    qk = m["role"].isin(["QK", "QK_cross"]).sum()
    assert qk == H * (L_E + 2 * L_D)
    assert analysed.model["L"] == L_E + L_D
    assert [(s["stack"], s["first_layer"], s["L"], s["cross_attention"]) for s in analysed.model["stacks"]] == [
        ("encoder", 0, L_E, False),
        ("decoder", L_E, L_D, True),
    ]
    names = {a["name"] for a in analysed.assumptions if a["applies"]}
    assert "encoder_decoder_chain" in names
    assert ("front_end_as_embedding" in names) == (family == "whisper")
    assert ("relative_position_bias" in names) == (family == "t5")
    cross = m[m["role"] == "QK_cross"]["tensors"].iloc[0]
    assert ("EncDecAttention" if family == "t5" else "encoder_attn") in cross


def _oracle(m, l_phi):
    """docs/theory.md 3i from the reported spectral norms, written out loop by loop."""
    c = lambda layer, role: m[(m["layer"] == layer) & (m["role"] == role)]["spectral_norm"].to_numpy()  # noqa: E731
    gated = (m["role"] == "FF_gate").any()

    def ff(layer, lp, cp):
        if gated:
            return (lp + cp) * c(layer, "FF_gate")[0] * c(layer, "FF_up")[0] * c(layer, "FF_out")[0]
        return lp * c(layer, "FF_in")[0] * c(layer, "FF_out")[0]

    lam, mem, gamma = {}, {}, {}
    for layer in range(L_E + L_D):
        self_att = sum(ov * (1 + 4 * qk) for ov, qk in zip(c(layer, "OV"), c(layer, "QK")))
        f1 = ff(layer, 1.0, 1.0)
        if layer < L_E:
            lam[layer] = self_att * ff(layer, l_phi, 1.0)
            gamma[(layer, "QK")], gamma[(layer, "OV")] = 2 * c(layer, "OV") * f1, np.full(H, f1)
        else:
            query = sum(2 * ov * qk for ov, qk in zip(c(layer, "OV_cross"), c(layer, "QK_cross")))
            memory = sum(ov * (1 + 2 * qk) for ov, qk in zip(c(layer, "OV_cross"), c(layer, "QK_cross")))
            lam[layer] = self_att * query * ff(layer, l_phi, 1.0)
            mem[layer] = memory * ff(layer, l_phi, 1.0)
            gamma[(layer, "QK")], gamma[(layer, "OV")] = 2 * c(layer, "OV") * query * f1, np.full(H, query * f1)
            gamma[(layer, "QK_cross")], gamma[(layer, "OV_cross")] = 2 * c(layer, "OV_cross") * f1, np.full(H, f1)
    alpha = {}
    for layer in range(L_E, L_E + L_D):
        alpha[layer] = math.prod(lam[k] for k in range(layer + 1, L_E + L_D))
    z = sum(alpha[j] * mem[j] for j in range(L_E, L_E + L_D))
    for layer in range(L_E):
        alpha[layer] = math.prod(lam[k] for k in range(layer + 1, L_E)) * z
    k_total = math.prod(lam[k] for k in range(L_E)) * z + math.prod(lam[k] for k in range(L_E, L_E + L_D))
    return lam, mem, alpha, gamma, k_total


def test_propagation_factors_match_the_oracle(analysed):
    m, layers = analysed.matrices, analysed.layers
    lam, mem, alpha, gamma, k_total = _oracle(m, analysed.options["l_phi"])
    for layer in range(L_E + L_D):
        row = layers[layers["layer"] == layer].iloc[0]
        assert row["lambda"] == pytest.approx(lam[layer], rel=1e-12)
        assert row["downstream_factor"] == pytest.approx(alpha[layer], rel=1e-12)
        assert row["stack"] == ("encoder" if layer < L_E else "decoder")
        if layer >= L_E:
            assert row["memory_lipschitz"] == pytest.approx(mem[layer], rel=1e-12)
        else:
            assert pd.isna(row["memory_lipschitz"])
        for role in ("QK", "OV", "QK_cross", "OV_cross"):
            if (layer, role) in gamma:
                got = m[(m["layer"] == layer) & (m["role"] == role)]["gamma"].to_numpy()
                np.testing.assert_allclose(got, gamma[(layer, role)], rtol=1e-12)
        assert (m[m["layer"] == layer]["downstream_factor"] == row["downstream_factor"]).all()
    # the chain baselines multiply along the two stacks: the spectral product is K itself
    assert analysed.baselines["spectral_product"] == pytest.approx(k_total, rel=1e-10)
    assert math.isfinite(analysed.bounds["spectral_adaptive"]) and analysed.bounds["spectral_adaptive"] > math.sqrt(
        L_E + L_D
    )


def test_outputs_round_trip(analysed, tmp_path):
    doc = json.loads(analysed.to_json())
    assert doc["model"]["stacks"][1]["stack"] == "decoder"
    assert {r["stack"] for r in doc["matrices"]} == {"encoder", "decoder"}
    analysed.save(tmp_path)
    back = specbound.Analysis.load(tmp_path)
    pd.testing.assert_frame_equal(back.matrices, analysed.matrices, check_dtype=False)
    assert "decoder" in str(analysed)


def test_layers_in_parallel_and_from_init(saved, analysed):
    folder = saved[2]
    many = specbound.analyze(folder, threads=1, jobs=3)
    pd.testing.assert_frame_equal(many.matrices, analysed.matrices, check_exact=True)
    same = specbound.analyze(folder, threads=1, init=folder)
    assert (same.matrices["delta_spectral_norm"] == 0).all()
    assert same.matrices["role"].tolist() == analysed.matrices["role"].tolist()


def test_cross_attention_lipschitz_constants_on_the_module():
    """BART's encoder_attn, biases zeroed, on unit rows: moving the queries (the decoder's stream) by
    eps moves the output by at most 2 sum_h c(OV) c(QK) eps; moving the keys and values (the encoder's
    output) by at most sum_h c(OV) (1 + 2 c(QK)) eps (the 1/sqrt(d_h) scaling only shrinks these)."""
    torch.manual_seed(4)
    model = (
        transformers.BartModel(
            transformers.BartConfig(
                d_model=N,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=H,
                decoder_attention_heads=H,
                encoder_ffn_dim=D_FF,
                decoder_ffn_dim=D_FF,
                vocab_size=50,
                max_position_embeddings=16,
            )
        )
        .double()
        .eval()
    )
    att = model.decoder.layers[0].encoder_attn
    for name, p in att.named_parameters():
        torch.nn.init.normal_(p, std=0.0 if name.endswith("bias") else 0.4)
    w = _attention(att, ("q_proj", "k_proj", "v_proj", "out_proj"))
    d = N // H
    qk = [np.linalg.norm(w["q"][:, h * d : (h + 1) * d] @ w["k"][:, h * d : (h + 1) * d].T, 2) for h in range(H)]
    ov = [np.linalg.norm(w["v"][:, h * d : (h + 1) * d] @ w["o"][h * d : (h + 1) * d], 2) for h in range(H)]
    by_query = sum(2 * o * q for o, q in zip(ov, qk))
    by_memory = sum(o * (1 + 2 * q) for o, q in zip(ov, qk))
    rng = np.random.default_rng(0)
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731

    def out(y, z):
        with torch.no_grad():
            return att(torch.tensor(y[None]), key_value_states=torch.tensor(z[None]))[0][0].numpy()

    for _ in range(20):
        y, z = unit(rng.standard_normal((5, N))), unit(rng.standard_normal((7, N)))
        eps = 10.0 ** rng.uniform(-4, -1)
        dy = eps * unit(rng.standard_normal((5, N)))
        dz = eps * unit(rng.standard_normal((7, N)))
        assert np.linalg.norm(out(y + dy, z) - out(y, z), axis=1).max() <= by_query * eps * (1 + 1e-9)
        assert np.linalg.norm(out(y, z + dz) - out(y, z), axis=1).max() <= by_memory * eps * (1 + 1e-9)


def test_encoder_only_export_is_read_as_its_encoder(tmp_path):
    """T5EncoderModel (the text encoder of diffusion models) holds no decoder tensor: its encoder is
    analysed as one chain, matching the module."""
    torch.manual_seed(2)
    model = transformers.T5EncoderModel(
        transformers.T5Config(
            d_model=N,
            d_kv=8,
            num_layers=L_E,
            num_decoder_layers=L_D,
            num_heads=H,
            d_ff=D_FF,
            vocab_size=50,
            feed_forward_proj="gated-gelu",
        )
    )
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(tmp_path)
    result = specbound.analyze(tmp_path, threads=1)
    assert result.model["L"] == L_E and set(result.matrices["stack"]) == {"encoder"}
    assert "encoder layers 0-1" in str(result)
    assert "QK_cross" not in set(result.matrices["role"])
    enc, _ = _t5(gated=True)[1](
        type("M", (), {"encoder": model.double().encoder, "decoder": type("D", (), {"block": []})})()
    )
    ref = reference_rows(enc, [])
    for (_, _, role, w), s in zip(ref, result.matrices["spectral_norm"]):
        assert s == pytest.approx(np.linalg.norm(w, 2), rel=1e-9), role
    lambdas = result.layers["lambda"].to_numpy()
    assert result.layers["downstream_factor"].tolist() == pytest.approx([lambdas[1], 1.0], rel=1e-12)


def test_a_stack_of_the_wrong_depth_is_one_line(tmp_path, capsys):
    folder, deeper = save_family("bart", tmp_path / "bart")[2], tmp_path / "deeper"
    capsys.readouterr()
    deeper.mkdir()
    shutil.copy(folder / "model.safetensors", deeper / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps({**config, "decoder_layers": L_D + 1}))
    assert main(["analyze", str(deeper)]) == 2
    err = capsys.readouterr().err.strip()
    assert "decoder.layers.3" in err and len(err.splitlines()) == 1


def test_older_t5_configs_name_the_activation_by_feed_forward_proj(tmp_path):
    """T5 v1.1 configs saved before dense_act_fn and is_gated_act existed say only feed_forward_proj =
    gated-gelu, HF's gelu_new: the same gated block, the same L_phi and the same numbers."""

    folder = save_family("flan_t5", tmp_path / "flan_t5")[2]
    current = specbound.analyze(folder, threads=1)
    older_dir = tmp_path / "older"
    older_dir.mkdir()
    shutil.copy(folder / "model.safetensors", older_dir / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    assert config.pop("dense_act_fn") == "gelu_new" and config["feed_forward_proj"] == "gated-gelu"
    assert config.pop("is_gated_act") is True
    (older_dir / "config.json").write_text(json.dumps(config))
    older = specbound.analyze(older_dir, threads=1)
    assert older.model["activation"] == "gelu_new"
    assert older.all_bounds() == current.all_bounds()


@pytest.mark.parametrize(
    "proj, l_phi", [("gated-gelu_pytorch_tanh", 1.13), ("gated-quick_gelu", 1.0999), ("gelu", 1.13)]
)
def test_any_gated_activation_t5_accepts_is_a_gated_block(tmp_path, proj, l_phi):
    """T5Config takes any ``gated-<activation>`` (is_gated_act, dense_act_fn): wi_0 the gate, wi_1 the up
    projection, whatever the activation, each matrix the module's; a plain ``<activation>`` is one wi."""
    torch.manual_seed(2)
    model = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            d_model=N,
            d_kv=8,
            num_layers=1,
            num_decoder_layers=1,
            num_heads=H,
            d_ff=D_FF,
            vocab_size=50,
            feed_forward_proj=proj,
        )
    ).eval()
    model.save_pretrained(tmp_path)
    m = specbound.analyze(tmp_path, threads=1)
    assert m.options["l_phi"] == l_phi
    for layer, block in ((0, model.encoder.block[0].layer[1]), (1, model.decoder.block[0].layer[2])):
        d = block.DenseReluDense.double()
        names = {"FF_gate": (d.wi_0, N), "FF_up": (d.wi_1, N)} if proj.startswith("gated") else {"FF_in": (d.wi, N)}
        for role, (module, n_in) in {**names, "FF_out": (d.wo, D_FF)}.items():
            row = m.matrices[(m.matrices["layer"] == layer) & (m.matrices["role"] == role)].iloc[0]
            assert row["spectral_norm"] == pytest.approx(np.linalg.norm(_proj(module, n_in), 2), rel=1e-9), (
                layer,
                role,
            )


def test_configs_written_before_is_gated_act_take_any_gated_activation(tmp_path):
    """A config.json saved before T5Config wrote is_gated_act and dense_act_fn names the block only by
    feed_forward_proj: every gated-<activation> whose constant specbound knows is the gated block with
    that activation (gated-gelu: gelu_new, as T5Config maps it); t5.json lists each one."""

    doc = json.loads((files("specbound.archs") / "data" / "t5.json").read_text())
    listed = next(
        c["feed_forward_proj"]
        for v in doc["variants"]
        if isinstance(v["when"], list)
        for c in v["when"]
        if "feed_forward_proj" in c
    )
    assert {f"gated-{a}" for a in ACTIVATIONS} == set(listed) == set(doc["activation_names"])
    torch.manual_seed(3)
    model = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            d_model=N,
            d_kv=8,
            num_layers=1,
            num_decoder_layers=1,
            num_heads=H,
            d_ff=D_FF,
            vocab_size=50,
            feed_forward_proj="gated-gelu_pytorch_tanh",
        )
    ).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["is_gated_act"], config["dense_act_fn"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    m = specbound.analyze(tmp_path, threads=1)
    assert m.options["l_phi"] == ACTIVATIONS["gelu_pytorch_tanh"][0]
    d = model.encoder.block[0].layer[1].DenseReluDense.double()
    for role, module in (("FF_gate", d.wi_0), ("FF_up", d.wi_1)):
        row = m.matrices[(m.matrices["layer"] == 0) & (m.matrices["role"] == role)].iloc[0]
        assert row["spectral_norm"] == pytest.approx(np.linalg.norm(_proj(module, N), 2), rel=1e-9), role


def test_a_variant_s_when_may_list_conditions():
    """``when`` as a list: any one condition selects the variant (T5's is_gated_act, or feed_forward_proj
    for configs without it); an entry that is not a non-empty object is a one-line error."""

    doc = json.loads((files("specbound.archs") / "data" / "t5.json").read_text())
    spec = parse_spec(doc, "t5.json")
    gated = lambda config: spec.for_config(config).feed_forward  # noqa: E731
    assert gated({"is_gated_act": True, "feed_forward_proj": "gated-mish"}) == "gated"
    assert gated({"feed_forward_proj": "gated-gelu"}) == "gated"
    assert gated({"is_gated_act": False, "feed_forward_proj": "relu"}) == "plain"
    doc["variants"][0]["when"] = [{"is_gated_act": True}, "gated"]
    with pytest.raises(SpecboundError, match="any one selects the variant") as err:
        parse_spec(doc, "t5.json")
    assert "\n" not in str(err.value)
