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


def _phi3(m):
    def get(layer):
        b = m.model.layers[layer]
        qkv = _proj(b.self_attn.qkv_proj, N)  # Phi3Attention: [q | k | v], q of H heads, k and v of H_kv heads
        d = b.self_attn.head_dim
        q, k, v = np.split(qkv, [H * d, (H + m.config.num_key_value_heads) * d], axis=1)
        gate, up = np.split(_proj(b.mlp.gate_up_proj, N), 2, axis=1)  # Phi3MLP: gate, up = chunk(2)
        return {"q": q, "k": k, "v": v, "o": _proj(b.self_attn.o_proj, N), "FF_gate": gate, "FF_up": up,
                "FF_out": _proj(b.mlp.down_proj, D_FF)}
    return get


def _falcon(m):
    """q, k, v through FalconAttention's own ``_split_heads`` of the fused weight's output."""
    def get(layer):
        b = m.transformer.h[layer]
        attn = b.self_attention
        with torch.no_grad():
            fused = torch.tensor(_proj(attn.query_key_value, N))[None]  # (1, N inputs, fused width)
            q, k, v = attn._split_heads(fused)  # (1, N, heads, d_h)
        d = attn.head_dim
        kv = k.shape[2] if not m.config.new_decoder_architecture else m.config.num_kv_heads
        if m.config.new_decoder_architecture:  # keys and values come broadcast to every query head
            k, v = k[:, :, ::H // kv], v[:, :, ::H // kv]
        flat = lambda t: t[0].reshape(N, -1).numpy()  # noqa: E731
        return {"q": flat(q), "k": flat(k), "v": flat(v), "o": _proj(attn.dense, N),
                "FF_in": _proj(b.mlp.dense_h_to_4h, N), "FF_out": _proj(b.mlp.dense_4h_to_h, 4 * N)}
    return get


def _bloom(m):
    def get(layer):
        b = m.transformer.h[layer]
        with torch.no_grad():
            q, k, v = b.self_attention._reshape(torch.tensor(_proj(b.self_attention.query_key_value, N))[None])
        flat = lambda t: t[0].transpose(0, 1).reshape(N, -1).numpy()  # (1, H, N, d) -> (N, H d)  # noqa: E731
        return {"q": flat(q), "k": flat(k), "v": flat(v), "o": _proj(b.self_attention.dense, N),
                "FF_in": _proj(b.mlp.dense_h_to_4h, N), "FF_out": _proj(b.mlp.dense_4h_to_h, 4 * N)}
    return get


def expert_matrices(experts, e, d_ff):
    """Expert ``e``'s gate, up and down matrices, row-oriented, as the experts module's forward computes
    them (``linear(x, gate_up_proj[e]).chunk(2)``, ``linear(h, down_proj[e])``)."""
    with torch.no_grad():
        eye = torch.eye(N, dtype=torch.float64)
        gate, up = torch.nn.functional.linear(eye, experts.gate_up_proj[e]).chunk(2, dim=-1)
        down = torch.nn.functional.linear(torch.eye(d_ff, dtype=torch.float64), experts.down_proj[e])
    return gate.numpy(), up.numpy(), down.numpy()


def _moe(m, block, d_ff, shared=False):
    def get(layer):
        b = m.model.layers[layer]
        out = {"q": _proj(b.self_attn.q_proj, N), "k": _proj(b.self_attn.k_proj, N),
               "v": _proj(b.self_attn.v_proj, N), "o": _proj(b.self_attn.o_proj, N)}
        moe = getattr(b, block)
        for e in range(moe.experts.gate_up_proj.shape[0]):
            out.update(zip((f"FF_gate[e{e}]", f"FF_up[e{e}]", f"FF_out[e{e}]"), expert_matrices(moe.experts, e, d_ff)))
        if shared:
            s = moe.shared_expert
            out.update({"FF_gate[shared]": _proj(s.gate_proj, N), "FF_up[shared]": _proj(s.up_proj, N),
                        "FF_out[shared]": _proj(s.down_proj, s.down_proj.in_features)})
        return out
    return get


MOE_EXPERTS, MOE_TOP_K, MOE_D_FF, SHARED_D_FF = 4, 2, 24, 40
FAMILIES.update({
    "phi": (lambda: transformers.PhiForCausalLM(transformers.PhiConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50,
        max_position_embeddings=16)),  # partial_rotary_factor 0.5: 4 of each head's 8 dimensions rotate
        lambda m: (lambda l, b=m.model.layers: {
            "q": _proj(b[l].self_attn.q_proj, N), "k": _proj(b[l].self_attn.k_proj, N),
            "v": _proj(b[l].self_attn.v_proj, N), "o": _proj(b[l].self_attn.dense, N),
            "FF_in": _proj(b[l].mlp.fc1, N), "FF_out": _proj(b[l].mlp.fc2, D_FF)})),
    "phi3": (lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2, intermediate_size=D_FF,
        vocab_size=50, pad_token_id=0, max_position_embeddings=16, original_max_position_embeddings=16)), _phi3),
    "gptj": (lambda: transformers.GPTJForCausalLM(transformers.GPTJConfig(
        n_embd=N, n_layer=L, n_head=H, rotary_dim=4, vocab_size=50, n_positions=16)),
        lambda m: (lambda l, b=m.transformer.h: {
            "q": _proj(b[l].attn.q_proj, N), "k": _proj(b[l].attn.k_proj, N), "v": _proj(b[l].attn.v_proj, N),
            "o": _proj(b[l].attn.out_proj, N), "FF_in": _proj(b[l].mlp.fc_in, N),
            "FF_out": _proj(b[l].mlp.fc_out, 4 * N)})),
    "bloom": (lambda: transformers.BloomForCausalLM(transformers.BloomConfig(
        hidden_size=N, n_layer=L, n_head=H, vocab_size=50)), _bloom),
    # Falcon-7B's layout: multi_query (one key/value head), one shared LayerNorm, parallel block, rotary
    "falcon": (lambda: transformers.FalconForCausalLM(transformers.FalconConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, vocab_size=50, max_position_embeddings=16)),
        _falcon),
    # the original layout without multi_query (a key/value head per query head), sequential, ALiBi
    "falcon_alibi": (lambda: transformers.FalconForCausalLM(transformers.FalconConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, vocab_size=50, multi_query=False,
        parallel_attn=False, alibi=True, bias=True)), _falcon),
    # Falcon-40B's new_decoder_architecture: 2 key/value groups, a LayerNorm per branch
    "falcon_new": (lambda: transformers.FalconForCausalLM(transformers.FalconConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, num_kv_heads=2, vocab_size=50,
        new_decoder_architecture=True, max_position_embeddings=16)), _falcon),
    "mixtral": (lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2, intermediate_size=MOE_D_FF,
        vocab_size=50, num_local_experts=MOE_EXPERTS, num_experts_per_tok=MOE_TOP_K, max_position_embeddings=16)),
        lambda m: _moe(m, "mlp", MOE_D_FF)),
    "qwen2_moe": (lambda: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        hidden_size=N, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2, intermediate_size=D_FF,
        moe_intermediate_size=MOE_D_FF, shared_expert_intermediate_size=SHARED_D_FF, vocab_size=50,
        num_experts=MOE_EXPERTS, num_experts_per_tok=MOE_TOP_K, max_position_embeddings=16)),
        lambda m: _moe(m, "mlp", MOE_D_FF, shared=True)),
})
ROTARY = {"llama", "mistral", "qwen2", "gpt_neox", "phi", "phi3", "gptj", "falcon", "falcon_new", "mixtral",
          "qwen2_moe"}
FAMILY_OF = {"mistral": "llama", "qwen2": "llama", "falcon_alibi": "falcon", "falcon_new": "falcon"}


def reference_matrices(get, heads, kv_heads, layers=L):
    """Dense per-matrix references, ordered like specbound's rows."""
    rows = []
    for layer in range(layers):
        w = get(layer)
        d = w["q"].shape[1] // heads
        group = heads // kv_heads
        cols = lambda m, h: m[:, h * d:(h + 1) * d]  # noqa: E731
        rows += [("QK", cols(w["q"], h) @ cols(w["k"], h // group).T) for h in range(heads)]
        rows += [("OV", cols(w["v"], h // group) @ w["o"][h * d:(h + 1) * d, :]) for h in range(heads)]
        rows += [(r, m) for r, m in w.items() if r.startswith("FF_")]  # in the model's order (experts: e0, e1, ...)
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
    get = accessor(model)
    kv = get(0)["k"].shape[1] // (get(0)["q"].shape[1] // H)  # key/value heads as the module splits them
    return request.param, folder, reference_matrices(get, H, kv, model.config.num_hidden_layers)


def test_family_matches_module_reference(saved_family):
    family, folder, ref = saved_family
    result = specbound.analyze(folder, threads=1)
    mats = result.matrices
    assert list(mats["role"]) == [r for r, _ in ref]
    rotary = result.model.get("rotary") is not None
    assert rotary == (family in ROTARY)
    for (role, w), (_, row) in zip(ref, mats.iterrows()):
        s = np.linalg.svd(w, compute_uv=False)
        if rotary and role == "QK":  # every quantity holds at every offset, offset 0 (this W_Q^T W_K) included
            slack = 1 + 1e-12
            assert row["sv_method"] == "rotary_envelope"
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
    assert result.model["family"] == FAMILY_OF.get(family, family)
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
