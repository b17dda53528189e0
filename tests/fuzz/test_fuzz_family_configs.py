"""The config.json values a family reads beyond its dimensions (sliding windows, soft-caps, Gemma's
attention scalar) go through the one vocabulary of checked numbers (specbound.options.check_read):
null or absent is "not used"; a positive integer of at most 2^53 (a window) or a positive finite
number of at most 1e300 (a cap, a scalar) is read exactly; anything else (1e400 and Infinity, which
JSON decodes to inf, true, a string, a list, zero, a negative) is one line naming the key, never an
OverflowError and never ``inf`` in the assumptions."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.families import save_family
from support.fuzz import FUZZ, JSON, clean_outcome, time_limit
from support.one_line import assert_one_line_error, run_cli

import specbound
from specbound.archs.registry import builtin_specs
from specbound.archs.structure import CONFIG_VALUED, model_structure
from specbound.errors import SpecboundError
from specbound.options import MAX_COUNT, MAX_SCALE

# (family, structure field, the config key it reads) of every shipped family, and whether it is a count
DECLARED = sorted(
    {
        (family, field, spec.structure[field])
        for family, spec in builtin_specs().items()
        for field in CONFIG_VALUED
        if spec.structure and field in spec.structure
    }
)
COUNTS = ("sliding_window", "attention_chunk")
HOSTILE = st.one_of(
    JSON,
    st.sampled_from(
        [
            math.inf,
            -math.inf,
            math.nan,
            True,
            False,
            "12",
            "",
            [4],
            {"a": 1},
            0,
            -1,
            0.0,
            2**53 + 1,
            2**63,
            10**400,
            1e301,
            4096.5,
        ]
    ),
    st.floats(),
    st.integers(-(2**70), 2**70),
)


def valid(value, integral: bool) -> bool:
    if isinstance(value, bool):
        return False
    if integral:
        return isinstance(value, int) and 1 <= value <= MAX_COUNT
    return (
        isinstance(value, (int, float))
        and not (isinstance(value, float) and math.isnan(value))
        and 0 < value <= MAX_SCALE
    )


def test_the_families_declare_every_kind_of_value():
    assert {field for _, field, _ in DECLARED} == set(CONFIG_VALUED)


@settings(FUZZ, max_examples=8 * FUZZ.max_examples)  # a pure function: microseconds an example
@given(declared=st.sampled_from(DECLARED), value=HOSTILE)
def test_every_structure_value_is_read_exactly_or_refused_in_one_line(declared, value):
    family, field, key = declared
    integral = field in COUNTS
    outcome = clean_outcome(model_structure, builtin_specs()[family].structure, {key: value}, "config.json of m")
    if value is None:
        assert getattr(outcome, field) is None
    elif valid(value, integral):
        got = getattr(outcome, field)
        assert got == (value if integral else float(value)) and math.isfinite(got)
        assert isinstance(got, int if integral else float)
    else:
        assert isinstance(outcome, SpecboundError), (value, outcome)
        assert key in str(outcome) and "config.json of m" in str(outcome)
        assert "at most" in str(outcome)


def test_a_window_the_config_does_not_use_is_not_checked_twice():
    """Qwen-style: use_sliding_window false switches a stated window off (it is still checked)."""
    declared = builtin_specs()["gemma2"].structure
    assert model_structure(declared, {"sliding_window": 4096, "use_sliding_window": False}).sliding_window is None
    with pytest.raises(SpecboundError, match="sliding_window"):
        model_structure(declared, {"sliding_window": math.inf, "use_sliding_window": False})


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    root = tmp_path_factory.mktemp("families")
    for name in ("gemma2", "gemma3_text", "modernbert"):
        save_family(name, root / name, layers=2)
    return root


def _with(folder, tmp_path, key, text):
    """A copy of ``folder`` whose config.json holds ``key`` as the raw JSON ``text`` (1e400, Infinity)."""
    out = tmp_path / folder.name
    out.mkdir()
    for item in folder.iterdir():
        (out / item.name).symlink_to(item)
    (out / "config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    config[key] = "@@"
    (out / "config.json").write_text(json.dumps(config).replace('"@@"', text))
    return out


@pytest.mark.parametrize(
    "family, key, text",
    [
        ("gemma2", "sliding_window", "1e400"),
        ("gemma3_text", "sliding_window", "1e400"),
        ("modernbert", "local_attention", "Infinity"),
        ("gemma2", "query_pre_attn_scalar", "1e400"),
        ("gemma2", "attn_logit_softcapping", "1e400"),
        ("gemma3_text", "query_pre_attn_scalar", "true"),
        ("gemma2", "final_logit_softcapping", '"30"'),
        ("modernbert", "local_attention", "128.5"),
    ],
)
def test_hostile_values_in_config_json(families, tmp_path, capsys, family, key, text):
    folder = _with(families / family, tmp_path, key, text)
    assert_one_line_error(*run_cli(capsys, folder, "--threads", "1"), [key, "config.json", "got"])


def test_an_extreme_but_finite_scalar_is_analysed_and_printed_finite(families, tmp_path, capsys):
    """1e300 is a number a config may hold: analysed, and the assumptions quote it (never inf)."""
    folder = _with(families / "gemma2", tmp_path, "query_pre_attn_scalar", "1e300")
    assert run_cli(capsys, folder, "--threads", "1", "--format", "json")[0] == 0
    capsys.readouterr()

    result = specbound.analyze(folder, threads=1)
    text = json.dumps(result.assumptions)
    assert "1e+300" in text and "inf" not in text.replace("information", "").replace("infer", "")


@pytest.fixture(scope="module")
def latent_and_banks(tmp_path_factory):
    """DeepSeek-V3 and V3.2 (latent attention), gpt-oss (expert banks), OLMo 3 (per-type rotary parameters)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    root = tmp_path_factory.mktemp("latent_and_banks")
    for name in ("deepseek_v3", "deepseek_v32", "gpt_oss", "olmo3"):
        save_family(name, root / name, layers=2)
    return root


@pytest.mark.parametrize(
    "family, key, change, needles",
    [
        # a latent rank off by one from the tensors: the config value and the tensor's shape, not an AttributeError
        (
            "deepseek_v3",
            "q_lora_rank",
            1,
            ["q_lora_rank=13", "q_a_layernorm.weight", "has shape (12,)", "implies (13,)"],
        ),
        ("deepseek_v3", "kv_lora_rank", -1, ["kv_lora_rank=9", "kv_a_layernorm.weight", "has shape (10,)"]),
        ("deepseek_v32", "q_lora_rank", -1, ["q_lora_rank=11", "has shape (12,)", "implies (11,)"]),
        ("deepseek_v32", "kv_lora_rank", 1, ["kv_lora_rank=11", "has shape (10,)"]),
        # an expert count past every tensor: refused by the router's and banks' shapes, without a loop over 10**12
        ("gpt_oss", "num_local_experts", 10**12, ["1000000000000 experts", "router.weight", "has shape (4, 32)"]),
        ("gpt_oss", "num_local_experts", 2**63, ["experts", "router.weight"]),
        # layer_types entries that are no type names (lists, objects, null), or too few
        ("olmo3", "layer_types", [["sliding_attention"], ["full_attention"]], ["layer_types", "type name"]),
        ("olmo3", "layer_types", [{"t": 1}, "full_attention"], ["layer_types", "type name"]),
        ("olmo3", "layer_types", [None, None], ["layer_types"]),
        ("olmo3", "layer_types", ["full_attention"], ["layer_types", "2 layers"]),
        ("olmo3", "layer_types", "full_attention", ["layer_types"]),
    ],
)
def test_config_values_the_tensors_contradict(latent_and_banks, tmp_path, capsys, family, key, change, needles):
    folder = latent_and_banks / family
    value = json.loads((folder / "config.json").read_text())[key]
    value = value + change if key.endswith("lora_rank") else change
    out = _with(folder, tmp_path, key, json.dumps(value))
    with time_limit():  # a loop over 10**12 experts fails here rather than hang
        result = run_cli(capsys, out, "--threads", "1")
    assert_one_line_error(*result, needles)
