"""Hybrid families (linear-attention and state-space layers beside softmax attention) are refused as a
whole in one line that names those layers: their indices, their block type, their tensors.

The layer indices are checked against transformers' own config classes: each family's config is
built by transformers (as save_pretrained writes it, and in the older forms the hub's config.json
files have), and the layers transformers types as linear attention, Mamba or convolution are the
ones the message names."""

import json
import re
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file
from support.families import EVERY_LAYER, EXTRA, REFUSED_TYPES, SMALL
from support.families import REFUSED_CONFIGS as CASES
from support.one_line import assert_api_error, assert_one_line_error, run_cli

from specbound import SpecboundError
from specbound.archs import spec_for_config, supported_model_types
from specbound.archs.hybrids import _parse, ranges, refused_families, refused_family
from specbound.cli import main

transformers = pytest.importorskip("transformers")


def _saved(model_type, kwargs, tmp_path):
    """config.json as transformers writes it, and transformers' own refused layers."""
    config = transformers.AutoConfig.for_model(model_type, **SMALL, **EXTRA.get(model_type, {}), **kwargs)
    config.save_pretrained(tmp_path)
    text = getattr(config, "text_config", None) or config
    if model_type in EVERY_LAYER:
        expected = list(range(text.num_hidden_layers))
        return json.loads((tmp_path / "config.json").read_text()), expected, len(expected)
    types = getattr(text, "layer_types", None) or text.layers_block_type
    expected = [i for i, t in enumerate(types) if t in REFUSED_TYPES]
    return json.loads((tmp_path / "config.json").read_text()), expected, len(types)


@pytest.mark.parametrize("model_type,kwargs", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_the_refused_layers_are_transformers_own(model_type, kwargs, tmp_path):
    config, expected, depth = _saved(model_type, kwargs, tmp_path)
    assert expected, "each case has refused layers"
    family = refused_family(model_type)
    assert family.refused_layers(config) == (expected, depth)
    # the older form: only the keys the hub's config.json files had (no layer_types written by transformers)
    with pytest.raises(SpecboundError) as info:
        spec_for_config(config)
    message = str(info.value)
    assert "\n" not in message
    assert f"model_type={model_type!r}" in message and family.block in message and family.tensors in message
    assert f"{'layer' if len(expected) == 1 else 'layers'} {ranges(expected)} of {depth} are" in message
    assert "refused as a whole" in message and "docs/families.md" in message


@pytest.mark.parametrize(
    "model_type,legacy",
    [
        ("qwen3_next", {"full_attention_interval": 4, "num_hidden_layers": 8}),
        (
            "kimi_linear",
            {"num_hidden_layers": 5, "linear_attn_config": {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3]}},
        ),
        ("nemotron_h", {"hybrid_override_pattern": "M-M*-ME*M"}),
        ("granitemoehybrid", {"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"]}),
        ("lfm2", {"num_hidden_layers": 6, "full_attn_idxs": [2, 5]}),
    ],
)
def test_older_config_files(model_type, legacy):
    """The config.json files released before transformers wrote layer_types: the layers transformers
    reads from them."""
    config = transformers.AutoConfig.for_model(model_type, **SMALL, **EXTRA.get(model_type, {}), **legacy)
    types = config.layer_types
    expected = [i for i, t in enumerate(types) if t in REFUSED_TYPES]
    assert refused_family(model_type).refused_layers({"model_type": model_type, **legacy}) == (expected, len(types))


def test_what_config_does_not_say_is_said():
    """No key that says which layers: the block is still named, and that config.json does not say;
    a config whose every layer is softmax attention is refused for want of a spec."""
    with pytest.raises(SpecboundError, match=r"its gated short-convolution layers .*config.json does not say which"):
        spec_for_config({"model_type": "lfm2", "num_hidden_layers": 3})
    with pytest.raises(SpecboundError, match=r"has none of the family's gated short-convolution layers .* no spec"):
        spec_for_config({"model_type": "lfm2", "num_hidden_layers": 3, "full_attn_idxs": [0, 1, 2]})
    with pytest.raises(SpecboundError, match=r"Kimi Delta Attention .*config.json does not say which"):
        spec_for_config({"model_type": "kimi_linear", "num_hidden_layers": "four"})


def test_every_refused_family_is_read_and_none_is_shipped():
    families = refused_families()
    assert {f.family for f in families} >= {
        "qwen3_next",
        "kimi_linear",
        "nemotron_h",
        "granitemoehybrid",
        "falcon_h1",
        "jamba",
        "lfm2",
        "qwen3_5",
        "olmo_hybrid",
        "minimax",
        "mamba",
        "mamba2",
        "bamba",
        "zamba",
        "recurrent_gemma",
        "rwkv",
    }

    types = [t for f in families for t in f.model_types]
    assert len(types) == len(set(types)) and not set(types) & set(supported_model_types())
    # every model type of these families: the cases above build each one (the MoE twins aside, and
    # olmo_hybrid, whose config class takes seconds to import: test_olmo_hybrid)
    assert set(types) == {m for m, _ in CASES} | {"qwen3_5_moe", "qwen3_5_moe_text", "lfm2_moe", "olmo_hybrid"}


def test_olmo_hybrid():
    """The layer_types transformers writes (linear attention but every fourth layer, and the last)."""
    types = [
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
        "linear_attention",
        "full_attention",
    ]
    with pytest.raises(SpecboundError, match=r"layers 0-2, 4 of 6 are gated DeltaNet linear-attention layers"):
        spec_for_config({"model_type": "olmo_hybrid", "layer_types": types, "num_hidden_layers": 6})


def test_ranges():
    assert ranges([0, 1, 2, 4, 5, 6, 8]) == "0-2, 4-6, 8"
    assert ranges([3]) == "3" and ranges([]) == ""


def test_a_saved_hybrid_is_refused_in_one_line(healthy, capsys, tmp_path):
    """The command line and the API: one line, exit status 2, the layers named (a folder whose
    config.json is transformers' Qwen3-Next config)."""
    config, expected, depth = _saved("qwen3_next", dict(num_hidden_layers=4), tmp_path)
    (healthy / "config.json").write_text(json.dumps(config))
    needles = ["'qwen3_next'", "layers 0-2 of 4 are gated DeltaNet linear-attention layers", "linear_attn.*"]
    line = assert_one_line_error(*run_cli(capsys, healthy), needles)
    assert assert_api_error(needles, healthy) == line.removeprefix("specbound: error: ")


def test_a_tiny_qwen3_next_model_is_refused(tmp_path):
    """A real tiny Qwen3-Next written by save_pretrained (its weights and config.json)."""
    import torch

    torch.manual_seed(0)
    config = transformers.Qwen3NextConfig(
        **SMALL,
        num_hidden_layers=4,
        head_dim=8,
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )
    transformers.Qwen3NextForCausalLM(config).save_pretrained(tmp_path)
    assert_api_error(["layers 0-2 of 4 are gated DeltaNet", "layer" + "s.N.linear_attn.*"], tmp_path)


# --- arch infer: the weights of blocks no spec can describe are refused, naming the weight and its layers

# (model_type, config kwargs, the weight's leaf name that is refused first, the words of its kind)
INFER_CASES = [
    ("qwen3_next", dict(num_hidden_layers=4), "linear_attn.A_log", "linear-attention or state-space"),
    (
        "kimi_linear",
        dict(num_hidden_layers=5, linear_attn_config={"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3]}),
        "A_log",
        "linear-attention or state-space",
    ),
    ("nemotron_h", dict(hybrid_override_pattern="*M-M"), "mixer.A_log", "linear-attention or state-space"),
    (
        "granitemoehybrid",
        dict(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"]),
        "mamba.A_log",
        "linear-attention or state-space",
    ),
    ("falcon_h1", dict(num_hidden_layers=2), "mamba.A_log", "linear-attention or state-space"),
    (
        "jamba",
        dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1),
        "mamba.A_log",
        "linear-attention or state-space",
    ),
    (
        "lfm2",
        dict(num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"]),
        "conv.conv.weight",
        "causal convolution over the tokens",
    ),
    ("qwen3_5_text", dict(num_hidden_layers=4), "linear_attn.A_log", "linear-attention or state-space"),
    ("minimax", dict(num_hidden_layers=4), "self_attn.slope_rate", "linear-attention or state-space"),
    ("mamba", dict(num_hidden_layers=2), "mixer.A_log", "linear-attention or state-space"),
    ("mamba2", dict(num_hidden_layers=2), "mixer.A_log", "linear-attention or state-space"),
    ("bamba", dict(num_hidden_layers=3, attn_layer_indices=[1]), "mamba.A_log", "linear-attention or state-space"),
    (
        "zamba2",
        dict(num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "mamba"]),
        "A_log",
        "linear-attention or state-space",
    ),
    ("recurrent_gemma", dict(num_hidden_layers=3), "rg_lru.recurrent_param", "linear-attention or state-space"),
    ("rwkv", dict(num_hidden_layers=2), "attention.time_decay", "linear-attention or state-space"),
]


def _names_only(model_type, kwargs, folder):
    """The tensor names and shapes of transformers' own model of ``model_type`` (built on the meta
    device), written as zeros, with the config.json transformers writes."""
    import torch

    config = transformers.AutoConfig.for_model(model_type, **SMALL, **EXTRA.get(model_type, {}), **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    folder.mkdir()
    save_file(
        {k: np.zeros(tuple(v.shape), np.float32) for k, v in model.state_dict().items()},
        str(folder / "model.safetensors"),
    )
    config.save_pretrained(folder)
    return config


@pytest.mark.parametrize("model_type,kwargs,weight,kind", INFER_CASES, ids=[c[0] for c in INFER_CASES])
def test_arch_infer_refuses_a_hybrid_naming_the_weight_and_its_layers(
    model_type, kwargs, weight, kind, tmp_path, capsys
):
    config = _names_only(model_type, kwargs, tmp_path / "m")
    layers, depth = refused_family(model_type).refused_layers(json.loads((tmp_path / "m" / "config.json").read_text()))
    line = assert_one_line_error(
        *run_cli(capsys, "infer", tmp_path / "m", command="arch"), [kind, "no spec can describe it", "docs/families.md"]
    )
    first = re.search(r"error: (\S+) is ", line)[1]
    assert first.endswith(weight) and f".{layers[0]}." in first
    assert f"{'layer' if len(layers) == 1 else 'layers'} {ranges(layers)} of {depth}:" in line
    assert config.num_hidden_layers == depth


@pytest.mark.parametrize(
    "extra, needle",
    [
        (
            {
                "self_attn.q_a_proj.weight": (4, 8),
                "self_attn.q_a_layernorm.weight": (4,),
                "self_attn.q_b_proj.weight": (8, 4),
            },
            "multi-head latent attention projection",
        ),
        (
            {"self_attn.kv_a_proj_with_mqa.weight": (6, 8), "self_attn.kv_b_proj.weight": (16, 4)},
            "multi-head latent attention projection",
        ),
        ({"self_attn.sinks": (2,)}, "attention sinks"),
        ({"mlp.gate.e_score_correction_bias": (4,)}, "score-correction bias"),
        ({"mixer.dt_bias": (2,)}, "linear-attention or state-space"),
        ({"mixer.conv1d.weight": (16, 1, 4)}, "causal convolution"),
    ],
    ids=["q_a_proj", "kv_a_proj_with_mqa", "sinks", "e_score_correction_bias", "dt_bias", "conv1d"],
)
def test_arch_infer_refuses_each_kind_naming_the_weight(extra, needle, tmp_path, capsys):
    """A plain LLaMA-like layer stack with one such weight in its second layer only."""

    base = {
        "self_attn.q_proj.weight": (8, 8),
        "self_attn.k_proj.weight": (8, 8),
        "self_attn.v_proj.weight": (8, 8),
        "self_attn.o_proj.weight": (8, 8),
        "mlp.gate_proj.weight": (12, 8),
        "mlp.up_proj.weight": (12, 8),
        "mlp.down_proj.weight": (8, 12),
        "input_layernorm.weight": (8,),
    }
    shapes = {f"model.layers.{i}.{k}": s for i in range(3) for k, s in base.items()}
    shapes.update({f"model.layers.1.{k}": s for k, s in extra.items()})
    folder = tmp_path / "m"
    folder.mkdir()
    save_file({k: np.zeros(s, np.float32) for k, s in shapes.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(
        json.dumps(
            dict(
                model_type="mine",
                hidden_size=8,
                num_hidden_layers=3,
                num_attention_heads=2,
                intermediate_size=12,
                hidden_act="silu",
            )
        )
    )
    first = (
        sorted(extra)[0]
        if needle != "multi-head latent attention projection"
        else next(k for k in sorted(extra) if k.endswith("proj.weight") or k.endswith("mqa.weight"))
    )
    fix = (
        "no spec can describe it"
        if needle in ("linear-attention or state-space", "causal convolution")
        else "write the spec by hand"
    )
    line = assert_one_line_error(
        *run_cli(capsys, "infer", folder, command="arch"),
        [f"model.layers.1.{first} is", needle, "in layer 1 of 3:", fix],
    )
    # without it, the same stack drafts
    for k in extra:
        shapes.pop(f"model.layers.1.{k}")
    save_file({k: np.zeros(s, np.float32) for k, s in shapes.items()}, str(folder / "model.safetensors"))
    capsys.readouterr()

    assert main(["arch", "infer", str(folder)]) == 0, line


VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 40)
    | st.text(max_size=12)
    | st.sampled_from(["linear_attention", "mamba", "conv", "full_attention", "M", "*-M"]),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=20,
)
KEYS = [
    "layer_types",
    "layers_block_type",
    "hybrid_override_pattern",
    "linear_attn_config",
    "full_attn_idxs",
    "attn_layer_period",
    "attn_layer_offset",
    "full_attention_interval",
    "num_hidden_layers",
]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    model_type=st.sampled_from([t for f in refused_families() for t in f.model_types]),
    config=st.dictionaries(st.sampled_from(KEYS), VALUES | st.integers(10**5, 10**12), max_size=4),
    kda=st.lists(st.integers(-2, 50) | st.text(max_size=3), max_size=6),
)
def test_any_config_of_a_refused_family_is_one_line(model_type, config, kda):
    """Whatever config.json holds under the keys the rules read, the refusal is one line."""
    config = {**config, "model_type": model_type}
    if model_type == "kimi_linear" and "linear_attn_config" not in config:
        config["linear_attn_config"] = {"kda_layers": kda}
    with pytest.raises(SpecboundError) as info:
        spec_for_config(config)
    message = str(info.value)
    assert "\n" not in message and len(message) < 2000 and f"model_type={model_type!r}" in message


def test_a_spec_that_ignores_a_state_space_weight_is_refused(healthy, tmp_path, capsys):
    """A user's spec for a hybrid cannot make its linear-attention layers vanish by ignoring them: the
    tiny BERT with a Mamba-like A_log in two layers, and a spec ignoring it."""

    tensors = load_file(str(healthy / "model.safetensors"))
    for layer in (0, 1):
        tensors[f"encoder.layer.{layer}.mixer.A_log"] = np.zeros(4, np.float32)
    save_file(tensors, str(healthy / "model.safetensors"), metadata={"format": "pt"})
    spec = json.loads(resources.files("specbound.archs").joinpath("data", "bert.json").read_text())
    spec["ignore"] = [*spec.get("ignore", []), r"\.mixer\."]
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    needles = [
        "encoder.layer.0.mixer.A_log is a weight of a linear-attention or state-space block",
        "in layers 0-1,",
        f"the bert spec ({spec_file}) ignores it",
        "docs/families.md",
    ]
    line = assert_one_line_error(*run_cli(capsys, healthy, "--arch-spec", spec_file), needles)
    assert assert_api_error(needles, healthy, arch_spec=spec_file) == line.removeprefix("specbound: error: ")


@pytest.mark.parametrize(
    "bad",
    [
        {"types": "layer_types"},
        {"period": "p", "offset": "o"},
        {"all": True, "kept": "k"},
        {"cycle": "block_types", "refused": ["recurrent"]},
        {},
    ],
)
def test_a_malformed_refused_family_file_is_one_line(bad):
    raw = {
        "family": "f",
        "description": "d",
        "model_types": ["f"],
        "block": "b",
        "tensors": "t",
        "reason": "r",
        "layers": [bad],
    }
    with pytest.raises(SpecboundError, match=r"^x\.json: each 'layers' rule names exactly one of"):
        _parse(raw, "x.json")


def test_arch_infer_refuses_gpt_oss_sinks_naming_them(tmp_path, capsys):
    """transformers' own gpt-oss names: the sink logits are refused by name (a draft would ignore them),
    before the expert banks."""
    _names_only(
        "gpt_oss", dict(num_hidden_layers=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1), tmp_path / "m"
    )
    line = assert_one_line_error(
        *run_cli(capsys, "infer", tmp_path / "m", command="arch"),
        ["model.layers.0.self_attn.sinks is attention sinks", "in layers 0-1 of 2", "write the spec by hand"],
    )
    assert "gpt_oss" not in {f.family for f in refused_families()} and line
