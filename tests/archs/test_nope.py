"""Layers without rotary positions (NoPE) and Granite's multipliers (docs/theory.md 3e).

Which layers rotate is read from config.json by the spec's ``rotary.nope`` rule; the oracle is the model's
own attention module of each layer, built from the same config (SmolLM3's ``use_rope``, EXAONE 4's
``sliding_window is None or is_sliding``, Cohere2's ``sliding_window is not None``), over configs with and
without a window, explicit flag lists and the interval default.  Granite's folds are checked against the
same checkpoint read as a plain LLaMA: every OV and FF_out matrix scaled by ``r``, every QK by ``m sqrt(d_h)``.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import importlib
from importlib import resources

from support.families import save_family  # noqa: E402

import specbound  # noqa: E402
from specbound.archs import builtin_specs  # noqa: E402
from specbound.archs.rotary import rotary_layouts  # noqa: E402
from specbound.archs.spec import parse_spec  # noqa: E402
from specbound.errors import SpecboundError  # noqa: E402

SIZES = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    vocab_size=50,
    pad_token_id=0,
    max_position_embeddings=64,
)


def _modeling(name):
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


CASES = [  # (family, config class, attention class, module -> rotates, config kwargs)
    ("smollm3", "SmolLM3Config", "SmolLM3Attention", lambda a: bool(a.use_rope), dict(num_hidden_layers=8)),
    (
        "smollm3",
        "SmolLM3Config",
        "SmolLM3Attention",
        lambda a: bool(a.use_rope),
        dict(num_hidden_layers=7, no_rope_layer_interval=3),
    ),
    (
        "smollm3",
        "SmolLM3Config",
        "SmolLM3Attention",
        lambda a: bool(a.use_rope),
        dict(num_hidden_layers=4, no_rope_layers=[0, 1, 0, 1]),
    ),
    (
        "exaone4",
        "Exaone4Config",
        "Exaone4Attention",
        lambda a: a.sliding_window is None or a.is_sliding,
        dict(num_hidden_layers=8, sliding_window=8),
    ),
    (
        "exaone4",
        "Exaone4Config",
        "Exaone4Attention",
        lambda a: a.sliding_window is None or a.is_sliding,
        dict(num_hidden_layers=4, sliding_window=None, layer_types=["sliding_attention", "full_attention"] * 2),
    ),
    (
        "exaone4",
        "Exaone4Config",
        "Exaone4Attention",
        lambda a: a.sliding_window is None or a.is_sliding,
        dict(num_hidden_layers=6, sliding_window=8, sliding_window_pattern=3),
    ),
    (
        "cohere2",
        "Cohere2Config",
        "Cohere2Attention",
        lambda a: a.sliding_window is not None,
        dict(num_hidden_layers=8, sliding_window=8),
    ),
    (
        "cohere2",
        "Cohere2Config",
        "Cohere2Attention",
        lambda a: a.sliding_window is not None,
        dict(num_hidden_layers=4, sliding_window=None),
    ),
    (
        "cohere2",
        "Cohere2Config",
        "Cohere2Attention",
        lambda a: a.sliding_window is not None,
        dict(
            num_hidden_layers=5,
            sliding_window=8,
            layer_types=["full_attention", "sliding_attention"] * 2 + ["full_attention"],
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{sorted(c[4].items())}")
def test_each_layer_rotates_as_its_own_attention_module_decides(case):
    family, cfg, attn, rotates, extra = case
    transformers.logging.set_verbosity_error()
    config = getattr(transformers, cfg)(**SIZES, **extra)
    module = getattr(_modeling(family), attn)
    expected = [rotates(module(config, layer)) for layer in range(config.num_hidden_layers)]
    d = config.hidden_size // config.num_attention_heads
    saved = json.loads(config.to_json_string())
    layouts = rotary_layouts(builtin_specs()[family], saved, d, config.num_hidden_layers, where="m")
    got = [False] * config.num_hidden_layers if layouts is None else [r is not None for r in layouts]
    assert got == expected
    if family != "exaone4" or "layer_types" not in extra:  # the older form: no layer_types, the pattern decides
        legacy = {k: v for k, v in saved.items() if k not in ("layer_types", "no_rope_layers")}
        layouts = rotary_layouts(builtin_specs()[family], legacy, d, config.num_hidden_layers, where="m")
        if "no_rope_layers" not in extra and "layer_types" not in extra:
            assert ([False] * len(got) if layouts is None else [r is not None for r in layouts]) == expected


def test_a_model_with_nope_layers_analyses_them_as_plain_heads(tmp_path):
    """SmolLM3's NoPE layer: plain QK rows (sv_method not rotary), the by-layer record None there, named."""
    save_family("smollm3", tmp_path)
    a = specbound.analyze(tmp_path, threads=1)
    assert a.model["rotary"]["by_layer"][1] is None and a.model["rotary"]["by_layer"][0] is not None
    qk = a.matrices[a.matrices["role"] == "QK"]
    assert not qk[qk["layer"] == 1]["sv_method"].str.startswith("rotary").any()
    assert qk[qk["layer"] == 0]["sv_method"].str.startswith("rotary").all()
    entry = next(e for e in a.assumptions if e["name"] == "nope_layers")
    assert entry["applies"] and "layers 1 " in entry["effect"] and entry["kind"] == "convention"
    assert np.isfinite(a.bounds["spectral_adaptive"])


@pytest.mark.parametrize(
    "flags, message",
    [
        ([1], "no_rope_layers must list 0 or 1"),
        ([1, 2], "no_rope_layers must list 0 or 1"),
        ("yes", "no_rope_layers must list 0 or 1"),
    ],
)
def test_a_bad_flag_list_is_one_line(tmp_path, flags, message):
    save_family("smollm3", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["no_rope_layers"] = flags
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecboundError, match=message) as err:
        specbound.analyze(tmp_path, threads=1)
    assert "\n" not in str(err.value)


def test_missing_layer_types_without_a_pattern_is_one_line(tmp_path):
    save_family("cohere2", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layer_types"]
    config["sliding_window_pattern"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecboundError, match="sliding_window_pattern=0 is not a positive integer"):
        specbound.analyze(tmp_path, threads=1)


@pytest.mark.parametrize(
    "nope",
    [
        {"flags": 3},
        {"layer_types": [], "window_key": "w", "without_window": "rope"},
        {"layer_types": ["full"], "window_key": "w", "without_window": "maybe"},
        {"flags": "x", "layer_types": ["full"]},
        "no_rope_layers",
    ],
)
def test_a_bad_nope_rule_is_refused_when_the_spec_loads(nope):
    raw = json.loads(json.dumps({k: v for k, v in _llama_doc().items()}))
    raw["rotary"] = {"pairing": "half", "nope": nope}
    with pytest.raises(SpecboundError, match="'rotary' nope must be"):
        parse_spec(raw, "test.json")


def _llama_doc():
    return json.loads(resources.files("specbound.archs").joinpath("data/llama.json").read_text())


def test_granites_multipliers_scale_exactly_the_matrices_they_multiply(tmp_path):
    """The same weights read as Granite and as a plain LLaMA: OV and FF_out by r, QK by m sqrt(d_h), FF_gate,
    FF_up unchanged; each fold named."""
    save_family("granite", tmp_path / "granite")
    config = json.loads((tmp_path / "granite" / "config.json").read_text())
    r, m, d = config["residual_multiplier"], config["attention_multiplier"], config["hidden_size"] // 4
    granite = specbound.analyze(tmp_path / "granite", threads=1)
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "model.safetensors").write_bytes((tmp_path / "granite" / "model.safetensors").read_bytes())
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    llama = specbound.analyze(tmp_path / "llama", threads=1)
    factor = {"QK": m * d**0.5, "OV": r, "FF_out": r, "FF_gate": 1.0, "FF_up": 1.0}
    want = llama.matrices["role"].map(factor).to_numpy() * llama.matrices["frobenius_norm"].to_numpy()
    np.testing.assert_allclose(granite.matrices["frobenius_norm"].to_numpy(), want, rtol=1e-12)
    names = {e["name"] for e in granite.assumptions if e["applies"]}
    assert {
        "residual_multiplier_folded",
        "attention_multiplier_folded",
        "embedding_multiplier",
        "head_logit_scale",
    } <= names
    assert (
        not names
        & {"residual_multiplier_folded", "attention_multiplier_folded"}
        & {e["name"] for e in llama.assumptions if e["applies"]}
    )
