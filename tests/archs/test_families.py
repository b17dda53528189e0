"""Every shipped family: a tiny random model saved by transformers analyses to the same matrices as
a reference built by *calling the model's own modules* on identity inputs, so a wrong slice,
orientation, fused layout or key/value grouping fails here."""

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specbound  # noqa: E402

N, L, H, D_FF = 32, 2, 4, 48


def _proj(module, n_in):
    """Row-oriented matrix of a linear-like module: module(I) - module(0), float64."""
    with torch.no_grad():
        eye = torch.eye(n_in, dtype=torch.float64)
        out = module(eye) - module(torch.zeros(1, n_in, dtype=torch.float64))
    return out.double().numpy()


def _split_concat(w):
    return np.split(w, 3, axis=1)


def _split_neox(w, heads):
    d = w.shape[1] // (3 * heads)
    v = w.reshape(w.shape[0], heads, 3 * d)  # GPTNeoXAttention: qkv.view(..., H, 3 d)
    return [v[:, :, i * d:(i + 1) * d].reshape(w.shape[0], heads * d) for i in range(3)]


def bert_like(attn_self, attn_out, ff_in, ff_out):
    def get(layer):
        a = attn_self(layer)
        return {"q": _proj(a.query, N), "k": _proj(a.key, N), "v": _proj(a.value, N),
                "o": _proj(attn_out(layer), N), "FF_in": _proj(ff_in(layer), N), "FF_out": _proj(ff_out(layer), D_FF)}
    return get


FAMILIES = {
    "bert": (lambda: transformers.BertForSequenceClassification(transformers.BertConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50)),
        lambda m: bert_like(lambda l: m.bert.encoder.layer[l].attention.self,
                            lambda l: m.bert.encoder.layer[l].attention.output.dense,
                            lambda l: m.bert.encoder.layer[l].intermediate.dense,
                            lambda l: m.bert.encoder.layer[l].output.dense)),
    "electra": (lambda: transformers.ElectraForPreTraining(transformers.ElectraConfig(
        embedding_size=16, hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF,
        vocab_size=50)),
        lambda m: bert_like(lambda l: m.electra.encoder.layer[l].attention.self,
                            lambda l: m.electra.encoder.layer[l].attention.output.dense,
                            lambda l: m.electra.encoder.layer[l].intermediate.dense,
                            lambda l: m.electra.encoder.layer[l].output.dense)),
    "vit": (lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, image_size=8,
        patch_size=4, num_labels=3)),
        # transformers 5 renames ViT's modules (layers.N.attention.q_proj, mlp.fc1) but saves the
        # classic checkpoint names (encoder.layer.N.attention.attention.query), which the spec maps.
        lambda m: (lambda l, b=m.vit.layers: {
            "q": _proj(b[l].attention.q_proj, N), "k": _proj(b[l].attention.k_proj, N),
            "v": _proj(b[l].attention.v_proj, N), "o": _proj(b[l].attention.o_proj, N),
            "FF_in": _proj(b[l].mlp.fc1, N), "FF_out": _proj(b[l].mlp.fc2, D_FF)})),
    "distilbert": (lambda: transformers.DistilBertForSequenceClassification(transformers.DistilBertConfig(
        dim=N, n_layers=L, n_heads=H, hidden_dim=D_FF, vocab_size=50)),
        lambda m: (lambda l, b=m.distilbert.transformer.layer: {
            "q": _proj(b[l].attention.q_lin, N), "k": _proj(b[l].attention.k_lin, N),
            "v": _proj(b[l].attention.v_lin, N), "o": _proj(b[l].attention.out_lin, N),
            "FF_in": _proj(b[l].ffn.lin1, N), "FF_out": _proj(b[l].ffn.lin2, D_FF)})),
    "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=N, n_layer=L, n_head=H, n_inner=None, vocab_size=50, n_positions=16)),
        lambda m: (lambda l, b=m.transformer.h: dict(zip("qkv", _split_concat(_proj(b[l].attn.c_attn, N))),
                   o=_proj(b[l].attn.c_proj, N), FF_in=_proj(b[l].mlp.c_fc, N), FF_out=_proj(b[l].mlp.c_proj, 4 * N)))),
    "gpt_neox": (lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50)),
        lambda m: (lambda l, b=m.gpt_neox.layers: dict(zip("qkv", _split_neox(_proj(b[l].attention.query_key_value, N), H)),
                   o=_proj(b[l].attention.dense, N), FF_in=_proj(b[l].mlp.dense_h_to_4h, N),
                   FF_out=_proj(b[l].mlp.dense_4h_to_h, D_FF)))),
    "opt": (lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, ffn_dim=D_FF, word_embed_proj_dim=N,
        vocab_size=50, max_position_embeddings=16)),
        lambda m: (lambda l, b=m.model.decoder.layers: {
            "q": _proj(b[l].self_attn.q_proj, N), "k": _proj(b[l].self_attn.k_proj, N),
            "v": _proj(b[l].self_attn.v_proj, N), "o": _proj(b[l].self_attn.out_proj, N),
            "FF_in": _proj(b[l].fc1, N), "FF_out": _proj(b[l].fc2, D_FF)})),
}
FAMILIES["albert"] = (
    lambda: transformers.AlbertForSequenceClassification(transformers.AlbertConfig(
        embedding_size=16, hidden_size=N, num_hidden_layers=4, num_hidden_groups=2, num_attention_heads=H,
        intermediate_size=D_FF, vocab_size=50, num_labels=2)),
    # 4 depths over 2 stored groups: depths 0, 1 use group 0 and depths 2, 3 group 1
    lambda m: (lambda l, g=m.albert.encoder.albert_layer_groups: (lambda a: {
        "q": _proj(a.attention.query, N), "k": _proj(a.attention.key, N), "v": _proj(a.attention.value, N),
        "o": _proj(a.attention.dense, N), "FF_in": _proj(a.ffn, N), "FF_out": _proj(a.ffn_output, D_FF)})(
        g[l * 2 // 4].albert_layers[0])))
for _name, _cls, _cfg in (("llama", "LlamaForCausalLM", "LlamaConfig"), ("mistral", "MistralForCausalLM", "MistralConfig"),
                          ("qwen2", "Qwen2ForCausalLM", "Qwen2Config")):
    FAMILIES[_name] = (
        lambda c=_cls, g=_cfg: getattr(transformers, c)(getattr(transformers, g)(
            hidden_size=N, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2,
            intermediate_size=D_FF, vocab_size=50)),
        lambda m: (lambda l, b=m.model.layers: {
            "q": _proj(b[l].self_attn.q_proj, N), "k": _proj(b[l].self_attn.k_proj, N),
            "v": _proj(b[l].self_attn.v_proj, N), "o": _proj(b[l].self_attn.o_proj, N),
            "FF_gate": _proj(b[l].mlp.gate_proj, N), "FF_up": _proj(b[l].mlp.up_proj, N),
            "FF_out": _proj(b[l].mlp.down_proj, D_FF)}))


def _norm_gain(norm, width):
    """The gain g of an RMSNorm module: ``weight`` (Qwen3, OLMo2) or ``1 + weight`` (Gemma), whichever
    calling the module confirms: nu(c e_i)_i = g_i c / sqrt(c^2 / n + eps) for the one-hot input c e_i
    of its n = width features.  The norms compute in float32, so the call decides the convention (to
    1e-5) and the float64 parameter gives the value."""
    c = 3.0
    with torch.no_grad():
        out = norm(c * torch.eye(width, dtype=torch.float64)).double().numpy()
    called = np.diag(out) * np.sqrt(c * c / width + norm_eps(norm)) / c
    w = norm.weight.detach()
    plus_one = (1.0 + w.float()).double().numpy()  # Gemma's norm forms 1 + w in float32
    w = w.double().numpy()
    gain = next(g for g in (w, plus_one) if np.allclose(called, g, rtol=1e-5, atol=1e-6))
    return gain


def norm_eps(norm):
    return getattr(norm, "variance_epsilon", None) or norm.eps


# The families whose queries and keys pass an RMSNorm before the rotation; the reference QK matrix
# is the gain-folded (G_q W_Q)^T (G_k W_K) (docs/theory.md 3d), gains read by calling the norms.
QK_NORM = {"qwen3": "head", "gemma3_text": "head", "olmo2": "all_heads"}


def _decoder(cls, cfg, **extra):
    return lambda: getattr(transformers, cls)(getattr(transformers, cfg)(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50,
        max_position_embeddings=64, **extra))


def _decoder_accessor(m, qk_norm=None, heads=H, kv=2, d=None):
    def get(l):
        a, mlp = m.model.layers[l].self_attn, m.model.layers[l].mlp
        out = {"q": _proj(a.q_proj, N), "k": _proj(a.k_proj, N), "v": _proj(a.v_proj, N), "o": _proj(a.o_proj, heads * d),
               "FF_gate": _proj(mlp.gate_proj, N), "FF_up": _proj(mlp.up_proj, N), "FF_out": _proj(mlp.down_proj, D_FF)}
        if qk_norm == "head":
            out["q_gain"] = np.tile(_norm_gain(a.q_norm, d), heads)
            out["k_gain"] = np.tile(_norm_gain(a.k_norm, d), kv)
        elif qk_norm == "all_heads":
            out["q_gain"], out["k_gain"] = _norm_gain(a.q_norm, heads * d), _norm_gain(a.k_norm, kv * d)
        return out
    return get


# head_dim 16 with N / H = 8 (Gemma's head_dim != hidden_size / heads), 2 key/value heads
FAMILIES["qwen3"] = (_decoder("Qwen3ForCausalLM", "Qwen3Config", num_key_value_heads=2, head_dim=16),
                     lambda m: _decoder_accessor(m, "head", d=16))
FAMILIES["gemma"] = (_decoder("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=1, head_dim=16),
                     lambda m: _decoder_accessor(m, kv=1, d=16))
FAMILIES["gemma2"] = (_decoder("Gemma2ForCausalLM", "Gemma2Config", num_key_value_heads=2, head_dim=16),
                      lambda m: _decoder_accessor(m, d=16))
FAMILIES["gemma3_text"] = (_decoder("Gemma3ForCausalLM", "Gemma3TextConfig", num_key_value_heads=2, head_dim=16),
                           lambda m: _decoder_accessor(m, "head", d=16))
FAMILIES["olmo2"] = (_decoder("Olmo2ForCausalLM", "Olmo2Config", num_key_value_heads=2),
                     lambda m: _decoder_accessor(m, "all_heads", d=N // H))
ROTARY_FAMILIES = ("llama", "mistral", "qwen2", "gpt_neox", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2")


def reference_matrices(get, heads, kv_heads, layers=L):
    """Dense per-matrix references, ordered like specbound's rows."""
    rows = []
    for layer in range(layers):
        w = get(layer)
        d = w["q"].shape[1] // heads
        group = heads // kv_heads
        cols = lambda m, h: m[:, h * d:(h + 1) * d]  # noqa: E731
        if "q_gain" in w:  # QK-norm: the gain-folded factors
            w["q"], w["k"] = w["q"] * w["q_gain"][None, :], w["k"] * w["k_gain"][None, :]
        rows += [("QK", cols(w["q"], h) @ cols(w["k"], h // group).T, (cols(w["q"], h), cols(w["k"], h // group)))
                 for h in range(heads)]
        rows += [("OV", cols(w["v"], h // group) @ w["o"][h * d:(h + 1) * d, :], None) for h in range(heads)]
        rows += [(r, w[r], None) for r in ("FF_in", "FF_gate", "FF_up", "FF_out") if r in w]
    return rows


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved_family(request, tmp_path_factory):
    torch.manual_seed(0)
    build, accessor = FAMILIES[request.param]
    model = build().eval()
    for p in model.parameters():  # make every weight non-trivial (some families init biases/norms to 0/1)
        torch.nn.init.normal_(p, std=0.2)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    model = model.double()  # the saved float32 weights, upcast exactly; references in float64
    kv = getattr(model.config, "num_key_value_heads", None) or H
    return request.param, folder, reference_matrices(accessor(model), H, kv, model.config.num_hidden_layers)


def test_family_matches_module_reference(saved_family):
    family, folder, ref = saved_family
    result = specbound.analyze(folder, threads=1)
    mats = result.matrices
    assert list(mats["role"]) == [r for r, _, _ in ref]
    rotary = result.model.get("rotary") is not None
    assert rotary == (family in ROTARY_FAMILIES)
    sv = result.singular_values
    for (role, w, factors), (i, row) in zip(ref, mats.iterrows()):
        s = np.linalg.svd(w, compute_uv=False)
        if rotary and role == "QK":  # every quantity holds at every offset, offset 0 (this W_Q^T W_K) included
            slack = 1 + 1e-12
            assert row["sv_method"] == "rotary_envelope"
            # the envelope is s_i(W_Q^h) s_i(W_K^g) of the module's (gain-folded) factors, to 1e-9
            env = np.linalg.svd(factors[0], compute_uv=False) * np.linalg.svd(factors[1], compute_uv=False)
            np.testing.assert_allclose(np.sort(sv[sv["matrix"] == i]["sigma"].to_numpy())[::-1], env, rtol=1e-9)
            assert row["spectral_norm"] * slack >= s[0] and row["frobenius_norm"] * slack >= np.linalg.norm(w)
            assert row["norm_2_1"] * slack >= np.linalg.norm(w, axis=0).sum()
            assert row["norm_1_1"] * slack >= np.abs(w).sum()
            assert row["rank"] >= np.count_nonzero(s > 1e-10 * len(s) * max(s[0], 1))
            continue
        assert row["spectral_norm"] == pytest.approx(s[0], rel=1e-9), (family, role)
        assert row["frobenius_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-9), (family, role)
        assert row["nuclear_norm"] == pytest.approx(s[s > 1e-10 * len(s) * max(s[0], 1)].sum(), rel=1e-9)
        assert row["norm_2_1"] == pytest.approx(np.linalg.norm(w, axis=0).sum(), rel=1e-9), (family, role)
        assert row["norm_1_1"] == pytest.approx(np.abs(w).sum(), rel=1e-9), (family, role)
        assert row["rows"] == w.shape[0] and row["cols"] == w.shape[1]
    assert np.isfinite(result.bounds["spectral_adaptive"]) and result.bounds["spectral_adaptive"] > 0


def test_family_from_pytorch_bin(saved_family, tmp_path):
    """The same weights as a pytorch_model.bin (the saved names, as older checkpoints store them)."""
    import shutil

    from safetensors.torch import load_file

    family, folder, _ = saved_family
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    torch.save(load_file(str(folder / "model.safetensors")), tmp_path / "pytorch_model.bin")
    from_bin = specbound.analyze(tmp_path, threads=1)
    reference = specbound.analyze(folder, threads=1)
    assert from_bin.all_bounds() == reference.all_bounds()
    assert from_bin.matrices.equals(reference.matrices)
    in_threads = specbound.analyze(tmp_path, threads=1, jobs=2)  # the pickle's tensors read under a lock
    assert in_threads.matrices.equals(reference.matrices)


def test_family_block_structure(saved_family):
    family, folder, _ = saved_family
    result = specbound.analyze(folder, threads=1)
    assert result.model["family"] == {"mistral": "llama", "qwen2": "llama"}.get(family, family)
    assert result.model["d_head"] == (16 if family in ("qwen3", "gemma", "gemma2", "gemma3_text") else
                                      result.model["N"] // result.model["H"])
    if family == "albert":  # 4 depths sharing 2 stored groups: every depth analysed, pairs identical
        assert result.model["L"] == 4 and set(result.matrices["layer"]) == {0, 1, 2, 3}
        by_layer = result.matrices.groupby("layer")["spectral_norm"].apply(list)
        assert by_layer[0] == by_layer[1] and by_layer[2] == by_layer[3] and by_layer[0] != by_layer[2]
    if family in ("llama", "mistral", "qwen2"):
        assert result.model["H_kv"] == 2 and set(result.matrices["role"]) == {"QK", "OV", "FF_gate", "FF_up", "FF_out"}


def test_kv_heads_inferred_when_config_omits_them(tmp_path):
    """Mistral/Qwen2 configs may omit num_key_value_heads (library defaults 8 and 32, not H): the
    key weight's shape decides, and the numbers equal those with the key present."""
    import json

    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=N, num_hidden_layers=1, num_attention_heads=H, num_key_value_heads=2,
        intermediate_size=D_FF, vocab_size=50))
    model.save_pretrained(tmp_path)
    with_key = specbound.analyze(tmp_path, threads=1)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    without = specbound.analyze(tmp_path, threads=1)
    assert without.model["H_kv"] == 2
    assert without.bounds == with_key.bounds


def test_shared_count_equals_headline_without_sharing_and_never_exceeds_it(tmp_path):
    """spectral_shared (each stored matrix once, summed sensitivity) is the headline bound when no
    weights are shared, and at most the headline bound for an ALBERT, strictly below with sharing."""
    bert_folder = tmp_path / "bert"
    torch.manual_seed(1)
    transformers.BertModel(transformers.BertConfig(hidden_size=N, num_hidden_layers=3, num_attention_heads=H,
                                                   intermediate_size=D_FF, vocab_size=50)).save_pretrained(bert_folder)
    unshared = specbound.analyze(bert_folder, threads=1).all_bounds()
    assert unshared["spectral_shared"] == pytest.approx(unshared["spectral_adaptive"], rel=1e-12)

    for groups in (1, 2):
        folder = tmp_path / f"albert{groups}"
        torch.manual_seed(2)
        model = transformers.AlbertModel(transformers.AlbertConfig(
            embedding_size=16, hidden_size=N, num_hidden_layers=4, num_hidden_groups=groups,
            num_attention_heads=H, intermediate_size=D_FF, vocab_size=50))
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
        model.save_pretrained(folder)
        bounds = specbound.analyze(folder, threads=1).all_bounds()
        assert bounds["spectral_shared"] < bounds["spectral_adaptive"]


def test_family_layers_in_parallel_are_identical(saved_family):
    """jobs > 1 analyses layers in threads: the same numbers in the same order (ALBERT's shared
    layers included), whatever order the layers finish in."""
    family, folder, _ = saved_family
    one = specbound.analyze(folder, threads=1)
    seen = []
    many = specbound.analyze(folder, threads=1, jobs=3, progress=lambda done, total: seen.append((done, total)))
    assert many.all_bounds() == one.all_bounds()
    pd.testing.assert_frame_equal(many.matrices, one.matrices, check_exact=True)
    L = one.model["L"]
    assert seen[-1] == (L, L) and [d for d, _ in seen] == sorted(d for d, _ in seen)
