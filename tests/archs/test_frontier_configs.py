"""Configurations of StarCoder2, Granite, SmolLM3, OLMo 3, EXAONE 4, Cohere 2, gpt-oss and Llama 4 drawn
at random (depth, key/value heads, which layers slide, rotate or hold experts, top-k, the multipliers, the
temperature): each analyses out of the box to finite bounds with one QK and one OV row per query head of
every layer and every expert's feed-forward matrices, and names NoPE layers exactly when some layers rotate
and some do not (a small cousin of the config fuzz class, tests/fuzz/test_fuzz_family_configs.py)."""

import pytest
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.drawn_configs import analysed, check_drawn  # noqa: E402

N, H = 16, 4
FAMILIES = ("starcoder2", "granite", "smollm3", "olmo3", "exaone4", "cohere2", "gpt_oss", "llama4_text")


@st.composite
def configs(draw, family):
    L = draw(st.integers(1, 3))
    kv = draw(st.sampled_from([1, 2, 4]))
    types = draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=L, max_size=L))
    common = dict(
        hidden_size=N,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=kv,
        vocab_size=40,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=32,
        intermediate_size=12,
    )
    extra = {}
    if family in ("olmo3", "exaone4", "cohere2", "gpt_oss"):
        extra.update(layer_types=types, sliding_window=draw(st.sampled_from([4, None])) if family != "gpt_oss" else 4)
    if family == "smollm3":
        extra["no_rope_layers"] = draw(st.lists(st.sampled_from([0, 1]), min_size=L, max_size=L))
    if family == "granite":
        extra.update(residual_multiplier=draw(st.floats(0.05, 2.0)), attention_multiplier=draw(st.floats(0.01, 1.0)))
    if family == "gpt_oss":
        extra.update(num_local_experts=3, num_experts_per_tok=draw(st.integers(1, 3)), head_dim=N // H)
    if family == "llama4_text":
        experts = draw(st.lists(st.integers(0, L - 1), max_size=L, unique=True))
        extra.update(
            num_local_experts=3,
            num_experts_per_tok=draw(st.integers(1, 2)),
            head_dim=N // H,
            intermediate_size_mlp=20,
            moe_layers=experts,
            no_rope_layers=draw(st.lists(st.sampled_from([0, 1]), min_size=L, max_size=L)),
            use_qk_norm=draw(st.booleans()),
            attn_temperature_tuning=draw(st.booleans()),
            floor_scale=4,
        )
    return family, common, extra


_CLASSES = {
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config"),
    "granite": ("GraniteForCausalLM", "GraniteConfig"),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config"),
    "olmo3": ("Olmo3ForCausalLM", "Olmo3Config"),
    "exaone4": ("Exaone4ForCausalLM", "Exaone4Config"),
    "cohere2": ("Cohere2ForCausalLM", "Cohere2Config"),
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig"),
    "llama4_text": ("Llama4ForCausalLM", "Llama4TextConfig"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_drawn_configuration_analyses_with_every_head_and_expert(family, tmp_path_factory):
    check_drawn(configs(family), lambda case: _check(case, tmp_path_factory))


def _check(case, tmp_path_factory):
    family, common, _ = case
    model, a = analysed(case, _CLASSES, tmp_path_factory)
    m, L = a.matrices, common["num_hidden_layers"]
    for layer in range(L):
        rows = m[m["layer"] == layer]
        assert (rows["role"] == "QK").sum() == H and (rows["role"] == "OV").sum() == H, (family, layer)
        ff = rows[rows["role"].str.startswith("FF_")]
        block = model.model.layers[layer]
        experts = getattr(block, "mlp", getattr(block, "feed_forward", None))
        experts = getattr(experts, "experts", None)
        per = 2 if family == "starcoder2" else 3
        if experts is None:
            assert len(ff) == per, (family, layer)
        else:  # every expert's three matrices, and a shared expert's (Llama 4)
            shared = 3 if family == "llama4_text" else 0
            assert len(ff) == 3 * experts.gate_up_proj.shape[0] + shared, (family, layer)
    rotary = a.model["rotary"]
    by_layer = None if rotary is None else rotary.get("by_layer")
    mixed = by_layer is not None and any(r is None for r in by_layer) and any(r is not None for r in by_layer)
    assert mixed == any(e["name"] == "nope_layers" and e["applies"] for e in a.assumptions)


_COMMON = dict(
    hidden_size=N,
    num_attention_heads=H,
    vocab_size=40,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    max_position_embeddings=32,
    intermediate_size=12,
)


@pytest.mark.parametrize(
    "case",
    [
        (
            "llama4_text",
            dict(_COMMON, num_hidden_layers=3, num_key_value_heads=2),
            dict(
                num_local_experts=3,
                num_experts_per_tok=2,
                head_dim=4,
                intermediate_size_mlp=20,
                moe_layers=[0, 2],
                no_rope_layers=[1, 0, 1],
                use_qk_norm=True,
                attn_temperature_tuning=True,
                floor_scale=4,
            ),
        ),
        ("smollm3", dict(_COMMON, num_hidden_layers=3, num_key_value_heads=1), dict(no_rope_layers=[1, 0, 1])),
        (
            "cohere2",
            dict(_COMMON, num_hidden_layers=3, num_key_value_heads=4),
            dict(layer_types=["full_attention", "sliding_attention", "full_attention"], sliding_window=4),
        ),
        (
            "gpt_oss",
            dict(_COMMON, num_hidden_layers=3, num_key_value_heads=4),
            dict(
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                sliding_window=4,
                num_local_experts=3,
                num_experts_per_tok=3,
                head_dim=4,
            ),
        ),
    ],
    ids=lambda c: c[0],
)
def test_a_chosen_mixed_configuration_analyses_with_every_head_and_expert(case, tmp_path_factory):
    """The mixes the drawn ones may miss: experts in two layers of three beside a dense one, NoPE between
    rotating layers, all of a gpt-oss layer's experts chosen."""
    _check(case, tmp_path_factory)
