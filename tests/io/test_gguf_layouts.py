"""llama.cpp's other architectures (phi2, phi3, gptj, falcon, bloom, qwen2moe, qwen3moe, gpt-oss, and llama with
experts)
in GGUF files written by the ``gguf`` package's GGUFWriter the way ``convert_hf_to_gguf.py`` writes
each one: its tensor names, its metadata keys, its rearrangements (Falcon's per-group and BLOOM's
per-head fused QKV rewritten as ``[q | k | v]``, experts stacked into 3-D banks, Llama's Q/K rows
permuted; each transcribed below from the converter).  Oracle: the tiny Hugging Face model saved with
save_pretrained; every matrix and every number of the GGUF analysis equals the folder's (to 1e-9),
apart from the family's name and, where llama.cpp computes another GELU than the Hugging Face class
(Falcon's erf GELU, Phi's and GPT-J's ``gelu_new``: llama.cpp's ``ggml_gelu`` is the tanh form), the
activation's name (its Lipschitz constant, 1.13, is the same)."""

import numpy as np
import pytest
from safetensors.numpy import load_file
from support.gguf_convert import permute
from support.same_numbers import assert_close_tree, assert_same_layer_weights, numbers

import specbound
from specbound.pipeline import open_model

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N, H, L = 32, 4, 2
T = transformers


def _stack(state, prefix, names, experts):
    """The converter's expert merge: ``torch.stack([expert e's weight for e], dim=0)``."""
    return {
        gguf_role: np.stack([state[f"{prefix}.experts.{e}.{hf}.weight"] for e in range(experts)])
        for hf, gguf_role in names.items()
    }


def _phi2(state, config):
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output.weight": state["lm_head.weight"],
        "output_norm.weight": state["model.final_layernorm.weight"],
    }
    for l in range(L):
        p = f"model.layers.{l}."
        out.update(
            {
                f"blk.{l}.attn_q.weight": state[p + "self_attn.q_proj.weight"],
                f"blk.{l}.attn_k.weight": state[p + "self_attn.k_proj.weight"],
                f"blk.{l}.attn_v.weight": state[p + "self_attn.v_proj.weight"],
                f"blk.{l}.attn_output.weight": state[p + "self_attn.dense.weight"],
                f"blk.{l}.ffn_up.weight": state[p + "mlp.fc1.weight"],
                f"blk.{l}.ffn_down.weight": state[p + "mlp.fc2.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "input_layernorm.weight"],
            }
        )
    rot = config.rope_parameters["partial_rotary_factor"]
    meta = dict(
        context_length=config.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=4 * N,
        head_count=H,
        head_count_kv=H,
        rope_dimension_count=int(rot * N) // H,
    )
    return out, meta


def _phi3(state, config):
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output.weight": state["lm_head.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    for l in range(L):
        p = f"model.layers.{l}."
        out.update(
            {
                f"blk.{l}.attn_qkv.weight": state[p + "self_attn.qkv_proj.weight"],
                f"blk.{l}.attn_output.weight": state[p + "self_attn.o_proj.weight"],
                f"blk.{l}.ffn_up.weight": state[p + "mlp.gate_up_proj.weight"],
                f"blk.{l}.ffn_down.weight": state[p + "mlp.down_proj.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "input_layernorm.weight"],
                f"blk.{l}.ffn_norm.weight": state[p + "post_attention_layernorm.weight"],
            }
        )
    rope = config.rope_parameters
    meta = dict(
        context_length=config.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=config.intermediate_size,
        head_count=H,
        head_count_kv=config.num_key_value_heads,
        rope_dimension_count=int(rope.get("partial_rotary_factor", 1.0) * N) // H,
        rope_freq_base=rope["rope_theta"],
        rope_scaling_orig_ctx_len=config.original_max_position_embeddings,
    )
    if rope.get("rope_type") == "longrope":  # Phi3MiniModel.generate_extra_tensors
        out["rope_factors_long.weight"] = np.array(rope["long_factor"], dtype=np.float32)
        out["rope_factors_short.weight"] = np.array(rope["short_factor"], dtype=np.float32)
    return out, meta


def _gptj(state, config):
    out = {
        "token_embd.weight": state["transformer.wte.weight"],
        "output.weight": state["lm_head.weight"],
        "output_norm.weight": state["transformer.ln_f.weight"],
    }
    for l in range(L):
        p = f"transformer.h.{l}."
        out.update(
            {
                f"blk.{l}.attn_q.weight": state[p + "attn.q_proj.weight"],
                f"blk.{l}.attn_k.weight": state[p + "attn.k_proj.weight"],
                f"blk.{l}.attn_v.weight": state[p + "attn.v_proj.weight"],
                f"blk.{l}.attn_output.weight": state[p + "attn.out_proj.weight"],
                f"blk.{l}.ffn_up.weight": state[p + "mlp.fc_in.weight"],
                f"blk.{l}.ffn_down.weight": state[p + "mlp.fc_out.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "ln_1.weight"],
            }
        )
    meta = dict(
        context_length=config.n_positions,
        embedding_length=N,
        feed_forward_length=4 * N,
        head_count=H,
        rope_dimension_count=config.rotary_dim,
    )
    return out, meta


def _falcon(state, config):
    """FalconModel.modify_tensors: the per-group fused QKV rewritten as ``[q | k | v]``."""
    kv, d = config.num_kv_heads, N // H
    out = {
        "token_embd.weight": state["transformer.word_embeddings.weight"],
        "output.weight": state["lm_head.weight"]
        if "lm_head.weight" in state
        else state["transformer.word_embeddings.weight"],
        "output_norm.weight": state["transformer.ln_f.weight"],
    }
    for l in range(L):
        p = f"transformer.h.{l}."
        qkv = state[p + "self_attention.query_key_value.weight"].reshape(kv, H // kv + 2, d, d * H)
        fused = np.concatenate(
            [
                qkv[:, :-2].reshape(H * d, d * H),
                qkv[:, [-2]].reshape(kv * d, d * H),
                qkv[:, [-1]].reshape(kv * d, d * H),
            ]
        )
        out.update(
            {
                f"blk.{l}.attn_qkv.weight": fused,
                f"blk.{l}.attn_output.weight": state[p + "self_attention.dense.weight"],
                f"blk.{l}.ffn_up.weight": state[p + "mlp.dense_h_to_4h.weight"],
                f"blk.{l}.ffn_down.weight": state[p + "mlp.dense_4h_to_h.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "ln_attn.weight"],
                f"blk.{l}.attn_norm_2.weight": state[p + "ln_mlp.weight"],
            }
        )
    meta = dict(context_length=2048, embedding_length=N, feed_forward_length=4 * N, head_count=H, head_count_kv=kv)
    return out, meta


def _bloom(state, config):
    """BloomModel.modify_tensors: the per-head fused QKV rewritten as ``[q | k | v]``."""
    d = N // H
    out = {
        "token_embd.weight": state["transformer.word_embeddings.weight"],
        "token_embd_norm.weight": state["transformer.word_embeddings_layernorm.weight"],
        "output_norm.weight": state["transformer.ln_f.weight"],
        "output.weight": state["transformer.word_embeddings.weight"],
    }
    for l in range(L):
        p = f"transformer.h.{l}."
        qkv = state[p + "self_attention.query_key_value.weight"].reshape(H, 3, d, N)
        out.update(
            {
                f"blk.{l}.attn_qkv.weight": np.concatenate([qkv[:, i].reshape(-1, N) for i in range(3)]),
                f"blk.{l}.attn_output.weight": state[p + "self_attention.dense.weight"],
                f"blk.{l}.ffn_up.weight": state[p + "mlp.dense_h_to_4h.weight"],
                f"blk.{l}.ffn_down.weight": state[p + "mlp.dense_4h_to_h.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "input_layernorm.weight"],
                f"blk.{l}.ffn_norm.weight": state[p + "post_attention_layernorm.weight"],
            }
        )
    meta = dict(context_length=N, embedding_length=N, feed_forward_length=4 * N, head_count=H, head_count_kv=H)
    return out, meta


def _qwen2moe(state, config):
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output.weight": state["lm_head.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    for l in range(L):
        p = f"model.layers.{l}."
        out.update({f"blk.{l}.attn_{r}.weight": state[p + f"self_attn.{r}_proj.weight"] for r in "qkv"})
        out.update(
            {
                f"blk.{l}.attn_output.weight": state[p + "self_attn.o_proj.weight"],
                f"blk.{l}.ffn_gate_inp.weight": state[p + "mlp.gate.weight"],
                f"blk.{l}.ffn_gate_inp_shexp.weight": state[p + "mlp.shared_expert_gate.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "input_layernorm.weight"],
                f"blk.{l}.ffn_norm.weight": state[p + "post_attention_layernorm.weight"],
            }
        )
        out.update(
            {
                f"blk.{l}.ffn_{r}_shexp.weight": state[p + f"mlp.shared_expert.{r}_proj.weight"]
                for r in ("gate", "up", "down")
            }
        )
        banks = _stack(
            state, p + "mlp", {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}, config.num_experts
        )
        out.update({f"blk.{l}.ffn_{r}_exps.weight": bank for r, bank in banks.items()})
    meta = dict(
        context_length=config.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=config.intermediate_size,
        head_count=H,
        head_count_kv=config.num_key_value_heads,
        rope_freq_base=config.rope_parameters["rope_theta"],
        expert_count=config.num_experts,
        expert_used_count=config.num_experts_per_tok,
        expert_feed_forward_length=config.moe_intermediate_size,
        expert_shared_feed_forward_length=config.shared_expert_intermediate_size,
    )
    return out, meta


def _qwen3moe(state, config):
    """Qwen3MoeModel: Qwen2MoeModel's names and expert merge, and the query/key norms."""
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output.weight": state["lm_head.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    for l in range(L):
        p = f"model.layers.{l}."
        out.update({f"blk.{l}.attn_{r}.weight": state[p + f"self_attn.{r}_proj.weight"] for r in "qkv"})
        out.update(
            {
                f"blk.{l}.attn_output.weight": state[p + "self_attn.o_proj.weight"],
                f"blk.{l}.attn_q_norm.weight": state[p + "self_attn.q_norm.weight"],
                f"blk.{l}.attn_k_norm.weight": state[p + "self_attn.k_norm.weight"],
                f"blk.{l}.ffn_gate_inp.weight": state[p + "mlp.gate.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "input_layernorm.weight"],
                f"blk.{l}.ffn_norm.weight": state[p + "post_attention_layernorm.weight"],
            }
        )
        banks = _stack(
            state, p + "mlp", {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}, config.num_experts
        )
        out.update({f"blk.{l}.ffn_{r}_exps.weight": bank for r, bank in banks.items()})
    meta = dict(
        context_length=config.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=config.intermediate_size,
        head_count=H,
        head_count_kv=config.num_key_value_heads,
        key_length=config.head_dim,
        value_length=config.head_dim,
        layer_norm_rms_eps=config.rms_norm_eps,
        rope_freq_base=config.rope_parameters["rope_theta"],
        expert_count=config.num_experts,
        expert_used_count=config.num_experts_per_tok,
        expert_feed_forward_length=config.moe_intermediate_size,
    )
    return out, meta


def _mixtral(state, config):
    kv = config.num_key_value_heads
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output.weight": state["lm_head.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    for l in range(L):
        p = f"model.layers.{l}."
        out.update(
            {
                f"blk.{l}.attn_q.weight": permute(state[p + "self_attn.q_proj.weight"], H, H),
                f"blk.{l}.attn_k.weight": permute(state[p + "self_attn.k_proj.weight"], H, kv),
                f"blk.{l}.attn_v.weight": state[p + "self_attn.v_proj.weight"],
                f"blk.{l}.attn_output.weight": state[p + "self_attn.o_proj.weight"],
                f"blk.{l}.ffn_gate_inp.weight": state[p + "block_sparse_moe.gate.weight"],
                f"blk.{l}.attn_norm.weight": state[p + "input_layernorm.weight"],
                f"blk.{l}.ffn_norm.weight": state[p + "post_attention_layernorm.weight"],
            }
        )
        banks = _stack(
            state, p + "block_sparse_moe", {"w1": "gate", "w3": "up", "w2": "down"}, config.num_local_experts
        )
        out.update({f"blk.{l}.ffn_{r}_exps.weight": bank for r, bank in banks.items()})
    meta = dict(
        context_length=config.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=config.intermediate_size,
        head_count=H,
        head_count_kv=kv,
        rope_freq_base=config.rope_parameters["rope_theta"],
        rope_dimension_count=N // H,
        expert_count=config.num_local_experts,
        expert_used_count=config.num_experts_per_tok,
    )
    return out, meta


def _gpt_oss(state, config):
    """GptOssModel: the experts' banks transposed to (E, out, in), gate_up_proj's interleaved columns
    split into the gate (even) and up (odd) banks, the sinks as attn_sinks, biases kept."""
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output.weight": state["lm_head.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    for l in range(L):
        p = f"model.layers.{l}."
        out.update(
            {f"blk.{l}.attn_{r}.{w}": state[p + f"self_attn.{r}_proj.{w}"] for r in "qkv" for w in ("weight", "bias")}
        )
        gate_up = state[p + "mlp.experts.gate_up_proj"]  # (E, in, 2 d_ff), gate and up interleaved
        out.update(
            {
                f"blk.{l}.attn_output.weight": state[p + "self_attn.o_proj.weight"],
                f"blk.{l}.attn_output.bias": state[p + "self_attn.o_proj.bias"],
                f"blk.{l}.attn_sinks.weight": state[p + "self_attn.sinks"],
                f"blk.{l}.ffn_gate_inp.weight": state[p + "mlp.router.weight"],
                f"blk.{l}.ffn_gate_inp.bias": state[p + "mlp.router.bias"],
                f"blk.{l}.ffn_gate_exps.weight": gate_up[:, :, ::2].transpose(0, 2, 1),
                f"blk.{l}.ffn_up_exps.weight": gate_up[:, :, 1::2].transpose(0, 2, 1),
                f"blk.{l}.ffn_down_exps.weight": state[p + "mlp.experts.down_proj"].transpose(0, 2, 1),
                f"blk.{l}.ffn_gate_exps.bias": state[p + "mlp.experts.gate_up_proj_bias"][:, ::2],
                f"blk.{l}.ffn_up_exps.bias": state[p + "mlp.experts.gate_up_proj_bias"][:, 1::2],
                f"blk.{l}.ffn_down_exps.bias": state[p + "mlp.experts.down_proj_bias"],
                f"blk.{l}.attn_norm.weight": state[p + "input_layernorm.weight"],
                f"blk.{l}.post_attention_norm.weight": state[p + "post_attention_layernorm.weight"],
            }
        )
    meta = dict(
        context_length=config.max_position_embeddings,
        embedding_length=N,
        feed_forward_length=config.intermediate_size,
        head_count=H,
        head_count_kv=config.num_key_value_heads,
        key_length=config.head_dim,
        value_length=config.head_dim,
        rope_freq_base=config.rope_parameters["rope_theta"],
        expert_count=config.num_local_experts,
        expert_used_count=config.num_experts_per_tok,
        expert_feed_forward_length=config.intermediate_size,
        sliding_window=config.sliding_window,
    )
    return out, meta


def _moe_kwargs():
    return dict(num_experts_per_tok=2, max_position_embeddings=32, vocab_size=64)


# name -> (GGUF architecture, Hugging Face model, converter)
MODELS = {
    "phi2": (
        "phi2",
        lambda: T.PhiForCausalLM(
            T.PhiConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                intermediate_size=4 * N,
                vocab_size=64,
                max_position_embeddings=32,
            )
        ),
        _phi2,
    ),
    "phi3": (
        "phi3",
        lambda: T.Phi3ForCausalLM(
            T.Phi3Config(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=48,
                vocab_size=64,
                pad_token_id=0,
                max_position_embeddings=32,
                original_max_position_embeddings=32,
                partial_rotary_factor=0.75,
            )
        ),
        _phi3,
    ),
    # LongRoPE (factor sets of float32-exact numbers, as the converter stores them in float32)
    "phi3_longrope": (
        "phi3",
        lambda: T.Phi3ForCausalLM(
            T.Phi3Config(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=48,
                vocab_size=64,
                pad_token_id=0,
                max_position_embeddings=64,
                original_max_position_embeddings=16,
                rope_scaling={
                    "rope_type": "longrope",
                    "long_factor": [1.0, 1.5, 2.0, 4.0],
                    "short_factor": [1.0, 1.0, 1.25, 1.5],
                },
            )
        ),
        _phi3,
    ),
    "gptj": (
        "gptj",
        lambda: T.GPTJForCausalLM(
            T.GPTJConfig(n_embd=N, n_layer=L, n_head=H, rotary_dim=4, vocab_size=64, n_positions=32)
        ),
        _gptj,
    ),
    "falcon": (
        "falcon",
        lambda: T.FalconForCausalLM(
            T.FalconConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_kv_heads=2,
                new_decoder_architecture=True,
                vocab_size=64,
                max_position_embeddings=2048,
            )
        ),
        _falcon,
    ),
    "bloom": (
        "bloom",
        lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=N, n_layer=L, n_head=H, vocab_size=64)),
        _bloom,
    ),
    "qwen2moe": (
        "qwen2moe",
        lambda: T.Qwen2MoeForCausalLM(
            T.Qwen2MoeConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=48,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
                num_experts=3,
                **_moe_kwargs(),
            )
        ),
        _qwen2moe,
    ),
    # GGUF metadata holds floats as float32, read back as the shortest decimal that rounds to it, so a
    # decimal epsilon (1e-5) is the config's number again and so is the query/key norms' factor
    "qwen3moe": (
        "qwen3moe",
        lambda: T.Qwen3MoeForCausalLM(
            T.Qwen3MoeConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=48,
                moe_intermediate_size=32,
                num_experts=3,
                rms_norm_eps=1e-5,
                **_moe_kwargs(),
            )
        ),
        _qwen3moe,
    ),
    # the rope without YaRN here: the reader's YaRN is transformers' default one (truncated correction range,
    # as llama.cpp computes it), not gpt-oss's truncate: false
    "gpt_oss": (
        "gpt-oss",
        lambda: T.GptOssForCausalLM(
            T.GptOssConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                head_dim=8,
                intermediate_size=16,
                num_local_experts=3,
                sliding_window=8,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                **_moe_kwargs(),
            )
        ),
        _gpt_oss,
    ),
    "mixtral": (
        "llama",
        lambda: T.MixtralForCausalLM(
            T.MixtralConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=32,
                num_local_experts=3,
                **_moe_kwargs(),
            )
        ),
        _mixtral,
    ),
}
# GELU variants: the class's (erf or gelu_new) and llama.cpp's tanh GELU have the same L_phi
RENAMED_ACTIVATION = {"phi2", "gptj", "falcon"}


def write_gguf(path, arch, tensors, meta, types=None):
    """The GGUFWriter calls convert_hf_to_gguf.py makes for these keys and tensors; ``types``: GGUF
    name -> GGMLQuantizationType for tensors stored quantized."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(L)
    for key, value in meta.items():
        getattr(writer, f"add_{key}")(value)
    writer.add_token_list([f"t{i}" for i in range(64)])
    for name, array in tensors.items():
        qtype = (types or {}).get(name)
        if qtype is None:
            writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
        else:
            writer.add_tensor(
                name, gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype), raw_dtype=qtype
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module", params=sorted(MODELS))
def converted(request, tmp_path_factory):
    """``(name, Hugging Face folder, GGUF file)``."""

    arch, build, convert = MODELS[request.param]
    torch.manual_seed(7)
    model = build().eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    root = tmp_path_factory.mktemp(request.param)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(root / "hf")
    state = load_file(str(root / "hf" / "model.safetensors"))  # the saved names, as the converter reads them
    tensors, meta = convert(state, model.config)
    return request.param, root / "hf", write_gguf(root / "model.gguf", arch, tensors, meta)


def test_every_matrix_equals_the_hugging_face_checkpoints(converted):
    name, folder, path = converted
    a, b = open_model(folder), open_model(path)
    assert a.dims.moe == b.dims.moe and a.dims.block == b.dims.block and a.dims.alibi == b.dims.alibi
    assert (a.dims.L, a.dims.N, a.dims.H, a.dims.H_kv, a.dims.d_head, a.dims.d_ff) == (
        b.dims.L,
        b.dims.N,
        b.dims.H,
        b.dims.H_kv,
        b.dims.d_head,
        b.dims.d_ff,
    )
    assert a.rotary == b.rotary
    assert_same_layer_weights(a, b, L)


def test_the_analysis_equals_the_hugging_face_checkpoints(converted):
    name, folder, path = converted
    hf, ours = (
        numbers(specbound.analyze(folder, threads=1), family=False),
        numbers(specbound.analyze(path, threads=1), family=False),
    )
    if "experts" in hf["model"]:  # the router's and the shared gate's tensor names: provenance, like "tensors"
        for key in ("router", "shared_gate"):
            assert (hf["model"]["experts"].pop(key) is None) == (ours["model"]["experts"].pop(key) is None)
    if name in RENAMED_ACTIVATION:  # the same L_phi under llama.cpp's name for the GELU it computes
        assert ours["options"]["l_phi"] == hf["options"]["l_phi"] == 1.13
        named = hf["model"].pop("activation")
        assert ours["model"].pop("activation") == "gelu_pytorch_tanh" and named
        ours["options"].pop("l_phi_source"), hf["options"].pop("l_phi_source")
        for entry in hf["assumptions"]:  # the entries that name the activation: by llama.cpp's name
            entry["effect"] = entry["effect"].replace(f"hidden_act={named} ", "hidden_act=gelu_pytorch_tanh ")
    assert_close_tree(hf, ours, 1e-9)


def test_a_quantized_expert_bank_is_read_one_expert_at_a_time(tmp_path):
    """A Q8_0 bank: expert e's slice dequantizes to the rows of the whole bank dequantized at once
    (the oracle: gguf's own dequantize of the stored bytes)."""

    _, build, convert = MODELS["qwen2moe"]
    torch.manual_seed(3)
    model = build().eval()
    model.save_pretrained(tmp_path / "hf")
    tensors, meta = convert(load_file(str(tmp_path / "hf" / "model.safetensors")), model.config)
    Q = gguf.GGMLQuantizationType
    types = {n: Q.Q8_0 for n in tensors if n.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight"))}
    path = write_gguf(tmp_path / "q8.gguf", "qwen2moe", tensors, meta, types)
    opened = open_model(path)
    reader = gguf.GGUFReader(str(path))
    bank = next(t for t in reader.tensors if t.name == "blk.1.ffn_up_exps.weight")
    whole = gguf.quants.dequantize(np.asarray(bank.data), bank.tensor_type).reshape(3, 32, N)
    assert np.abs(whole - tensors["blk.1.ffn_up_exps.weight"]).max() > 1e-5  # really quantized
    for e in range(3):
        np.testing.assert_array_equal(opened.ckpt.read(f"blk.1.ffn_up_exps.weight[{e}]"), whole[e])
    assert opened.ckpt.shape("blk.1.ffn_up_exps.weight[2]") == (32, N)
    assert opened.ckpt.quantized["blk.1.ffn_up_exps.weight[2]"] == "Q8_0"
    assert "expert 2 of GGUF tensor 'blk.1.ffn_up_exps.weight'" in opened.ckpt.where("blk.1.ffn_up_exps.weight[2]")
    assert "blk.1.ffn_up_exps.weight" not in opened.ckpt.names
    result = specbound.analyze(path, threads=1)
    assert any(a["name"] == "quantized_weights" and a["applies"] for a in result.assumptions)
    assert result.matrices.set_index("role").loc["FF_up[e2]", "tensors"].iloc[1] == "blk.1.ffn_up_exps.weight[2]"
