"""llama.cpp's GGUF files of the late-2026 mixtures of experts with dense leading layers and shared experts,
``glm4moe`` (GLM-4.5 / 4.6) and ``ernie4_5-moe`` (ERNIE 4.5), written by the ``gguf`` package's GGUFWriter the
way ``convert_hf_to_gguf.py`` (``Glm4MoeModel``, ``Ernie4_5MoeModel``) writes them: tensor names from gguf's
own ``TensorNameMap``, each layer's experts stacked into the 3-D banks ``ffn_{gate,up,down}_exps``, the
router's correction bias as ``exp_probs_b.bias``, the metadata keys each class writes (transcribed below).
GLM's converter counts its multi-token-prediction layer in ``block_count`` (``nextn_predict_layers``) and
stores it as one more block (``blk.L.nextn.*`` beside a whole layer): the file here holds one, of random
weights, which the analysis must leave out.  Oracle: the tiny Hugging Face model saved with
save_pretrained; every matrix and every number of the GGUF analysis equals the folder's (to 1e-9) but the
family's name and the router's tensor names."""

import numpy as np
import pytest
from safetensors.numpy import load_file
from support import gguf_convert
from support.same_numbers import assert_close_tree, numbers

import specbound
from specbound import SpecboundError
from specbound.archs.extract import layer_weights
from specbound.io.gguf_archs import deepseek2_yarn
from specbound.pipeline import open_model

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N, H, KV, L, E, TOP_K, D_FF, MOE_FF, VOCAB = 32, 4, 2, 3, 4, 2, 48, 16, 64
T = transformers


def _glm():
    return T.Glm4MoeForCausalLM(
        T.Glm4MoeConfig(
            hidden_size=N,
            num_hidden_layers=L,
            num_attention_heads=H,
            num_key_value_heads=KV,
            head_dim=16,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_FF,
            n_routed_experts=E,
            num_experts_per_tok=TOP_K,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            use_qk_norm=True,
            attention_bias=True,
            num_nextn_predict_layers=1,
            rms_norm_eps=1e-5,
            vocab_size=VOCAB,
            max_position_embeddings=64,
        )
    )


def _ernie():  # layer 0 dense (moe_layer_start_index), then every layer; two shared experts
    return T.Ernie4_5_MoeForCausalLM(
        T.Ernie4_5_MoeConfig(
            hidden_size=N,
            num_hidden_layers=L,
            num_attention_heads=H,
            num_key_value_heads=KV,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_FF,
            moe_num_experts=E,
            moe_k=TOP_K,
            moe_layer_start_index=1,
            moe_num_shared_experts=2,
            rms_norm_eps=1e-5,
            vocab_size=VOCAB,
            max_position_embeddings=64,
        )
    )


def _deepseek(**config):  # families.py's DeepSeek-V3 layout: latents of 12 and 10, 6 + 4 key features, 5 value features
    return T.DeepseekV3ForCausalLM(
        T.DeepseekV3Config(
            hidden_size=N,
            num_hidden_layers=L,
            num_attention_heads=H,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_FF,
            n_routed_experts=E,
            num_experts_per_tok=TOP_K,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            n_shared_experts=1,
            q_lora_rank=12,
            kv_lora_rank=10,
            qk_rope_head_dim=4,
            qk_nope_head_dim=6,
            v_head_dim=5,
            rms_norm_eps=1e-6,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            **config,
        )
    )


def _yarn_meta(rope):
    """TextModel.set_gguf_parameters' YaRN keys (type, factor, original context, the betas and attention factor
    the config states) and DeepseekV2Model's yarn_log_multiplier, 0.1 mscale_all_dim when the config has it."""
    if rope.get("rope_type") != "yarn":
        return {}
    meta = dict(
        rope_scaling_type=gguf.RopeScalingType.YARN,
        rope_scaling_factor=rope["factor"],
        rope_scaling_orig_ctx_len=rope["original_max_position_embeddings"],
    )
    for ours, theirs in (
        ("yarn_ext_factor", "extrapolation_factor"),
        ("yarn_beta_fast", "beta_fast"),
        ("yarn_beta_slow", "beta_slow"),
    ):
        if rope.get(theirs) is not None:
            meta[f"rope_scaling_{ours}"] = rope[theirs]
    if rope.get("attention_factor", rope.get("attn_factor")) is not None:
        meta["rope_scaling_yarn_attn_factor"] = rope.get("attention_factor", rope.get("attn_factor"))
    if rope.get("mscale_all_dim") is not None:
        meta["rope_scaling_yarn_log_mul"] = 0.1 * rope["mscale_all_dim"]
    return meta


def _deepseek_meta(c):
    """DeepseekV2Model.set_gguf_parameters: one key/value head, the absorbed key/value lengths and the MLA
    ones, the gating function by scoring_func, the rope scaling (:func:`_yarn_meta`)."""
    return dict(
        **_yarn_meta(c.rope_parameters),
        block_count=c.num_hidden_layers,
        context_length=c.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=c.intermediate_size,
        head_count=H,
        head_count_kv=1,
        layer_norm_rms_eps=c.rms_norm_eps,
        rope_freq_base=c.rope_parameters["rope_theta"],
        leading_dense_block_count=c.first_k_dense_replace,
        q_lora_rank=c.q_lora_rank,
        kv_lora_rank=c.kv_lora_rank,
        key_length=c.kv_lora_rank + c.qk_rope_head_dim,
        value_length=c.kv_lora_rank,
        key_length_mla=c.qk_nope_head_dim + c.qk_rope_head_dim,
        value_length_mla=c.v_head_dim,
        expert_feed_forward_length=c.moe_intermediate_size,
        expert_count=c.n_routed_experts,
        expert_used_count=c.num_experts_per_tok,
        expert_shared_count=c.n_shared_experts,
        expert_weights_scale=c.routed_scaling_factor,
        expert_weights_norm=c.norm_topk_prob,
        expert_gating_func=gguf.ExpertGatingFuncType.SIGMOID,
        rope_dimension_count=c.qk_rope_head_dim,
    )


def _glm_meta(c):
    """Glm4MoeModel.set_gguf_parameters (after TextModel's): block_count counts the MTP layers."""
    return dict(
        block_count=c.num_hidden_layers + c.num_nextn_predict_layers,
        context_length=c.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=c.intermediate_size,
        head_count=H,
        head_count_kv=KV,
        key_length=c.head_dim,
        value_length=c.head_dim,
        layer_norm_rms_eps=c.rms_norm_eps,
        rope_freq_base=c.rope_parameters["rope_theta"],
        rope_dimension_count=int(c.head_dim * c.rope_parameters["partial_rotary_factor"]),
        expert_count=c.n_routed_experts,
        expert_used_count=c.num_experts_per_tok,
        expert_feed_forward_length=c.moe_intermediate_size,
        expert_shared_count=c.n_shared_experts,
        leading_dense_block_count=c.first_k_dense_replace,
        expert_gating_func=gguf.ExpertGatingFuncType.SIGMOID,
        expert_weights_scale=c.routed_scaling_factor,
        expert_weights_norm=c.norm_topk_prob,
        nextn_predict_layers=c.num_nextn_predict_layers,
    )


def _ernie_meta(c):
    """Ernie4_5MoeModel.set_gguf_parameters (after TextModel's), its shared width included:
    intermediate_size // num_key_value_heads, which the reader does not use (the shared block's width is
    expert_shared_count experts of expert_feed_forward_length, as the Hugging Face family reads it)."""
    return dict(
        block_count=c.num_hidden_layers,
        context_length=c.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=c.intermediate_size,
        head_count=H,
        head_count_kv=KV,
        layer_norm_rms_eps=c.rms_norm_eps,
        rope_freq_base=c.rope_parameters["rope_theta"],
        expert_count=c.moe_num_experts,
        expert_used_count=c.moe_k,
        interleave_moe_layer_step=c.moe_layer_interval,
        leading_dense_block_count=c.moe_layer_start_index,
        expert_feed_forward_length=c.moe_intermediate_size,
        expert_shared_count=c.moe_num_shared_experts,
        expert_shared_feed_forward_length=c.intermediate_size // c.num_key_value_heads,
    )


# name -> (GGUF architecture, gguf MODEL_ARCH, Hugging Face model, metadata)
MODELS = {
    "glm4_moe": ("glm4moe", "GLM4_MOE", _glm, _glm_meta),
    "ernie4_5_moe": ("ernie4_5-moe", "ERNIE4_5_MOE", _ernie, _ernie_meta),
    "deepseek_v3": ("deepseek2", "DEEPSEEK2", _deepseek, _deepseek_meta),
}


def split_kv_b(kv_b, config):
    """DeepseekV2Model.modify_tensors: kv_b_proj viewed (H, d_nope + d_v, r), split into k_b (transposed per
    head: (H, r, d_nope)) and v_b ((H, d_v, r))."""
    nope, dv = config.qk_nope_head_dim, config.v_head_dim
    per_head = kv_b.reshape(H, nope + dv, kv_b.shape[-1])
    return per_head[:, :nope].transpose(0, 2, 1), per_head[:, nope:]


def convert(state, arch_id, blocks, config=None):
    """The converters' tensors: names from gguf's TensorNameMap, the experts stacked (``torch.stack`` over
    the expert index), ``e_score_correction_bias`` renamed ``e_score_correction.bias`` (exp_probs_b.bias),
    DeepSeek's kv_b_proj split into k_b_proj and v_b_proj."""
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch_id), blocks)
    out, banks = {}, {}
    for name, array in list(state.items()):
        if name.endswith("kv_b_proj.weight"):
            k_b, v_b = split_kv_b(array, config)
            out[names.get_name(name.replace("kv_b_proj", "k_b_proj"), try_suffixes=(".weight",))] = k_b
            out[names.get_name(name.replace("kv_b_proj", "v_b_proj"), try_suffixes=(".weight",))] = v_b
            continue
        if ".mlp.experts." in name:  # model.layers.{l}.mlp.experts.{e}.{role}_proj.weight
            parts = name.split(".")
            banks.setdefault((int(parts[2]), parts[6][: -len("_proj")]), {})[int(parts[5])] = array
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"gguf's tensor map has no name for {name}")
        out[target] = array
    for (layer, role), experts in banks.items():
        out[f"blk.{layer}.ffn_{role}_exps.weight"] = np.stack([experts[e] for e in sorted(experts)])
    return out


def mtp_block(tensors, layer, rng):
    """A multi-token-prediction block as the GLM-4.5 checkpoint's layer ``num_hidden_layers`` converts: a whole
    layer's tensors (the last layer's shapes, random values) and the nextn tensors."""
    last = layer - 1
    out = {
        n.replace(f"blk.{last}.", f"blk.{layer}.", 1): rng.normal(size=a.shape).astype(np.float32)
        for n, a in tensors.items()
        if n.startswith(f"blk.{last}.")
    }
    out.update(
        {
            f"blk.{layer}.nextn.eh_proj.weight": rng.normal(size=(N, 2 * N)).astype(np.float32),
            f"blk.{layer}.nextn.enorm.weight": np.ones(N, np.float32),
            f"blk.{layer}.nextn.hnorm.weight": np.ones(N, np.float32),
            f"blk.{layer}.nextn.shared_head_norm.weight": np.ones(N, np.float32),
        }
    )
    return out


def write_gguf(path, arch, tensors, meta):
    """support.gguf_convert's writer, with this module's vocabulary of ``VOCAB`` tokens."""
    return gguf_convert.write_gguf(path, arch, tensors, meta, VOCAB)


def build(name, root, config=None, **meta_changes):
    """``(Hugging Face folder, GGUF file, tensors, metadata)`` of the tiny model ``name`` (``config``: keys
    given to its Hugging Face config)."""

    arch, arch_id, model_of, meta_of = MODELS[name]
    torch.manual_seed(7)
    model = model_of(**(config or {})).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(root / "hf")
    meta = {**meta_of(model.config), **meta_changes}
    tensors = convert(load_file(str(root / "hf" / "model.safetensors")), arch_id, meta["block_count"], model.config)
    if meta.get("nextn_predict_layers"):
        tensors.update(mtp_block(tensors, L, np.random.default_rng(0)))
    return root / "hf", write_gguf(root / "model.gguf", arch, tensors, meta), tensors, meta


@pytest.fixture(scope="module", params=sorted(MODELS))
def converted(request, tmp_path_factory):
    folder, path, _, _ = build(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, folder, path


def test_every_matrix_equals_the_hugging_face_checkpoints(converted):
    name, folder, path = converted
    a, b = open_model(folder), open_model(path)
    assert a.dims == b.dims
    assert b.dims.L == L and b.dims.moe.layers == (1, 2)  # layer 0 dense; GLM's MTP block (blk.3) left out
    assert a.rotary == b.rotary
    for layer in range(L):
        x = layer_weights(a.spec, a.ckpt, a.dims, a.prefix, layer)
        y = layer_weights(b.spec, b.ckpt, b.dims, b.prefix, layer)
        for role in "qkvo":
            if getattr(x, role) is None:  # latent attention: its factors instead
                assert getattr(y, role) is None
                continue
            np.testing.assert_allclose(getattr(y, role), getattr(x, role), rtol=0, atol=1e-9, err_msg=role)
        assert (x.latent is None) == (y.latent is None) == (name != "deepseek_v3")
        for field, value in (vars(x.latent) if x.latent is not None else {}).items():
            if isinstance(value, np.ndarray):
                np.testing.assert_allclose(getattr(y.latent, field), value, rtol=0, atol=1e-9, err_msg=field)
            else:
                assert getattr(y.latent, field) == value, field
        assert list(x.ff) == list(y.ff)
        for role in x.ff:
            np.testing.assert_allclose(y.ff[role], x.ff[role], rtol=0, atol=1e-9, err_msg=role)


def test_the_analysis_equals_the_hugging_face_checkpoints(converted):
    name, folder, path = converted
    result = specbound.analyze(path, threads=1)
    assert result.model["family"] == f"{name}_gguf"
    hf, ours = numbers(specbound.analyze(folder, threads=1), family=False), numbers(result, family=False)
    for key in ("router", "shared_gate"):  # the router's tensor names: provenance, like "tensors"
        assert (hf["model"]["experts"].pop(key) is None) == (ours["model"]["experts"].pop(key) is None)
    assert_close_tree(hf, ours, 1e-9)


def test_glms_multi_token_prediction_block_is_not_a_layer(tmp_path):
    """block_count 4 with nextn_predict_layers 1: three layers; blk.3's tensors exposed as mtp.blk.3.*
    and ignored (not read, not refused as strays), the model's gates (sigmoid, renormalised, times 2.5)."""
    _, path, tensors, meta = build("glm4_moe", tmp_path)
    assert meta["block_count"] == L + 1 and "blk.3.nextn.eh_proj.weight" in tensors
    opened = open_model(path)
    assert opened.dims.L == L and opened.ckpt.config["layer_count"] == L
    assert "mtp.blk.3.nextn.eh_proj.weight" in opened.ckpt.names and "blk.3.attn_q.weight" not in opened.ckpt.names
    np.testing.assert_array_equal(
        opened.ckpt.read("mtp.blk.3.nextn.eh_proj.weight"), tensors["blk.3.nextn.eh_proj.weight"]
    )  # renamed, still its own bytes
    moe = opened.dims.moe
    assert (moe.scoring, moe.gate_max, moe.gate_sum, moe.shared_d_ff) == ("sigmoid", 2.5, 2.5, MOE_FF)


def test_a_glm_file_without_prediction_blocks_has_block_count_layers(tmp_path):
    _, path, tensors, _ = build("glm4_moe", tmp_path, nextn_predict_layers=0, block_count=L)
    assert not any(n.startswith(f"blk.{L}.") for n in tensors)
    assert open_model(path).dims.L == L


def test_glm_gates_not_renormalised_without_expert_weights_norm(tmp_path):
    """llama.cpp's default for a file without expert_weights_norm: the top-k sigmoid scores as they are, so
    their sum is bounded by k (times the scale), not by 1."""
    _, path, _, _ = build("glm4_moe", tmp_path, expert_weights_norm=False)
    assert open_model(path).dims.moe.gate_sum == 2.5 * TOP_K


@pytest.mark.parametrize(
    "name, meta, match",
    [
        ("glm4_moe", {"nextn_predict_layers": L + 1}, "nextn_predict_layers"),
        ("glm4_moe", {"expert_gating_func": gguf.ExpertGatingFuncType.SOFTMAX}, "expert_gating_func"),
        ("ernie4_5_moe", {"expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID}, "expert_gating_func"),
        ("deepseek_v3", {"expert_gating_func": gguf.ExpertGatingFuncType.SOFTMAX}, "expert_gating_func"),  # V2's
        ("deepseek_v3", {"rope_scaling_type": gguf.RopeScalingType.LINEAR, "rope_scaling_factor": 4.0}, "'yarn'"),
        (
            "deepseek_v3",
            {
                "rope_scaling_type": gguf.RopeScalingType.YARN,
                "rope_scaling_factor": 4.0,
                "rope_scaling_yarn_ext_factor": 0.5,
            },
            "yarn_ext_factor",
        ),
        (
            "deepseek_v3",
            {
                "rope_scaling_type": gguf.RopeScalingType.YARN,
                "rope_scaling_factor": 4.0,
                "rope_scaling_yarn_log_mul": -0.1,
            },
            "yarn_log_multiplier",
        ),
        ("deepseek_v3", {"key_length_mla": 4}, "key_length_mla"),  # not above the 4 rotated features
    ],
)
def test_a_malformed_or_unmodelled_file_is_refused_in_one_line(tmp_path, name, meta, match):
    _, path, _, _ = build(name, tmp_path, **meta)
    with pytest.raises(SpecboundError, match=match) as info:
        specbound.analyze(path, threads=1)
    assert "\n" not in str(info.value)


def test_deepseeks_kv_b_is_joined_from_the_converters_halves(tmp_path):
    """The file holds attn_k_b (H, r, d_nope) and attn_v_b (H, d_v, r) and no attn_kv_b; the reader's
    blk.N.attn_kv_b.weight is the Hugging Face kv_b_proj, exactly; halves of different models: one line."""

    folder, path, tensors, meta = build("deepseek_v3", tmp_path)
    assert "blk.1.attn_kv_b.weight" not in tensors and tensors["blk.1.attn_k_b.weight"].shape == (H, 10, 6)
    kv_b = load_file(str(folder / "model.safetensors"))["model.layers.1.self_attn.kv_b_proj.weight"]
    opened = open_model(path)
    np.testing.assert_array_equal(opened.ckpt.read("blk.1.attn_kv_b.weight"), kv_b.astype(np.float64))
    assert opened.ckpt.shape("blk.1.attn_kv_b.weight") == kv_b.shape
    assert "attn_k_b" in opened.ckpt.where("blk.1.attn_kv_b.weight")
    tensors["blk.1.attn_v_b.weight"] = tensors["blk.1.attn_v_b.weight"][:, :, :9]  # another rank
    with pytest.raises(SpecboundError, match="attn_v_b") as info:
        specbound.analyze(write_gguf(tmp_path / "bad.gguf", "deepseek2", tensors, meta), threads=1)
    assert "\n" not in str(info.value)


# DeepSeek-V3's and Kimi-K2's YaRN (mscale = mscale_all_dim = 1), DeepSeek-V2's (0.707), and one without mscale_all_dim
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1}
YARN_CASES = {
    "v3": {"mscale": 1.0, "mscale_all_dim": 1.0},
    "v2": {"mscale": 0.707, "mscale_all_dim": 0.707},
    "no_mscale": {},
}


@pytest.mark.parametrize("case", sorted(YARN_CASES))
def test_deepseeks_yarn_analyses_like_the_hugging_face_checkpoint(tmp_path, case):
    """The converter's YaRN keys (rope.scaling.type, factor, original_context_length, the betas and
    yarn_log_multiplier = 0.1 mscale_all_dim) read back as the config's rope_scaling: every number of the
    analysis the folder's (the softmax scale's mscale^2, the rotary frequencies and attention factor), and
    the assumed mscale named among the assumptions."""
    rope = {**YARN, **YARN_CASES[case]}
    folder, path, _, meta = build("deepseek_v3", tmp_path, config={"rope_scaling": rope})
    assert meta["rope_scaling_type"] == gguf.RopeScalingType.YARN
    assert ("rope_scaling_yarn_log_mul" in meta) == (case != "no_mscale")
    opened, reference = open_model(path), open_model(folder)
    m_all = YARN_CASES[case].get("mscale_all_dim")
    scale = (1 + 0.1 * m_all * np.log(4.0)) ** 2 if m_all else 1.0
    assert opened.dims.latent.logit_scale == pytest.approx(scale, rel=1e-12)
    assert opened.dims.latent == reference.dims.latent
    assert opened.rotary == reference.rotary
    result = specbound.analyze(path, threads=1)
    assumed = [e for e in result.assumptions if e["name"] == "gguf_yarn_mscale"]
    assert len(assumed) == (case != "no_mscale")
    if assumed:
        assert f"mscale_all_dim = {m_all:g}" in assumed[0]["effect"] and assumed[0]["kind"] == "convention"
    result.assumptions = [e for e in result.assumptions if e["name"] != "gguf_yarn_mscale"]
    hf, ours = numbers(specbound.analyze(folder, threads=1), family=False), numbers(result, family=False)
    for key in ("router", "shared_gate"):
        assert (hf["model"]["experts"].pop(key) is None) == (ours["model"]["experts"].pop(key) is None)
    assert_close_tree(hf, ours, 1e-9)


def test_deepseeks_yarn_attention_factor_is_read_as_stated(tmp_path):
    """A config stating YaRN's attention_factor: the converter writes it as yarn_attn_factor, the rotary
    features are scaled by it in both analyses."""
    rope = {**YARN, **YARN_CASES["v3"], "attention_factor": 1.25}
    folder, path, _, meta = build("deepseek_v3", tmp_path, config={"rope_scaling": rope})
    assert meta["rope_scaling_yarn_attn_factor"] == 1.25
    opened, reference = open_model(path), open_model(folder)
    assert opened.dims.latent.rope_factor == reference.dims.latent.rope_factor == 1.25
    assert opened.dims.latent.logit_scale == reference.dims.latent.logit_scale


@pytest.mark.parametrize("stated", [1.0, 0.707, 0.1, 1.3, 0.7071068])  # float32 holds ~7 digits
def test_mscale_all_dim_is_the_decimal_the_config_stated(stated):
    stored = float(np.float32(0.1 * stated))  # the file's float32, read back as a float
    config = {
        "rope.scaling.type": "yarn",
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
        "rope.scaling.yarn_log_multiplier": stored,
    }
    assert deepseek2_yarn(None, config)[0]["rope_scaling"]["mscale_all_dim"] == stated
