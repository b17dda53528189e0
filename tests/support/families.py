"""A tiny random ``transformers`` model of every shipped family, and a dense reference of its matrices
built by *calling the model's own modules* on identity inputs (tests/archs/test_families.py).

``FAMILIES[name] = (build, accessor)``: ``build(layers)`` returns the untrained model with ``layers``
blocks (ALBERT: always 4 depths over 2 stored groups); ``accessor(model)`` returns ``get(layer)``, the
layer's row-oriented float64 matrices by role.  torch and transformers are imported when a model is
built.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
from safetensors.numpy import load_file, save_file

from support.vision_language import VISION, WRAPPERS

N, L, H, D_FF = 32, 2, 4, 48
# the families with rotary position embeddings
ROTARY = (
    "llama",
    "mistral",
    "qwen2",
    "gpt_neox",
    "phi",
    "phi3",
    "gptj",
    "falcon",
    "falcon_new",
    "mixtral",
    "qwen2_moe",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo2",
    "qwen3_moe",
    "modernbert",
    "glm4_moe",
    "ernie4_5_moe",
)
# test variants -> the shipped family that reads them
FAMILY_OF = {
    "mistral": "llama",
    "qwen2": "llama",
    "falcon_alibi": "falcon",
    "falcon_new": "falcon",
    "hubert": "wav2vec2",
    "dinov2_swiglu": "dinov2",
}
MOE_EXPERTS, MOE_TOP_K, MOE_D_FF, SHARED_D_FF = 4, 2, 24, 40


def _proj(module, n_in):
    """Row-oriented matrix of a linear-like module: module(I) - module(0), float64."""
    import torch

    with torch.no_grad():
        eye = torch.eye(n_in, dtype=torch.float64)
        out = module(eye) - module(torch.zeros(1, n_in, dtype=torch.float64))
    return out.double().numpy()


def _split_concat(w):
    return np.split(w, 3, axis=1)


def _split_neox(w, heads):
    d = w.shape[1] // (3 * heads)
    v = w.reshape(w.shape[0], heads, 3 * d)  # GPTNeoXAttention: qkv.view(..., H, 3 d)
    return [v[:, :, i * d : (i + 1) * d].reshape(w.shape[0], heads * d) for i in range(3)]


def _bert_like(attn_self, attn_out, ff_in, ff_out, names=("query", "key", "value")):
    def get(layer):
        a = attn_self(layer)
        q, k, v = (getattr(a, n) for n in names)
        return {
            "q": _proj(q, N),
            "k": _proj(k, N),
            "v": _proj(v, N),
            "o": _proj(attn_out(layer), N),
            "FF_in": _proj(ff_in(layer), N),
            "FF_out": _proj(ff_out(layer), D_FF),
        }

    return get


def _t():
    import transformers

    return transformers


FAMILIES = {
    "bert": (
        lambda layers: _t().BertForSequenceClassification(
            _t().BertConfig(
                hidden_size=N, num_hidden_layers=layers, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
            )
        ),
        lambda m: _bert_like(
            lambda l: m.bert.encoder.layer[l].attention.self,
            lambda l: m.bert.encoder.layer[l].attention.output.dense,
            lambda l: m.bert.encoder.layer[l].intermediate.dense,
            lambda l: m.bert.encoder.layer[l].output.dense,
        ),
    ),
    "electra": (
        lambda layers: _t().ElectraForPreTraining(
            _t().ElectraConfig(
                embedding_size=16,
                hidden_size=N,
                num_hidden_layers=layers,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=50,
            )
        ),
        lambda m: _bert_like(
            lambda l: m.electra.encoder.layer[l].attention.self,
            lambda l: m.electra.encoder.layer[l].attention.output.dense,
            lambda l: m.electra.encoder.layer[l].intermediate.dense,
            lambda l: m.electra.encoder.layer[l].output.dense,
        ),
    ),
    "vit": (
        lambda layers: _t().ViTForImageClassification(
            _t().ViTConfig(
                hidden_size=N,
                num_hidden_layers=layers,
                num_attention_heads=H,
                intermediate_size=D_FF,
                image_size=8,
                patch_size=4,
                num_labels=3,
            )
        ),
        # transformers 5 names ViT's modules layers.N.attention.q_proj, mlp.fc1 but saves the classic
        # checkpoint names (encoder.layer.N.attention.attention.query), which the spec maps.
        lambda m: (
            lambda l, b=m.vit.layers: {
                "q": _proj(b[l].attention.q_proj, N),
                "k": _proj(b[l].attention.k_proj, N),
                "v": _proj(b[l].attention.v_proj, N),
                "o": _proj(b[l].attention.o_proj, N),
                "FF_in": _proj(b[l].mlp.fc1, N),
                "FF_out": _proj(b[l].mlp.fc2, D_FF),
            }
        ),
    ),
    "distilbert": (
        lambda layers: _t().DistilBertForSequenceClassification(
            _t().DistilBertConfig(dim=N, n_layers=layers, n_heads=H, hidden_dim=D_FF, vocab_size=50)
        ),
        lambda m: (
            lambda l, b=m.distilbert.transformer.layer: {
                "q": _proj(b[l].attention.q_lin, N),
                "k": _proj(b[l].attention.k_lin, N),
                "v": _proj(b[l].attention.v_lin, N),
                "o": _proj(b[l].attention.out_lin, N),
                "FF_in": _proj(b[l].ffn.lin1, N),
                "FF_out": _proj(b[l].ffn.lin2, D_FF),
            }
        ),
    ),
    "gpt2": (
        lambda layers: _t().GPT2LMHeadModel(
            _t().GPT2Config(n_embd=N, n_layer=layers, n_head=H, n_inner=None, vocab_size=50, n_positions=16)
        ),
        lambda m: (
            lambda l, b=m.transformer.h: dict(
                zip("qkv", _split_concat(_proj(b[l].attn.c_attn, N))),
                o=_proj(b[l].attn.c_proj, N),
                FF_in=_proj(b[l].mlp.c_fc, N),
                FF_out=_proj(b[l].mlp.c_proj, 4 * N),
            )
        ),
    ),
    "gpt_neox": (
        lambda layers: _t().GPTNeoXForCausalLM(
            _t().GPTNeoXConfig(
                hidden_size=N, num_hidden_layers=layers, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
            )
        ),
        lambda m: (
            lambda l, b=m.gpt_neox.layers: dict(
                zip("qkv", _split_neox(_proj(b[l].attention.query_key_value, N), H)),
                o=_proj(b[l].attention.dense, N),
                FF_in=_proj(b[l].mlp.dense_h_to_4h, N),
                FF_out=_proj(b[l].mlp.dense_4h_to_h, D_FF),
            )
        ),
    ),
    "opt": (
        lambda layers: _t().OPTForCausalLM(
            _t().OPTConfig(
                hidden_size=N,
                num_hidden_layers=layers,
                num_attention_heads=H,
                ffn_dim=D_FF,
                word_embed_proj_dim=N,
                vocab_size=50,
                max_position_embeddings=16,
            )
        ),
        lambda m: (
            lambda l, b=m.model.decoder.layers: {
                "q": _proj(b[l].self_attn.q_proj, N),
                "k": _proj(b[l].self_attn.k_proj, N),
                "v": _proj(b[l].self_attn.v_proj, N),
                "o": _proj(b[l].self_attn.out_proj, N),
                "FF_in": _proj(b[l].fc1, N),
                "FF_out": _proj(b[l].fc2, D_FF),
            }
        ),
    ),
    # 4 depths over 2 stored groups whatever the depth asked: depths 0, 1 use group 0 and 2, 3 group 1
    "albert": (
        lambda layers: _t().AlbertForSequenceClassification(
            _t().AlbertConfig(
                embedding_size=16,
                hidden_size=N,
                num_hidden_layers=4,
                num_hidden_groups=2,
                num_attention_heads=H,
                intermediate_size=D_FF,
                vocab_size=50,
                num_labels=2,
            )
        ),
        lambda m: (
            lambda l, g=m.albert.encoder.albert_layer_groups: (
                lambda a: {
                    "q": _proj(a.attention.query, N),
                    "k": _proj(a.attention.key, N),
                    "v": _proj(a.attention.value, N),
                    "o": _proj(a.attention.dense, N),
                    "FF_in": _proj(a.ffn, N),
                    "FF_out": _proj(a.ffn_output, D_FF),
                }
            )(g[l * 2 // 4].albert_layers[0])
        ),
    ),
}
for _name, _cls, _cfg in (
    ("llama", "LlamaForCausalLM", "LlamaConfig"),
    ("mistral", "MistralForCausalLM", "MistralConfig"),
    ("qwen2", "Qwen2ForCausalLM", "Qwen2Config"),
):
    FAMILIES[_name] = (
        lambda layers, c=_cls, g=_cfg: getattr(_t(), c)(
            getattr(_t(), g)(
                hidden_size=N,
                num_hidden_layers=layers,
                num_attention_heads=H,
                num_key_value_heads=2,
                intermediate_size=D_FF,
                vocab_size=50,
            )
        ),
        lambda m: (
            lambda l, b=m.model.layers: {
                "q": _proj(b[l].self_attn.q_proj, N),
                "k": _proj(b[l].self_attn.k_proj, N),
                "v": _proj(b[l].self_attn.v_proj, N),
                "o": _proj(b[l].self_attn.o_proj, N),
                "FF_gate": _proj(b[l].mlp.gate_proj, N),
                "FF_up": _proj(b[l].mlp.up_proj, N),
                "FF_out": _proj(b[l].mlp.down_proj, D_FF),
            }
        ),
    )


def _then(first, second):
    """``second(first(x))``: a matrix followed by an elementwise scale (LayerScale)."""
    return lambda x: second(first(x))


FAMILIES["mpnet"] = (
    lambda layers: _t().MPNetForMaskedLM(
        _t().MPNetConfig(
            hidden_size=N, num_hidden_layers=layers, num_attention_heads=H, intermediate_size=D_FF, vocab_size=50
        )
    ),
    lambda m: (
        lambda l, b=m.mpnet.encoder.layer: {
            "q": _proj(b[l].attention.attn.q, N),
            "k": _proj(b[l].attention.attn.k, N),
            "v": _proj(b[l].attention.attn.v, N),
            "o": _proj(b[l].attention.attn.o, N),
            "FF_in": _proj(b[l].intermediate.dense, N),
            "FF_out": _proj(b[l].output.dense, D_FF),
        }
    ),
)
# DINOv2: the OV and FF_out references are the module's matrix followed by its own LayerScale
FAMILIES["dinov2"] = (
    lambda layers: _t().Dinov2Model(
        _t().Dinov2Config(
            hidden_size=N, num_hidden_layers=layers, num_attention_heads=H, mlp_ratio=2, image_size=8, patch_size=4
        )
    ),
    lambda m: (
        lambda l, b=m.encoder.layer: {
            "q": _proj(b[l].attention.q_proj, N),
            "k": _proj(b[l].attention.k_proj, N),
            "v": _proj(b[l].attention.v_proj, N),
            "o": _proj(_then(b[l].attention.o_proj, b[l].layer_scale1), N),
            "FF_in": _proj(b[l].mlp.fc1, N),
            "FF_out": _proj(_then(b[l].mlp.fc2, b[l].layer_scale2), 2 * N),
        }
    ),
)
FAMILIES["dinov2_swiglu"] = (  # weights_in holds [gate | up]; transformers 5 splits it into gate_proj, up_proj
    lambda layers: _t().Dinov2Model(
        _t().Dinov2Config(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            mlp_ratio=2,
            image_size=8,
            patch_size=4,
            use_swiglu_ffn=True,
        )
    ),
    lambda m: (
        lambda l, b=m.encoder.layer: {
            "q": _proj(b[l].attention.q_proj, N),
            "k": _proj(b[l].attention.k_proj, N),
            "v": _proj(b[l].attention.v_proj, N),
            "o": _proj(_then(b[l].attention.o_proj, b[l].layer_scale1), N),
            "FF_gate": _proj(b[l].mlp.gate_proj, N),
            "FF_up": _proj(b[l].mlp.up_proj, N),
            "FF_out": _proj(_then(b[l].mlp.down_proj, b[l].layer_scale2), b[l].mlp.down_proj.in_features),
        }
    ),
)
_AUDIO = dict(
    hidden_size=N,
    num_attention_heads=H,
    intermediate_size=D_FF,
    conv_dim=(8, 8),
    conv_stride=(2, 2),
    conv_kernel=(3, 3),
    num_conv_pos_embeddings=4,
    num_conv_pos_embedding_groups=2,
    vocab_size=20,
)
for _name, _cls, _cfg, _base in (
    ("wav2vec2", "Wav2Vec2ForCTC", "Wav2Vec2Config", "wav2vec2"),
    ("hubert", "HubertModel", "HubertConfig", None),
):
    FAMILIES[_name] = (
        lambda layers, c=_cls, g=_cfg: getattr(_t(), c)(getattr(_t(), g)(**_AUDIO, num_hidden_layers=layers)),
        lambda m, base=_base: (
            lambda l, b=(getattr(m, base) if base else m).encoder.layers: {
                "q": _proj(b[l].attention.q_proj, N),
                "k": _proj(b[l].attention.k_proj, N),
                "v": _proj(b[l].attention.v_proj, N),
                "o": _proj(b[l].attention.out_proj, N),
                "FF_in": _proj(b[l].feed_forward.intermediate_dense, N),
                "FF_out": _proj(b[l].feed_forward.output_dense, D_FF),
            }
        ),
    )
# ModernBERT: layer 0 global, 1 and 2 local, every third global again (each type its own rotary
# base); Wi = [gate | up]
FAMILIES["modernbert"] = (
    lambda layers: _t().ModernBertForMaskedLM(
        _t().ModernBertConfig(
            hidden_size=N,
            num_hidden_layers=layers,
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
    lambda m: (
        lambda l, b=m.model.layers: dict(
            zip("qkv", _split_concat(_proj(b[l].attn.Wqkv, N))),
            o=_proj(b[l].attn.Wo, N),
            **dict(zip(("FF_gate", "FF_up"), np.split(_proj(b[l].mlp.Wi, N), 2, axis=1))),
            FF_out=_proj(b[l].mlp.Wo, D_FF),
        )
    ),
)
FAMILIES["deberta_v2"] = (
    lambda layers: _t().DebertaV2ForSequenceClassification(
        _t().DebertaV2Config(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            intermediate_size=D_FF,
            vocab_size=50,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8,
            max_relative_positions=16,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
        )
    ),
    lambda m: _bert_like(
        lambda l: m.deberta.encoder.layer[l].attention.self,
        lambda l: m.deberta.encoder.layer[l].attention.output.dense,
        lambda l: m.deberta.encoder.layer[l].intermediate.dense,
        lambda l: m.deberta.encoder.layer[l].output.dense,
        names=("query_proj", "key_proj", "value_proj"),
    ),
)


def _phi3(m):
    def get(layer):
        b = m.model.layers[layer]
        qkv = _proj(b.self_attn.qkv_proj, N)  # Phi3Attention: [q | k | v], q of H heads, k and v of H_kv heads
        d = b.self_attn.head_dim
        q, k, v = np.split(qkv, [H * d, (H + m.config.num_key_value_heads) * d], axis=1)
        gate, up = np.split(_proj(b.mlp.gate_up_proj, N), 2, axis=1)  # Phi3MLP: gate, up = chunk(2)
        return {
            "q": q,
            "k": k,
            "v": v,
            "o": _proj(b.self_attn.o_proj, N),
            "FF_gate": gate,
            "FF_up": up,
            "FF_out": _proj(b.mlp.down_proj, D_FF),
        }

    return get


def _falcon(m):
    """q, k, v through FalconAttention's own ``_split_heads`` of the fused weight's output."""
    import torch

    def get(layer):
        b = m.transformer.h[layer]
        attn = b.self_attention
        with torch.no_grad():
            fused = torch.tensor(_proj(attn.query_key_value, N))[None]  # (1, N inputs, fused width)
            q, k, v = attn._split_heads(fused)  # (1, N, heads, d_h)
        if m.config.new_decoder_architecture:  # keys and values come broadcast to every query head
            kv = m.config.num_kv_heads
            k, v = k[:, :, :: H // kv], v[:, :, :: H // kv]
        flat = lambda t: t[0].reshape(N, -1).numpy()  # noqa: E731
        return {
            "q": flat(q),
            "k": flat(k),
            "v": flat(v),
            "o": _proj(attn.dense, N),
            "FF_in": _proj(b.mlp.dense_h_to_4h, N),
            "FF_out": _proj(b.mlp.dense_4h_to_h, 4 * N),
        }

    return get


def _bloom(m):
    """q, k, v through BloomAttention's own ``_reshape`` of the fused weight's output."""
    import torch

    def get(layer):
        b = m.transformer.h[layer]
        with torch.no_grad():
            q, k, v = b.self_attention._reshape(torch.tensor(_proj(b.self_attention.query_key_value, N))[None])
        flat = lambda t: t[0].transpose(0, 1).reshape(N, -1).numpy()  # (1, H, N, d) -> (N, H d)  # noqa: E731
        return {
            "q": flat(q),
            "k": flat(k),
            "v": flat(v),
            "o": _proj(b.self_attention.dense, N),
            "FF_in": _proj(b.mlp.dense_h_to_4h, N),
            "FF_out": _proj(b.mlp.dense_4h_to_h, 4 * N),
        }

    return get


def expert_matrices(experts, e, d_ff):
    """Expert ``e``'s gate, up and down matrices, row-oriented, as the experts module's forward computes
    them (``linear(x, gate_up_proj[e]).chunk(2)``, ``linear(h, down_proj[e])``)."""
    import torch

    with torch.no_grad():
        eye = torch.eye(N, dtype=torch.float64)
        gate, up = torch.nn.functional.linear(eye, experts.gate_up_proj[e]).chunk(2, dim=-1)
        down = torch.nn.functional.linear(torch.eye(d_ff, dtype=torch.float64), experts.down_proj[e])
    return gate.numpy(), up.numpy(), down.numpy()


def _moe(m, shared=False):
    def get(layer):
        b = m.model.layers[layer]
        out = {
            "q": _proj(b.self_attn.q_proj, N),
            "k": _proj(b.self_attn.k_proj, N),
            "v": _proj(b.self_attn.v_proj, N),
            "o": _proj(b.self_attn.o_proj, b.self_attn.o_proj.in_features),
        }
        out.update(_expert_rows(b.mlp, b.mlp.shared_expert if shared else None))
        return out

    return get


def _expert_rows(mlp, shared=None):
    """Every routed expert's gate, up and down matrices (:func:`expert_matrices`), then the shared expert's."""
    out = {}
    for e in range(mlp.experts.gate_up_proj.shape[0]):
        out.update(zip((f"FF_gate[e{e}]", f"FF_up[e{e}]", f"FF_out[e{e}]"), expert_matrices(mlp.experts, e, MOE_D_FF)))
    if shared is not None:
        out.update(
            {
                "FF_gate[shared]": _proj(shared.gate_proj, N),
                "FF_up[shared]": _proj(shared.up_proj, N),
                "FF_out[shared]": _proj(shared.down_proj, shared.down_proj.in_features),
            }
        )
    return out


FAMILIES.update(
    {
        "phi": (
            lambda layers: _t().PhiForCausalLM(
                _t().PhiConfig(
                    hidden_size=N,
                    num_hidden_layers=layers,
                    num_attention_heads=H,
                    intermediate_size=D_FF,
                    vocab_size=50,
                    max_position_embeddings=16,
                )
            ),  # partial_rotary_factor 0.5: 4 of each head's 8 dimensions rotate
            lambda m: (
                lambda l, b=m.model.layers: {
                    "q": _proj(b[l].self_attn.q_proj, N),
                    "k": _proj(b[l].self_attn.k_proj, N),
                    "v": _proj(b[l].self_attn.v_proj, N),
                    "o": _proj(b[l].self_attn.dense, N),
                    "FF_in": _proj(b[l].mlp.fc1, N),
                    "FF_out": _proj(b[l].mlp.fc2, D_FF),
                }
            ),
        ),
        "phi3": (
            lambda layers: _t().Phi3ForCausalLM(
                _t().Phi3Config(
                    hidden_size=N,
                    num_hidden_layers=layers,
                    num_attention_heads=H,
                    num_key_value_heads=2,
                    intermediate_size=D_FF,
                    vocab_size=50,
                    pad_token_id=0,
                    max_position_embeddings=16,
                    original_max_position_embeddings=16,
                )
            ),
            _phi3,
        ),
        "gptj": (
            lambda layers: _t().GPTJForCausalLM(
                _t().GPTJConfig(n_embd=N, n_layer=layers, n_head=H, rotary_dim=4, vocab_size=50, n_positions=16)
            ),
            lambda m: (
                lambda l, b=m.transformer.h: {
                    "q": _proj(b[l].attn.q_proj, N),
                    "k": _proj(b[l].attn.k_proj, N),
                    "v": _proj(b[l].attn.v_proj, N),
                    "o": _proj(b[l].attn.out_proj, N),
                    "FF_in": _proj(b[l].mlp.fc_in, N),
                    "FF_out": _proj(b[l].mlp.fc_out, 4 * N),
                }
            ),
        ),
        "bloom": (
            lambda layers: _t().BloomForCausalLM(
                _t().BloomConfig(hidden_size=N, n_layer=layers, n_head=H, vocab_size=50)
            ),
            _bloom,
        ),
        # Falcon-7B's layout: multi_query (one key/value head), one shared LayerNorm, parallel block, rotary
        "falcon": (
            lambda layers: _t().FalconForCausalLM(
                _t().FalconConfig(
                    hidden_size=N,
                    num_hidden_layers=layers,
                    num_attention_heads=H,
                    vocab_size=50,
                    max_position_embeddings=16,
                )
            ),
            _falcon,
        ),
        # the original layout without multi_query (a key/value head per query head), sequential, ALiBi
        "falcon_alibi": (
            lambda layers: _t().FalconForCausalLM(
                _t().FalconConfig(
                    hidden_size=N,
                    num_hidden_layers=layers,
                    num_attention_heads=H,
                    vocab_size=50,
                    multi_query=False,
                    parallel_attn=False,
                    alibi=True,
                    bias=True,
                )
            ),
            _falcon,
        ),
        # Falcon-40B's new_decoder_architecture: 2 key/value groups, a LayerNorm per branch
        "falcon_new": (
            lambda layers: _t().FalconForCausalLM(
                _t().FalconConfig(
                    hidden_size=N,
                    num_hidden_layers=layers,
                    num_attention_heads=H,
                    num_kv_heads=2,
                    vocab_size=50,
                    new_decoder_architecture=True,
                    max_position_embeddings=16,
                )
            ),
            _falcon,
        ),
        "mixtral": (
            lambda layers: _t().MixtralForCausalLM(
                _t().MixtralConfig(
                    hidden_size=N,
                    num_hidden_layers=layers,
                    num_attention_heads=H,
                    num_key_value_heads=2,
                    intermediate_size=MOE_D_FF,
                    vocab_size=50,
                    num_local_experts=MOE_EXPERTS,
                    num_experts_per_tok=MOE_TOP_K,
                    max_position_embeddings=16,
                )
            ),
            _moe,
        ),
        "qwen2_moe": (
            lambda layers: _t().Qwen2MoeForCausalLM(
                _t().Qwen2MoeConfig(
                    hidden_size=N,
                    num_hidden_layers=layers,
                    num_attention_heads=H,
                    num_key_value_heads=2,
                    intermediate_size=D_FF,
                    moe_intermediate_size=MOE_D_FF,
                    shared_expert_intermediate_size=SHARED_D_FF,
                    vocab_size=50,
                    num_experts=MOE_EXPERTS,
                    num_experts_per_tok=MOE_TOP_K,
                    max_position_embeddings=16,
                )
            ),
            lambda m: _moe(m, shared=True),
        ),
    }
)


def _norm_gain(norm, width):
    """The gain g of an RMSNorm module: ``weight`` (Qwen3, OLMo2) or ``1 + weight`` (Gemma), whichever
    calling the module confirms: nu(c e_i)_i = g_i c / sqrt(c^2 / n + eps) for the one-hot input c e_i
    of its n = width features.  The norms compute in float32, so the call decides the convention (to
    1e-5) and the parameter gives the value (Gemma's 1 + w formed in float32, as its norm does)."""
    import torch

    c = 3.0
    with torch.no_grad():
        out = norm(c * torch.eye(width, dtype=torch.float64)).double().numpy()
    called = np.diag(out) * np.sqrt(c * c / width + norm_eps(norm)) / c
    w = norm.weight.detach()
    plus_one = (1.0 + w.float()).double().numpy()
    return next(g for g in (w.double().numpy(), plus_one) if np.allclose(called, g, rtol=1e-5, atol=1e-6))


def norm_eps(norm):
    return getattr(norm, "variance_epsilon", None) or norm.eps


# The families whose queries and keys pass an RMSNorm before the rotation; the reference QK row is the
# head's stacked raw factors (docs/theory.md 3d); the gains, read by calling the norms, mark the family.
QK_NORM = {"qwen3": "head", "gemma3_text": "head", "olmo2": "all_heads", "qwen3_moe": "head", "glm4_moe": "head"}


def _decoder(cls, cfg, **extra):
    return lambda layers: getattr(_t(), cls)(
        getattr(_t(), cfg)(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            intermediate_size=D_FF,
            vocab_size=50,
            max_position_embeddings=64,
            **extra,
        )
    )


def _decoder_accessor(m, qk_norm=None, heads=H, kv=2, d=N // H):
    """A LLaMA-named decoder's matrices; with ``qk_norm`` (``"head"`` or ``"all_heads"``) also the
    query/key norm gains ``q_gain`` ``(heads d,)`` and ``k_gain`` ``(kv d,)``, read by calling the norms."""

    def get(l):
        a, mlp = m.model.layers[l].self_attn, m.model.layers[l].mlp
        out = {
            "q": _proj(a.q_proj, N),
            "k": _proj(a.k_proj, N),
            "v": _proj(a.v_proj, N),
            "o": _proj(a.o_proj, heads * d),
            "FF_gate": _proj(mlp.gate_proj, N),
            "FF_up": _proj(mlp.up_proj, N),
            "FF_out": _proj(mlp.down_proj, D_FF),
        }
        if qk_norm == "head":
            out["q_gain"] = np.tile(_norm_gain(a.q_norm, d), heads)
            out["k_gain"] = np.tile(_norm_gain(a.k_norm, d), kv)
        elif qk_norm == "all_heads":
            out["q_gain"], out["k_gain"] = _norm_gain(a.q_norm, heads * d), _norm_gain(a.k_norm, kv * d)
        return out

    return get


# head_dim 16 with N / H = 8 (Gemma's head_dim != hidden_size / heads); QK-norm per head (Qwen3,
# Gemma 3) and over the whole projection (OLMo2)
FAMILIES["qwen3"] = (
    _decoder("Qwen3ForCausalLM", "Qwen3Config", num_key_value_heads=2, head_dim=16),
    lambda m: _decoder_accessor(m, "head", d=16),
)
FAMILIES["gemma"] = (
    _decoder("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=1, head_dim=16),
    lambda m: _decoder_accessor(m, kv=1, d=16),
)
FAMILIES["gemma2"] = (
    _decoder("Gemma2ForCausalLM", "Gemma2Config", num_key_value_heads=2, head_dim=16),
    lambda m: _decoder_accessor(m, d=16),
)
FAMILIES["gemma3_text"] = (
    _decoder("Gemma3ForCausalLM", "Gemma3TextConfig", num_key_value_heads=2, head_dim=16),
    lambda m: _decoder_accessor(m, "head", d=16),
)


def _qwen3_moe(m):
    """Qwen3-MoE: the experts' matrices and the query/key gains read by calling the norms."""
    moe = _moe(m)

    def get(l):
        out = moe(l)
        a, d = m.model.layers[l].self_attn, m.config.head_dim
        out["q_gain"] = np.tile(_norm_gain(a.q_norm, d), H)
        out["k_gain"] = np.tile(_norm_gain(a.k_norm, d), m.config.num_key_value_heads)
        return out

    return get


FAMILIES["qwen3_moe"] = (
    lambda layers: _t().Qwen3MoeForCausalLM(
        _t().Qwen3MoeConfig(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_D_FF,
            num_experts=MOE_EXPERTS,
            num_experts_per_tok=MOE_TOP_K,
            vocab_size=50,
            max_position_embeddings=16,
        )
    ),
    _qwen3_moe,
)


def _dense_then_experts(m, qk_norm=False, d=N // H):
    """GLM-4-MoE, ERNIE 4.5 MoE: each layer's attention, then either its dense gated block (``mlp.gate_proj``
    ...) or its experts (through the experts module's own forward, :func:`expert_matrices`) and shared
    experts; with ``qk_norm`` the query/key gains read by calling the norms."""

    def get(l):
        a, mlp = m.layers[l].self_attn, m.layers[l].mlp
        out = (
            {}
            if getattr(a, "k_proj", None) is None
            else {  # latent attention: the caller's rows
                "q": _proj(a.q_proj, N),
                "k": _proj(a.k_proj, N),
                "v": _proj(a.v_proj, N),
                "o": _proj(a.o_proj, a.o_proj.in_features),
            }
        )
        if hasattr(mlp, "experts"):
            out.update(_expert_rows(mlp, mlp.shared_experts))
        else:
            out.update(
                {
                    "FF_gate": _proj(mlp.gate_proj, N),
                    "FF_up": _proj(mlp.up_proj, N),
                    "FF_out": _proj(mlp.down_proj, D_FF),
                }
            )
        if qk_norm:
            out["q_gain"] = np.tile(_norm_gain(a.q_norm, d), H)
            out["k_gain"] = np.tile(_norm_gain(a.k_norm, d), m.config.num_key_value_heads)
        return out

    return get


# GLM-4.5's layout: the first layer dense, then sigmoid-routed experts scaled by routed_scaling_factor
# (2.5, as DeepSeek-V3's) with group-limited top-k, a shared expert, QK-norm, attention biases, half the
# head rotating (partial_rotary_factor 0.5)
FAMILIES["glm4_moe"] = (
    lambda layers: _t().Glm4MoeForCausalLM(
        _t().Glm4MoeConfig(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_D_FF,
            n_routed_experts=MOE_EXPERTS,
            num_experts_per_tok=MOE_TOP_K,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            use_qk_norm=True,
            attention_bias=True,
            vocab_size=50,
            max_position_embeddings=64,
        )
    ),
    lambda m: _dense_then_experts(m.model, qk_norm=True, d=16),
)
# ERNIE 4.5: layer 0 dense, the others softmax-routed experts with a shared expert; interleaved rotary pairs
FAMILIES["ernie4_5_moe"] = (
    lambda layers: _t().Ernie4_5_MoeForCausalLM(
        _t().Ernie4_5_MoeConfig(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            num_key_value_heads=2,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_D_FF,
            moe_num_experts=MOE_EXPERTS,
            moe_k=MOE_TOP_K,
            moe_layer_start_index=1,
            moe_num_shared_experts=1,
            vocab_size=50,
            max_position_embeddings=64,
        )
    ),
    lambda m: _dense_then_experts(m.model),
)


def _block_diagonal(*blocks):
    rows, cols = sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)
    out, r, c = np.zeros((rows, cols)), 0, 0
    for b in blocks:
        out[r : r + b.shape[0], c : c + b.shape[1]] = b
        r, c = r + b.shape[0], c + b.shape[1]
    return out


def _latent(m, base=lambda m: m.model):
    """DeepSeek-V3's multi-head latent attention: each head's QK and OV rows as the dense block-diagonal
    matrices of docs/theory.md 3l, every block from calling the model's own projections on identity inputs
    (``q_a_proj``, ``kv_a_proj_with_mqa``, ``q_b_proj``, ``kv_b_proj``, ``o_proj``); the feed-forward blocks as
    GLM-4-MoE's."""
    ff = _dense_then_experts(base(m))

    def get(l):
        a, c = base(m).layers[l].self_attn, base(m).config
        nope, rope, dv, rq, rk = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.q_lora_rank, c.kv_lora_rank
        q_a, kv_a = _proj(a.q_a_proj, N), _proj(a.kv_a_proj_with_mqa, N)  # (N, r_q), (N, r_kv + d_rope)
        q_b, kv_b, o = _proj(a.q_b_proj, rq), _proj(a.kv_b_proj, rk), _proj(a.o_proj, H * dv)
        dq, dkv = nope + rope, nope + dv
        qk_rows, ov_rows = [], []
        for h in range(H):
            b_n, b_r = q_b[:, h * dq : h * dq + nope], q_b[:, h * dq + nope : (h + 1) * dq]  # (r_q, .)
            c_n, c_v = kv_b[:, h * dkv : h * dkv + nope], kv_b[:, h * dkv + nope : (h + 1) * dkv]  # (r_kv, .)
            qk_rows.append(_block_diagonal(q_a, kv_a, b_n @ c_n.T, b_r))
            ov_rows.append(_block_diagonal(kv_a[:, :rk], c_v @ o[h * dv : (h + 1) * dv]))
        return {"qk_rows": qk_rows, "ov_rows": ov_rows, **ff(l)}

    return get


# DeepSeek-V3's layout (Kimi-K2's too): a query latent of 12 features, a key/value latent of 10, 6 non-rotary and
# 4 rotary key features, 5 value features; the first layer dense, then sigmoid-routed experts (as GLM-4.5's)
FAMILIES["deepseek_v3"] = (
    lambda layers: _t().DeepseekV3ForCausalLM(
        _t().DeepseekV3Config(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_D_FF,
            n_routed_experts=MOE_EXPERTS,
            num_experts_per_tok=MOE_TOP_K,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            n_shared_experts=1,
            q_lora_rank=12,
            kv_lora_rank=10,
            qk_rope_head_dim=4,
            qk_nope_head_dim=6,
            v_head_dim=5,
            vocab_size=50,
            max_position_embeddings=64,
        )
    ),
    _latent,
)
# DeepSeek-V3.2: the same attention and experts, and an indexer choosing 4 keys per query (not a matrix of the chain)
FAMILIES["deepseek_v32"] = (
    lambda layers: _t().DeepseekV32ForCausalLM(
        _t().DeepseekV32Config(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            intermediate_size=D_FF,
            moe_intermediate_size=MOE_D_FF,
            n_routed_experts=MOE_EXPERTS,
            num_experts_per_tok=MOE_TOP_K,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            n_shared_experts=1,
            q_lora_rank=12,
            kv_lora_rank=10,
            qk_rope_head_dim=4,
            qk_nope_head_dim=6,
            v_head_dim=5,
            index_topk=4,
            index_head_dim=8,
            index_n_heads=2,
            vocab_size=50,
            max_position_embeddings=64,
        )
    ),
    _latent,
)
# Kimi-K2.5: DeepSeek-V3's text model under text_config and language_model.model., a small MoonViT beside it
FAMILIES["kimi_k25"] = (
    lambda layers: _t().Kimi_K25ForConditionalGeneration(
        _t().Kimi_K25Config(
            text_config=dict(
                model_type="deepseek_v3",
                hidden_size=N,
                num_hidden_layers=layers,
                num_attention_heads=H,
                num_key_value_heads=H,
                intermediate_size=D_FF,
                moe_intermediate_size=MOE_D_FF,
                n_routed_experts=MOE_EXPERTS,
                num_experts_per_tok=MOE_TOP_K,
                n_group=2,
                topk_group=1,
                first_k_dense_replace=1,
                n_shared_experts=1,
                q_lora_rank=12,
                kv_lora_rank=10,
                qk_rope_head_dim=4,
                qk_nope_head_dim=6,
                v_head_dim=5,
                vocab_size=50,
                max_position_embeddings=64,
            ),
            vision_config=dict(
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=24,
                patch_size=4,
                pos_emb_height=4,
                pos_emb_width=4,
                pos_emb_time=2,
            ),
        )
    ),
    lambda m: _latent(m, base=lambda m: m.model.language_model),
)


def _kimi_original_names(folder):
    """transformers 5 saves Kimi-K2.5's text layers as ``language_model.model.blocks.N`` (its vision rename
    ``blocks -> layers`` reversed onto every key); the released checkpoints, which its loader reads, hold
    ``language_model.model.layers.N``: the saved file is put back in that layout."""

    path = Path(folder) / "model.safetensors"
    tensors = load_file(str(path))
    save_file(
        {
            (k.replace(".model.blocks.", ".model.layers.") if k.startswith("language_model.") else k): v
            for k, v in tensors.items()
        },
        str(path),
        metadata={"format": "pt"},
    )


POST_SAVE = {"kimi_k25": _kimi_original_names}


def num_layers(model) -> int:
    """The model's depth (a multimodal model's text model's)."""
    return getattr(model.config, "text_config", model.config).num_hidden_layers


FAMILIES["olmo2"] = (
    _decoder("Olmo2ForCausalLM", "Olmo2Config", num_key_value_heads=2),
    lambda m: _decoder_accessor(m, "all_heads"),
)


def _scaled(module, factor):
    """``factor * module(x)``: a module's output times a multiplier the model applies to it (Granite)."""
    return lambda x: factor * module(x)


def _granite(m):
    """Granite: each sublayer's output times the layer's own residual_multiplier (OV and FF_out), the
    queries times the attention's own scaling (attention_multiplier) over the 1/sqrt(d_h) every family
    leaves out of QK (docs/theory.md 3e)."""
    plain = _decoder_accessor(m)

    def get(l):
        b = m.model.layers[l]
        out = plain(l)
        r, a = b.residual_multiplier, b.self_attn.scaling * b.self_attn.head_dim**0.5
        out["q"] = _proj(_scaled(b.self_attn.q_proj, a), N)
        out["o"] = _proj(_scaled(b.self_attn.o_proj, r), N)
        out["FF_out"] = _proj(_scaled(b.mlp.down_proj, r), D_FF)
        return out

    return get


def _nope(accessor, unrotated):
    """``accessor``'s matrices with ``nope: True`` where the layer's own attention module says it applies no
    rotary positions (``unrotated(attn)``): its QK reference is the plain bilinear matrix."""

    def wrap(m):
        get = accessor(m)

        def layer(l):
            out = get(l)
            out["nope"] = bool(unrotated(m.model.layers[l].self_attn))
            return out

        return layer

    return wrap


# Today's decoders with a twist each: StarCoder2 (biases, a plain GELU feed-forward), Granite (its
# multipliers away from 1 so that each fold is seen), SmolLM3 (every second layer NoPE here), OLMo 3
# (OLMo 2 with sliding and full layers), EXAONE 4 (per-head QK-norm, norms after each sublayer, the global
# layer NoPE), Cohere2 (parallel block, interleaved pairs, the global layer NoPE)
FAMILIES["starcoder2"] = (
    _decoder("Starcoder2ForCausalLM", "Starcoder2Config", num_key_value_heads=2, sliding_window=8),
    lambda m: (
        lambda l, b=m.model.layers: {
            "q": _proj(b[l].self_attn.q_proj, N),
            "k": _proj(b[l].self_attn.k_proj, N),
            "v": _proj(b[l].self_attn.v_proj, N),
            "o": _proj(b[l].self_attn.o_proj, N),
            "FF_in": _proj(b[l].mlp.c_fc, N),
            "FF_out": _proj(b[l].mlp.c_proj, D_FF),
        }
    ),
)
FAMILIES["granite"] = (
    _decoder(
        "GraniteForCausalLM",
        "GraniteConfig",
        num_key_value_heads=2,
        residual_multiplier=0.22,
        attention_multiplier=0.5,
        embedding_multiplier=12.0,
        logits_scaling=8.0,
    ),
    _granite,
)
FAMILIES["smollm3"] = (
    _decoder("SmolLM3ForCausalLM", "SmolLM3Config", num_key_value_heads=2, no_rope_layer_interval=2, pad_token_id=0),
    _nope(_decoder_accessor, lambda a: not a.use_rope),
)
FAMILIES["olmo3"] = (
    _decoder(
        "Olmo3ForCausalLM",
        "Olmo3Config",
        num_key_value_heads=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ),
    lambda m: _decoder_accessor(m, "all_heads"),
)
FAMILIES["exaone4"] = (
    _decoder(
        "Exaone4ForCausalLM",
        "Exaone4Config",
        num_key_value_heads=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ),
    _nope(lambda m: _decoder_accessor(m, "head"), lambda a: not a.is_sliding),
)
FAMILIES["cohere2"] = (
    _decoder(
        "Cohere2ForCausalLM",
        "Cohere2Config",
        num_key_value_heads=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=0,
    ),
    _nope(_decoder_accessor, lambda a: a.sliding_window is None),
)


def _gpt_oss(m):
    """gpt-oss: attention through its projections (biases cancel in ``_proj``), each expert's gate and up
    the columns the module's own ``_apply_gate`` reads (checked by calling it), its down projection the
    bank's slice as the module's forward multiplies by it (``h @ down_proj[e]``)."""
    import torch

    def get(l):
        b = m.model.layers[l]
        a, experts = b.self_attn, b.mlp.experts
        out = {
            "q": _proj(a.q_proj, N),
            "k": _proj(a.k_proj, N),
            "v": _proj(a.v_proj, N),
            "o": _proj(a.o_proj, a.o_proj.in_features),
            "attention_factor": m.model.rotary_emb.attention_scaling,
        }  # YaRN's: cos and sin times it
        with torch.no_grad():
            probe = torch.randn(5, experts.gate_up_proj.shape[-1], dtype=torch.float64)
            gate, up = probe[:, ::2].clamp(max=experts.limit), probe[:, 1::2].clamp(-experts.limit, experts.limit)
            assert torch.allclose(experts._apply_gate(probe), (up + 1) * gate * torch.sigmoid(experts.alpha * gate))
            for e in range(experts.gate_up_proj.shape[0]):
                w = experts.gate_up_proj[e].numpy()  # x @ gate_up_proj[e], as the forward computes it
                out.update(
                    {
                        f"FF_gate[e{e}]": w[:, ::2],
                        f"FF_up[e{e}]": w[:, 1::2],
                        f"FF_out[e{e}]": experts.down_proj[e].numpy(),
                    }
                )
        return out

    return get


# gpt-oss: sinks, biases, alternating sliding and full layers, YaRN (its default: factor 32), expert banks
FAMILIES["gpt_oss"] = (
    lambda layers: _t().GptOssForCausalLM(
        _t().GptOssConfig(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            num_key_value_heads=2,
            head_dim=N // H,
            intermediate_size=MOE_D_FF,
            num_local_experts=MOE_EXPERTS,
            num_experts_per_tok=MOE_TOP_K,
            vocab_size=50,
            pad_token_id=0,
            max_position_embeddings=64,
            sliding_window=8,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 150000.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
            },
            layer_types=["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2),
        )
    ),
    _gpt_oss,
)


def _llama4(m):
    """Llama 4: a rotating layer's QK row is its stacked factors (the weightless L2 norm, gains 1, where the
    module has its ``qk_norm``); a NoPE layer's (``use_rope`` 0) the plain matrix with the queries times the
    largest temperature its module applies at a position below the context; dense layers' blocks, and the
    layers of experts' banks (``bmm(x, gate_up_proj)`` chunked into gate and up, ``bmm(h, down_proj)``) and
    shared expert, as the modules compute them."""
    import torch

    def get(l):
        b = m.model.layers[l]
        a, ff = b.self_attn, b.feed_forward
        out = {
            "q": _proj(a.q_proj, N),
            "k": _proj(a.k_proj, N),
            "v": _proj(a.v_proj, N),
            "o": _proj(a.o_proj, a.o_proj.in_features),
            "nope": not a.use_rope,
        }
        if not a.use_rope and a.attn_temperature_tuning:
            t = torch.arange(m.config.max_position_embeddings, dtype=torch.float64)
            tau = torch.log1p(torch.floor((t + 1.0) / a.floor_scale)) * a.attn_scale + 1.0  # the module's formula
            out["q"] = out["q"] * float(tau.abs().max())
        if hasattr(a, "qk_norm"):  # weightless: every gain 1
            out["q_gain"], out["k_gain"] = np.ones(out["q"].shape[1]), np.ones(out["k"].shape[1])
        if not b.is_moe_layer:
            out.update(
                {
                    "FF_gate": _proj(ff.gate_proj, N),
                    "FF_up": _proj(ff.up_proj, N),
                    "FF_out": _proj(ff.down_proj, ff.down_proj.in_features),
                }
            )
            return out
        experts = ff.experts
        with torch.no_grad():
            for e in range(experts.gate_up_proj.shape[0]):
                gate, up = torch.bmm(torch.eye(N, dtype=torch.float64)[None], experts.gate_up_proj[e : e + 1])[0].chunk(
                    2, -1
                )
                down = torch.bmm(
                    torch.eye(experts.down_proj.shape[1], dtype=torch.float64)[None], experts.down_proj[e : e + 1]
                )[0]
                out.update({f"FF_gate[e{e}]": gate.numpy(), f"FF_up[e{e}]": up.numpy(), f"FF_out[e{e}]": down.numpy()})
        s = ff.shared_expert
        out.update(
            {
                "FF_gate[shared]": _proj(s.gate_proj, N),
                "FF_up[shared]": _proj(s.up_proj, N),
                "FF_out[shared]": _proj(s.down_proj, s.down_proj.in_features),
            }
        )
        return out

    return get


# Llama 4: layer 0 rotating (L2 QK-norm, chunked) and dense, layer 1 NoPE (temperature tuning) with experts
# (top 2 of 4: sigmoid gates summing to at most 2) and a shared expert
FAMILIES["llama4_text"] = (
    lambda layers: _t().Llama4ForCausalLM(
        _t().Llama4TextConfig(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            num_key_value_heads=2,
            head_dim=N // H,
            intermediate_size=MOE_D_FF,
            intermediate_size_mlp=D_FF,
            num_local_experts=MOE_EXPERTS,
            num_experts_per_tok=MOE_TOP_K,
            vocab_size=50,
            pad_token_id=0,
            max_position_embeddings=64,
            no_rope_layer_interval=2,
            interleave_moe_layer_step=2,
            attention_chunk_size=8,
            attn_temperature_tuning=True,
            floor_scale=4,
            attn_scale=0.1,
        )
    ),
    _llama4,
)
QK_NORM["llama4_text"] = "head"
ROTARY += ("starcoder2", "granite", "smollm3", "olmo3", "exaone4", "cohere2", "gpt_oss", "llama4_text")
QK_NORM.update({"olmo3": "all_heads", "exaone4": "head"})


def _vl_text(model_class, config_class, section, **extra):
    """A Qwen-VL text tower saved alone (no ``model.`` prefix, no head): M-RoPE over ``mrope_section`` and a
    context of 4, so that every offset vector (7^3 = 343) is brute-forced and the exact path runs (docs/rotary.md 7)."""
    return lambda layers: getattr(_t(), model_class)(
        getattr(_t(), config_class)(
            hidden_size=N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            num_key_value_heads=2,
            intermediate_size=D_FF,
            vocab_size=50,
            max_position_embeddings=4,
            bos_token_id=None,
            eos_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": section},
            **extra,
        )
    )


def _text_model_accessor(qk_norm=None, d=N // H):
    """:func:`_decoder_accessor` of a bare text model (its layers at ``m.layers``)."""
    return lambda m: _decoder_accessor(SimpleNamespace(model=m), qk_norm, d=d)


# the Qwen-VL text towers: Qwen2's blocks (head_dim 8: sections of 4 frequencies) and Qwen3's (head_dim 16:
# 8 frequencies interleaved T H W T H W T H)
FAMILIES["qwen2_vl_text"] = (_vl_text("Qwen2VLTextModel", "Qwen2VLTextConfig", [1, 2, 1]), _text_model_accessor())
FAMILIES["qwen2_5_vl_text"] = (
    _vl_text("Qwen2_5_VLTextModel", "Qwen2_5_VLTextConfig", [2, 1, 1]),
    _text_model_accessor(),
)
FAMILIES["qwen3_vl_text"] = (
    _vl_text("Qwen3VLTextModel", "Qwen3VLTextConfig", [2, 3, 3], head_dim=16),
    _text_model_accessor("head", d=16),
)
ROTARY += ("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text")
QK_NORM["qwen3_vl_text"] = "head"
FAMILY_OF["qwen2_5_vl_text"] = "qwen2_vl_text"  # one family reads both text towers (the same layers)
HEAD_DIM = {
    "qwen3": 16,
    "gemma": 16,
    "gemma2": 16,
    "gemma3_text": 16,
    "qwen3_moe": 16,
    "glm4_moe": 16,
    "deepseek_v3": 5,
    "deepseek_v32": 5,
    "kimi_k25": 5,
    "qwen3_vl_text": 16,
}  # the others: N / H
# Families whose numbers take, at any depth, the code path of another family here (the Gemmas: LLaMA's
# blocks, Gemma 3 also Qwen3's QK-norm; MPNet, DINOv2 and wav2vec2: BERT's plain chain, their relative
# bias, LayerScale and front-end changing no factor): a 200-layer run of each would test nothing new.
SAME_PATH_AT_DEPTH = {
    "gemma": "llama",
    "gemma2": "llama",
    "gemma3_text": "qwen3",
    "mpnet": "bert",
    "dinov2": "bert",
    "wav2vec2": "bert",
}
# at depth, the new families take paths the others cover: Granite's and StarCoder2's LLaMA's (scalars folded, a
# plain block of GPT-2's kind), OLMo 3's OLMo 2's, EXAONE 4's Qwen3's, Cohere2's Phi's (a parallel block), gpt-oss's
# Mixtral's (its banks are a way of reading, its sinks change no factor); SmolLM3's NoPE layers and EXAONE 4's and
# Cohere2's are Llama 4's, the one new family run at depth 200 (its layers of experts between dense ones too)
SAME_PATH_AT_DEPTH.update(
    {
        "granite": "llama",
        "starcoder2": "llama",
        "olmo3": "olmo2",
        "exaone4": "qwen3",
        "cohere2": "phi",
        "gpt_oss": "mixtral",
        "smollm3": "llama4_text",
    }
)
# GLM-4-MoE's and ERNIE's layers take the Qwen-MoE paths and Llama 4's dense-between-experts one; DeepSeek-V3.2
# and Kimi-K2.5 take DeepSeek-V3's
SAME_PATH_AT_DEPTH.update(
    {"glm4_moe": "qwen3_moe", "ernie4_5_moe": "qwen2_moe", "deepseek_v32": "deepseek_v3", "kimi_k25": "deepseek_v3"}
)
# the Qwen-VL text towers are LLaMA's and Qwen3's blocks; M-RoPE changes only which offsets a QK row's maximum runs over
SAME_PATH_AT_DEPTH.update({"qwen2_vl_text": "llama", "qwen2_5_vl_text": "llama", "qwen3_vl_text": "qwen3"})


# --- vision towers with 2D rotary positions over their patch grids (docs/rotary.md section 9): each tower built alone,
# as transformers saves it, and its own modules called for the reference.  Grids: Pixtral 4 x 4 patches (64 / 16),
# Llama 4 4 x 4 and its class token (56 / 14), Qwen2.5-VL's windows 4 x 4 patches (56 // 2 // 14 merged units of
# 2 x 2) in layer 0 and full attention in layer 1, Qwen2-VL and Qwen3-VL no grid (bounds for every rotation).
def _vision_qkv(blocks, mlp):
    """A Qwen vision tower's layer: the fused ``qkv`` split as its module reshapes it (``[q | k | v]``), ``proj``,
    and the feed-forward matrices ``mlp(block)`` names by role."""

    def get(l):
        b = blocks[l]
        q, k, v = _split_concat(_proj(b.attn.qkv, N))
        return {
            "q": q,
            "k": k,
            "v": v,
            "o": _proj(b.attn.proj, N),
            **{role: _proj(module, module.in_features) for role, module in mlp(b.mlp).items()},
        }

    return get


def _vision_classes():
    from transformers.models.llama4.modeling_llama4 import Llama4VisionModel
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    return {
        "qwen2_vl": Qwen2VisionTransformerPretrainedModel,
        "qwen2_5_vl": Qwen2_5_VisionTransformerPretrainedModel,
        "qwen3_vl": Qwen3VLVisionModel,
        "llama4": Llama4VisionModel,
    }


FAMILIES["pixtral_vision"] = (
    lambda layers: _t().PixtralVisionModel(
        _t().PixtralVisionConfig(
            hidden_size=N,
            intermediate_size=D_FF,
            num_hidden_layers=layers,
            num_attention_heads=H,
            image_size=64,
            patch_size=16,
        )
    ),
    lambda m: (
        lambda l, b=m.transformer.layers: {
            "q": _proj(b[l].attention.q_proj, N),
            "k": _proj(b[l].attention.k_proj, N),
            "v": _proj(b[l].attention.v_proj, N),
            "o": _proj(b[l].attention.o_proj, N),
            "FF_gate": _proj(b[l].feed_forward.gate_proj, N),
            "FF_up": _proj(b[l].feed_forward.up_proj, N),
            "FF_out": _proj(b[l].feed_forward.down_proj, D_FF),
        }
    ),
)
FAMILIES["qwen2_vl_vision"] = (
    lambda layers: _vision_classes()["qwen2_vl"](
        _t().Qwen2VLVisionConfig(depth=layers, embed_dim=N, hidden_size=24, num_heads=H, mlp_ratio=2)
    ),
    lambda m: _vision_qkv(m.blocks, lambda f: {"FF_in": f.fc1, "FF_out": f.fc2}),
)
FAMILIES["qwen2_5_vl_vision"] = (
    lambda layers: _vision_classes()["qwen2_5_vl"](
        _t().Qwen2_5_VLVisionConfig(
            depth=layers,
            hidden_size=N,
            out_hidden_size=24,
            num_heads=H,
            intermediate_size=D_FF,
            window_size=56,
            patch_size=14,
            spatial_merge_size=2,
            fullatt_block_indexes=[1],
        )
    ),
    lambda m: _vision_qkv(m.blocks, lambda f: {"FF_gate": f.gate_proj, "FF_up": f.up_proj, "FF_out": f.down_proj}),
)
FAMILIES["qwen3_vl_vision"] = (
    lambda layers: _vision_classes()["qwen3_vl"](
        _t().Qwen3VLVisionConfig(
            depth=layers,
            hidden_size=N,
            out_hidden_size=24,
            num_heads=H,
            intermediate_size=D_FF,
            deepstack_visual_indexes=[0],
            num_position_embeddings=16,
        )
    ),
    lambda m: _vision_qkv(m.blocks, lambda f: {"FF_in": f.linear_fc1, "FF_out": f.linear_fc2}),
)
# Llama 4's adapter reads the pixel-shuffled patches (4 N channels) with a matrix of intermediate_size inputs: 4 N
FAMILIES["llama4_vision"] = (
    lambda layers: _vision_classes()["llama4"](
        _t().Llama4VisionConfig(
            hidden_size=N,
            intermediate_size=4 * N,
            num_hidden_layers=layers,
            num_attention_heads=H,
            image_size=56,
            patch_size=14,
            vision_output_dim=24,
            projector_input_dim=16,
            projector_output_dim=16,
        )
    ),
    lambda m: (
        lambda l, b=m.model.layers: {
            "q": _proj(b[l].self_attn.q_proj, N),
            "k": _proj(b[l].self_attn.k_proj, N),
            "v": _proj(b[l].self_attn.v_proj, N),
            "o": _proj(b[l].self_attn.o_proj, N),
            "FF_in": _proj(b[l].mlp.fc1, N),
            "FF_out": _proj(b[l].mlp.fc2, 4 * N),
        }
    ),
)
VISION_2D = ("pixtral_vision", "qwen2_vl_vision", "qwen2_5_vl_vision", "qwen3_vl_vision", "llama4_vision")
ROTARY += VISION_2D
# at depth, each takes a path the others cover: a 2D head's rows are the 1D code's with angles per axis
SAME_PATH_AT_DEPTH.update(
    {
        "pixtral_vision": "llama",
        "qwen2_vl_vision": "phi3",
        "qwen2_5_vl_vision": "phi3",
        "qwen3_vl_vision": "phi3",
        "llama4_vision": "gptj",
    }
)


def build_family(name: str, *, layers: int = L, seed: int = 0):
    """The family's tiny model, every weight drawn from N(0, 0.2^2) after ``torch.manual_seed(seed)``
    (some families initialise biases and norms to 0 or 1, which would leave terms untested).

    The module is built under transformers' ``no_init_weights``: its own initialisation would be drawn over
    at once, and it was most of the time of building a model (a 200-layer LLaMA: 4.6 s of CPU, 0.3 s without;
    the buffers, which it does not redraw, are the same either way: tests/archs/test_families.py)."""
    import torch
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = FAMILIES[name][0](layers).eval()
    torch.manual_seed(seed)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model


def save_family(name: str, folder: Path, *, layers: int = L, seed: int = 0):
    """:func:`build_family` saved with ``save_pretrained`` to ``folder``; returns the model."""
    model = build_family(name, layers=layers, seed=seed)
    model.save_pretrained(folder)
    if name in POST_SAVE:
        POST_SAVE[name](folder)
    return model


def reference_matrices(get, heads, kv_heads, layers=L):
    """Dense per-matrix references ``[(role, matrix, factors)]``, ordered like specbound's rows;
    ``factors`` is ``(a W_Q^h.T, a W_K^g.T)`` (``N x d`` each; ``a`` a rope scaling's attention factor, the
    accessor's ``attention_factor``, else 1) for a rotary QK row, None otherwise (a NoPE
    layer's too: its accessor marks it ``nope``).  A QK-norm family's QK row is the head's stacked raw factors
    ``[W_Q^h.T, W_K^g.T]`` (``N x 2d``, docs/theory.md
    3d; ``factors`` None: no rotation acts on it); a mixture of experts' rows come in the model's order
    (experts e0, e1, ..., then the shared one)."""
    rows = []
    for layer in range(layers):
        w = get(layer)
        if "qk_rows" in w:  # rows built by the accessor (multi-head latent attention, docs/theory.md 3l)
            rows += [("QK", z, None) for z in w["qk_rows"]] + [("OV", z, None) for z in w["ov_rows"]]
            rows += [(r, m, None) for r, m in w.items() if r.startswith("FF_")]
            continue
        d = w["q"].shape[1] // heads
        group = heads // kv_heads
        cols = lambda m, h: m[:, h * d : (h + 1) * d]  # noqa: E731
        if "q_gain" in w:  # QK-norm: the stacked raw factors
            rows += [
                ("QK", np.concatenate([cols(w["q"], h), cols(w["k"], h // group)], axis=1), None) for h in range(heads)
            ]
        elif w.get("nope"):  # a layer without rotary positions: the plain bilinear matrix, no offsets
            rows += [("QK", cols(w["q"], h) @ cols(w["k"], h // group).T, None) for h in range(heads)]
        else:  # a rope scaling's attention factor a (the module's own) multiplies both factors
            a = w.get("attention_factor", 1.0)
            rows += [
                (
                    "QK",
                    a * a * cols(w["q"], h) @ cols(w["k"], h // group).T,
                    (a * cols(w["q"], h), a * cols(w["k"], h // group)),
                )
                for h in range(heads)
            ]
        rows += [("OV", cols(w["v"], h // group) @ w["o"][h * d : (h + 1) * d, :], None) for h in range(heads)]
        rows += [(r, m, None) for r, m in w.items() if r.startswith("FF_")]  # in the model's order (experts e0, ...)
    return rows


# --- the hybrids specbound refuses as a whole (archs/data/refused/, tests/archs/test_hybrids.py): each
# model type's config built by transformers, in its current form and the older forms of released
# config.json files.  A family derived one day moves from here into FAMILIES.
# what transformers calls the refused blocks in layer_types (legacy names included)
REFUSED_TYPES = {"linear_attention", "mamba", "conv"}
SMALL = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
# the state-space mixers' heads must divide their width (2 x 32)
EXTRA = {
    "kimi_linear": dict(pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "granitemoehybrid": dict(mamba_n_heads=4),
    "bamba": dict(mamba_n_heads=4),
    "zamba2": dict(mamba_headdim=8, n_mamba_heads=8),
    "mamba2": dict(num_heads=8, head_dim=8),
    "olmo_hybrid": dict(pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "falcon_h1": dict(mamba_n_heads=4),
    "nemotron_h": dict(mamba_num_heads=4),
}

# (family, config kwargs): transformers builds the config; each family in its current form and the
# older forms of released config.json files
REFUSED_CONFIGS = [
    ("qwen3_next", dict(num_hidden_layers=8)),
    ("qwen3_next", dict(num_hidden_layers=7, full_attention_interval=3)),
    (
        "qwen3_next",
        dict(
            layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
            num_hidden_layers=4,
        ),
    ),
    ("kimi_linear", dict(num_hidden_layers=9)),
    (
        "kimi_linear",
        dict(num_hidden_layers=5, linear_attn_config={"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3]}),
    ),
    ("nemotron_h", dict(hybrid_override_pattern="M-M*-ME*M")),
    ("nemotron_h", dict(layers_block_type=["full_attention", "mamba", "mlp", "mamba"])),
    (
        "granitemoehybrid",
        dict(num_hidden_layers=6, layer_types=["mamba", "mamba", "attention", "mamba", "attention", "mamba"]),
    ),
    ("granitemoehybrid", dict(num_hidden_layers=3)),
    ("falcon_h1", dict(num_hidden_layers=3)),
    ("jamba", dict(num_hidden_layers=11)),
    ("jamba", dict(num_hidden_layers=7, attn_layer_period=3, attn_layer_offset=1)),
    ("lfm2", dict(num_hidden_layers=6, full_attn_idxs=[2, 5])),
    ("lfm2", dict(num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"])),
    ("qwen3_5_text", dict(num_hidden_layers=8)),
    ("qwen3_5", dict(text_config=dict(num_hidden_layers=5, layer_types=["linear_attention"] * 4 + ["full_attention"]))),
    ("minimax", dict(num_hidden_layers=5)),
    ("mamba", dict(num_hidden_layers=2)),
    ("falcon_mamba", dict(num_hidden_layers=3)),
    ("mamba2", dict(num_hidden_layers=2)),
    ("bamba", dict(num_hidden_layers=5, attn_layer_indices=[1, 3])),
    ("bamba", dict(num_hidden_layers=2)),
    ("zamba", dict(num_hidden_layers=4)),
    ("zamba2", dict(num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "mamba"])),
    ("recurrent_gemma", dict(num_hidden_layers=7)),
    ("recurrent_gemma", dict(num_hidden_layers=4, block_types=["recurrent", "attention"])),
    ("rwkv", dict(num_hidden_layers=3)),
]
# families whose every layer holds the refused block (beside attention, or with no attention at all)
EVERY_LAYER = ("falcon_h1", "mamba", "falcon_mamba", "mamba2", "zamba", "zamba2", "rwkv")


# Vision-language wrappers (support/vision_language.py builds them), each analysed as one tower
# (``tower=TOWER[name]``): the text model's layers read by its family's accessor through ``text_view``
TOWER = {name: "text" for name in ("gemma3", "paligemma", "llava", "idefics3", "llama4", "mistral3")}


def text_view(name: str, model):
    """``model`` itself, or for a wrapper of :data:`TOWER` an object whose ``model`` is its text decoder and
    whose ``config`` is the decoder's (what the accessors and the invariant tests read)."""

    if name not in TOWER:
        return model

    text = WRAPPERS[name][1](model)
    decoder = text.model if hasattr(text, "lm_head") else text
    return SimpleNamespace(model=decoder, config=decoder.config)


def _wrapped(name: str, accessor):
    return (lambda layers: WRAPPERS[name][0](layers)), (lambda m: accessor(text_view(name, m)))


def _vision_encoder(name: str):
    """A wrapper's SigLIP / CLIP vision encoder: each layer's attention and two-matrix feed-forward."""

    def accessor(m):
        layers, n = WRAPPERS[name][2](m).encoder.layers, VISION["hidden_size"]
        return lambda l: {
            "q": _proj(layers[l].self_attn.q_proj, n),
            "k": _proj(layers[l].self_attn.k_proj, n),
            "v": _proj(layers[l].self_attn.v_proj, n),
            "o": _proj(layers[l].self_attn.out_proj, n),
            "FF_in": _proj(layers[l].mlp.fc1, n),
            "FF_out": _proj(layers[l].mlp.fc2, layers[l].mlp.fc2.in_features),
        }

    return (lambda layers: WRAPPERS[name][0](layers)), accessor


# the vision towers of Gemma 3 (SigLIP's) and LLaVA (CLIP's), analysed with tower="vision" (as many layers as text)
FAMILIES["gemma3_vision"], FAMILIES["llava_vision"] = _vision_encoder("gemma3"), _vision_encoder("llava")
TOWER.update({"gemma3_vision": "vision", "llava_vision": "vision"})
FAMILY_OF.update({"gemma3_vision": "siglip", "llava_vision": "clip"})
FAMILIES["gemma3"] = _wrapped("gemma3", lambda m: _decoder_accessor(m, "head"))
for _name in ("paligemma", "llava", "idefics3", "mistral3"):
    FAMILIES[_name] = _wrapped(_name, _decoder_accessor)
FAMILIES["llama4"] = _wrapped("llama4", _llama4)
ROTARY += tuple(name for name, tower in TOWER.items() if tower == "text")
QK_NORM.update({"gemma3": "head", "llama4": "head"})
# the family that reads each wrapper's text tower (its chain exactly, tests/archs/test_vision_language.py: at
# depth too, so no 200-layer run of its own)
FAMILY_OF.update(
    {
        "gemma3": "gemma3_text",
        "paligemma": "gemma",
        "llava": "llama",
        "idefics3": "llama",
        "mistral3": "llama",
        "llama4": "llama4_text",
    }
)
