"""The rotary layout read from a family spec and config.json (specbound.archs.rotary): the spec
decides whether a family is rotary and how its dimensions pair up, config.json gives the base, the
rotated dimensions, the context length and the scaling; bad settings are one-line errors."""

import pytest

from specbound import SpecboundError
from specbound.archs import builtin_specs, spec_for_config
from specbound.archs.model import UNBOUNDED_POSITIONS, RotaryLayout
from specbound.archs.rotary import parse_rotary, rotary_layout


@pytest.mark.parametrize(
    "config, d_head, expected",
    [
        (
            {"model_type": "llama", "rope_theta": 500000.0, "max_position_embeddings": 8192},
            128,
            RotaryLayout(128, "half", 500000.0, 8192),
        ),
        ({"model_type": "llama", "max_position_embeddings": 2048}, 128, RotaryLayout(128, "half", 10000.0, 2048)),
        (
            {
                "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
                "max_position_embeddings": 32768,
                "head_dim": 64,
            },
            64,
            RotaryLayout(64, "half", 1e6, 32768),
        ),
        (
            {"model_type": "gpt_neox", "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048},
            64,
            RotaryLayout(16, "half", 10000.0, 2048),
        ),
        (
            {"model_type": "phi", "partial_rotary_factor": 0.4, "max_position_embeddings": 2048},
            80,
            RotaryLayout(32, "half", 10000.0, 2048),
        ),
        ({"model_type": "gptj", "rotary_dim": 64, "n_positions": 2048}, 256, RotaryLayout(64, "half", 10000.0, 2048)),
        (
            {
                "rope_parameters": {"rope_theta": 5e5, "rope_type": "dynamic", "factor": 4.0},
                "max_position_embeddings": 64,
            },
            16,
            RotaryLayout(16, "half", 5e5, 64, "dynamic"),
        ),  # NTK changes the base only beyond the context
        ({"rope_theta": 1e4}, 16, RotaryLayout(16, "half", 1e4, UNBOUNDED_POSITIONS)),  # no context length stated
        ({}, 16, RotaryLayout(16, "half", 10000.0, UNBOUNDED_POSITIONS)),
    ],
)
def test_config_parsing(config, d_head, expected):
    assert parse_rotary(config, d_head, "half") == expected


def test_the_pairing_is_the_one_given():
    cfg = {"model_type": "gptj", "rotary_dim": 64, "n_positions": 2048}
    assert parse_rotary(cfg, 256, "interleaved").pairing == "interleaved"
    assert parse_rotary(cfg, 256, "half").pairing == "half"


@pytest.mark.parametrize(
    "config, d_head, pairing, match",
    [
        ({"rope_theta": -1.0, "max_position_embeddings": 64}, 16, "half", "rope_theta"),
        ({"rope_theta": 0, "max_position_embeddings": 64}, 16, "half", "rope_theta"),
        ({"rope_theta": float("inf"), "max_position_embeddings": 64}, 16, "half", "rope_theta"),
        ({"rope_theta": "big", "max_position_embeddings": 64}, 16, "half", "rope_theta"),
        ({"rotary_dim": 7, "max_position_embeddings": 64}, 16, "half", "even"),
        ({"rotary_dim": 0, "max_position_embeddings": 64}, 16, "half", "positive"),
        ({"rotary_dim": 32, "max_position_embeddings": 64}, 16, "half", "d_head"),
        ({"rotary_pct": 0.0, "max_position_embeddings": 64}, 16, "half", r"rotary_pct must lie in \(0, 1\]"),
        ({"partial_rotary_factor": 1.5, "max_position_embeddings": 64}, 16, "half", "partial_rotary_factor"),
        ({"partial_rotary_factor": 0.3, "max_position_embeddings": 64}, 10, "half", "even"),  # int(3.0) = 3
        ({"rope_theta": 1e4, "max_position_embeddings": None}, 16, "half", "null"),
        ({"rope_theta": 1e4, "max_position_embeddings": 0}, 16, "half", "max_position_embeddings"),
        ({"rope_theta": 1e4, "max_position_embeddings": 64.5}, 16, "half", "max_position_embeddings"),
        ({"rope_theta": 1e4, "max_position_embeddings": 64, "head_dim": 32}, 16, "half", "head_dim"),
        ({"rope_theta": 1e4, "max_position_embeddings": 64}, 16, "zigzag", "pairing"),
        ({"rope_theta": 1e4, "max_position_embeddings": 64}, 0, "half", "d_head"),
        (
            {
                "rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}},
                "max_position_embeddings": 64,
            },
            16,
            "half",
            "per layer type",
        ),
        ({"alibi": True, "rope_theta": 1e4, "max_position_embeddings": 64}, 16, "half", "alibi"),
        ({"position_embedding_type": "absolute", "max_position_embeddings": 64}, 16, "half", "not rotary"),
    ],
)
def test_config_errors(config, d_head, pairing, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_rotary(config, d_head, pairing)
    assert "\n" not in str(info.value)


def test_the_spec_decides_whether_a_family_is_rotary():
    """A family without ``rotary`` in its spec has no layout whatever its config says; a rotary
    family's config errors name the checkpoint in one SpecboundError line."""
    specs = builtin_specs()
    rotary_config = {"rope_theta": 1e4, "max_position_embeddings": 64}
    assert rotary_layout(specs["bert"], rotary_config, 16, where="m") is None
    assert rotary_layout(specs["llama"], rotary_config, 16, where="m") == RotaryLayout(16, "half", 1e4, 64)
    assert {f for f, s in specs.items() if s.rotary} >= {
        "gpt_neox",
        "llama",
        "llama_gguf",
        "qwen3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "olmo2",
        "phi",
        "phi3",
        "gptj",
        "falcon",
        "mixtral",
        "qwen2_moe",
        "modernbert",
    }
    assert not {f for f, s in specs.items() if s.rotary} & {"bert", "gpt2", "opt", "vit", "bloom"}
    assert specs["gptj"].rotary == "interleaved"
    # Falcon's alibi switches rotary off (ALiBi biases instead), and its config is then not read as rotary
    assert rotary_layout(specs["falcon"], {**rotary_config, "alibi": True}, 16, where="m") is None
    assert rotary_layout(specs["falcon"], {**rotary_config, "alibi": False}, 16, where="m") == RotaryLayout(
        16, "half", 1e4, 64
    )
    with pytest.raises(SpecboundError, match=r"config.json of folder/x: rope_theta") as info:
        rotary_layout(specs["llama"], {**rotary_config, "rope_theta": -1}, 16, where="folder/x")
    assert "\n" not in str(info.value)


def test_shipped_specs_are_parsed_once():
    """Every lookup returns the same parsed spec objects (the files are read at the first one)."""
    first, again = builtin_specs(), builtin_specs()
    assert first == again and first is not again  # a caller's dict, not the registry's
    assert all(first[f] is again[f] for f in first)
    assert spec_for_config({"model_type": "mistral"}) is first["llama"]
