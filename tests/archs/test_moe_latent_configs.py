"""Configurations of GLM-4-MoE, ERNIE 4.5 MoE, DeepSeek-V3 and DeepSeek-V3.2 drawn at random (depth, which
layers hold experts, top-k, shared experts, the gates' normalisation and scale, QK-norm, a query latent or
not): each analyses out of the box to finite bounds with one QK and one OV row per query head of every layer,
every expert's feed-forward matrices in the layers the model builds with experts and a dense block in the
others, and names the mixture of experts exactly when some layer holds one (the small cousin of the config
fuzz class, as tests/archs/test_frontier_configs.py is for eight other families)."""

import pytest
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.drawn_configs import analysed, check_drawn  # noqa: E402

N, H, E = 16, 2, 4
FAMILIES = ("glm4_moe", "ernie4_5_moe", "deepseek_v3", "deepseek_v32")
_CLASSES = {
    "glm4_moe": ("Glm4MoeForCausalLM", "Glm4MoeConfig"),
    "ernie4_5_moe": ("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config"),
    "deepseek_v32": ("DeepseekV32ForCausalLM", "DeepseekV32Config"),
}


@st.composite
def configs(draw, family):
    L = draw(st.integers(1, 4))
    common = dict(
        hidden_size=N,
        num_hidden_layers=L,
        num_attention_heads=H,
        intermediate_size=20,
        vocab_size=40,
        max_position_embeddings=32,
        moe_intermediate_size=8,
    )
    top_k = draw(st.integers(1, 2))
    if family == "glm4_moe":
        extra = dict(
            num_key_value_heads=draw(st.sampled_from([1, 2])),
            head_dim=8,
            n_routed_experts=E,
            num_experts_per_tok=top_k,
            n_group=draw(st.sampled_from([1, 2])),
            topk_group=1,
            first_k_dense_replace=draw(st.integers(0, L)),
            n_shared_experts=draw(st.integers(1, 2)),
            routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
            norm_topk_prob=draw(st.booleans()),
            use_qk_norm=draw(st.booleans()),
            attention_bias=draw(st.booleans()),
        )
    elif family == "ernie4_5_moe":
        extra = dict(
            num_key_value_heads=draw(st.sampled_from([1, 2])),
            moe_num_experts=E,
            moe_k=top_k,
            moe_layer_start_index=draw(st.integers(0, L)),
            moe_layer_interval=draw(st.integers(1, 2)),
            moe_layer_end_index=draw(st.sampled_from([-1, L - 1, max(L - 2, 0)])),
            moe_num_shared_experts=draw(st.integers(0, 1)),
        )
    else:
        extra = dict(
            num_key_value_heads=H,
            n_routed_experts=E,
            num_experts_per_tok=top_k,
            n_group=1,
            topk_group=1,
            n_shared_experts=1,
            kv_lora_rank=6,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=3,
            routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
            norm_topk_prob=draw(st.booleans()),
        )
        if family == "deepseek_v3":
            extra.update(first_k_dense_replace=draw(st.integers(0, L)), q_lora_rank=draw(st.sampled_from([None, 8])))
        else:
            extra.update(
                q_lora_rank=8,
                index_topk=2,
                index_head_dim=4,
                index_n_heads=2,
                mlp_layer_types=draw(st.lists(st.sampled_from(["dense", "sparse"]), min_size=L, max_size=L)),
            )
    return family, common, extra


@pytest.mark.parametrize("family", FAMILIES)
def test_a_drawn_configuration_analyses_with_every_head_and_expert(family, tmp_path_factory):
    check_drawn(configs(family), lambda case: _check(case, tmp_path_factory))


def _check(case, tmp_path_factory):
    family = case[0]
    model, a = analysed(case, _CLASSES, tmp_path_factory)
    m = a.matrices
    any_experts = False
    for layer, block in enumerate(model.model.layers):
        rows = m[m["layer"] == layer]
        assert (rows["role"] == "QK").sum() == H and (rows["role"] == "OV").sum() == H, (family, layer)
        ff = rows[rows["role"].str.startswith("FF_")]
        experts = getattr(block.mlp, "experts", None)
        if experts is None:
            assert list(ff["role"]) == ["FF_gate", "FF_up", "FF_out"], (family, layer)
            continue
        any_experts = True
        shared = getattr(block.mlp, "shared_experts", None) is not None
        assert len(ff) == 3 * experts.gate_up_proj.shape[0] + 3 * shared, (family, layer)
    named = {e["name"] for e in a.assumptions if e["applies"]}
    assert ("mixture_of_experts" in named) == any_experts
    assert ("latent_attention" in named) == family.startswith("deepseek")
