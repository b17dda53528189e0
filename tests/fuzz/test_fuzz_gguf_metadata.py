"""GGUF metadata through the one vocabulary of checked numbers: a count is a non-negative integer of
at most 2^53, a number a finite one of magnitude at most 1e300, and ``block_count`` is checked
against the blocks the file holds tensors of before anything is sized by it (a Gemma 3 file
declaring 4e9 or 2^63 blocks built a per-layer list first).  Every metadata value of any GGUF type
ends in a result or one line, within seconds."""

import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import specbound
from support.fuzz import FUZZ, clean_outcome
from support.gguf_bytes import ARR, BOOL, F32, F64, I32, LLAMA, STR, U32, U64, gguf_file
from specbound.errors import SpecboundError

pytest.importorskip("gguf")


def arch(metadata, name):
    """``metadata`` of another architecture (the keys renamed)."""
    return [("general.architecture", STR, name)] + [(k.replace("llama.", f"{name}."), t, v) for k, t, v in metadata[1:]]


def with_key(metadata, key, kind, value):
    kept = [(k, t, v) for k, t, v in metadata if k != key]
    return [*kept, (key, kind, value)]


GEMMA3 = arch(LLAMA, "gemma3")


def _one_line(tmp_path, data, seconds=5.0):
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    started = time.perf_counter()
    outcome = clean_outcome(specbound.analyze, path, threads=1)
    assert time.perf_counter() - started < seconds
    return outcome


@pytest.mark.parametrize("name", ["gemma3", "llama", "qwen2", "llama4", "deepseek2"])
@pytest.mark.parametrize("kind, count", [(U32, 4_000_000_000), (U64, 2**63), (U64, 2**64 - 1), (U32, 2)])
def test_a_block_count_past_the_tensors_is_refused_before_any_list(tmp_path, name, kind, count):
    metadata = with_key(arch(LLAMA, name) if name != "llama" else LLAMA, f"{name}.block_count", kind, count)
    outcome = _one_line(tmp_path, gguf_file(metadata))
    assert isinstance(outcome, SpecboundError), outcome
    assert f"'{name}.block_count'" in str(outcome)
    assert "holds tensors of 1" in str(outcome) or "at most 2^53" in str(outcome)


@pytest.mark.parametrize(
    "kind, value", [(STR, "10000"), (ARR, (F32, [1.0, 2.0])), (BOOL, True), (F64, 1e301), (ARR, (STR, ["a"]))]
)
def test_gemma3_local_rope_base_of_the_wrong_type(tmp_path, kind, value):
    outcome = _one_line(tmp_path, gguf_file(with_key(GEMMA3, "gemma3.rope.freq_base_swa", kind, value)))
    assert isinstance(outcome, SpecboundError), outcome
    assert "'gemma3.rope.freq_base_swa' must hold a number" in str(outcome)


def test_a_good_local_rope_base_is_read(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_file(with_key(GEMMA3, "gemma3.rope.freq_base_swa", F32, 20000.0)))
    config = specbound.io.open_checkpoint(path).config
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 20000.0


KEYS = [
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.sliding_window",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.factor",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "attention.layer_norm_rms_eps",
]
VALUES = st.one_of(
    st.tuples(st.just(U32), st.integers(0, 2**32 - 1)),
    st.tuples(st.just(U64), st.integers(0, 2**64 - 1)),
    st.tuples(st.just(I32), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just(F32), st.floats(width=32)),
    st.tuples(st.just(F64), st.floats()),
    st.tuples(st.just(STR), st.text(max_size=8)),
    st.tuples(st.just(BOOL), st.booleans()),
    st.tuples(st.just(ARR), st.tuples(st.just(U32), st.lists(st.integers(0, 9), max_size=3))),
)


@FUZZ
@given(name=st.sampled_from(["llama", "gemma3"]), key=st.sampled_from(KEYS), value=VALUES)
def test_any_metadata_value_is_a_result_or_one_line(tmp_path_factory, name, key, value):
    kind, item = value
    base = LLAMA if name == "llama" else GEMMA3
    data = gguf_file(with_key(base, f"{name}.{key}", kind, item))
    outcome = _one_line(tmp_path_factory.mktemp("g"), data, seconds=10.0)
    if not isinstance(outcome, SpecboundError):
        assert all(math.isfinite(v) for v in outcome.bounds.values())


def _llama4_moe(base, experts, step=1):
    for key, value in (
        ("expert_count", experts),
        ("interleave_moe_layer_step", step),
        ("expert_feed_forward_length", 12),
        ("expert_used_count", 1),
    ):
        base = with_key(base, f"llama4.{key}", U64, value)
    return base


@pytest.mark.parametrize("experts", [2**40, 2**53, 10**6])
def test_an_expert_count_past_the_tensors_is_refused_before_any_list(tmp_path, experts):
    """The experts of the layers that hold them (Llama 4's: a list of layers, not every layer) are counted
    against the tensors the file holds before any expert's name is listed."""
    outcome = _one_line(tmp_path, gguf_file(_llama4_moe(arch(LLAMA, "llama4"), experts)))
    assert isinstance(outcome, SpecboundError), outcome
    assert "tensors in all" in str(outcome) or "expert" in str(outcome)


# the keys the llama4 and deepseek2 readers map to Hugging Face settings of their own (a llama4 file's MoE step
# and expert count, which size the layers holding experts; deepseek2's YaRN keys and latent sizes), over a
# llama file's tensors: whatever they hold, a result or one line
ARCH_KEYS = {
    "llama4": ["expert_count", "interleave_moe_layer_step", "attention.sliding_window", "block_count"],
    "deepseek2": [
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scaling.yarn_log_multiplier",
        "rope.scaling.yarn_attn_factor",
        "rope.scaling.yarn_ext_factor",
        "rope.scaling.original_context_length",
        "attention.key_length_mla",
        "rope.dimension_count",
    ],
}


@FUZZ
@given(name=st.sampled_from(sorted(ARCH_KEYS)), data=st.data(), value=VALUES)
def test_any_value_of_an_architectures_own_keys_is_a_result_or_one_line(tmp_path_factory, name, data, value):
    key = data.draw(st.sampled_from(ARCH_KEYS[name]))
    kind, item = value
    base = arch(LLAMA, name)
    if name == "llama4":
        base = _llama4_moe(base, 4)
    else:
        base = with_key(
            with_key(base, "deepseek2.rope.scaling.type", STR, "yarn"), "deepseek2.rope.scaling.factor", F32, 4.0
        )
    outcome = _one_line(
        tmp_path_factory.mktemp("g"), gguf_file(with_key(base, f"{name}.{key}", kind, item)), seconds=10.0
    )
    if not isinstance(outcome, SpecboundError):
        assert all(math.isfinite(v) for v in outcome.bounds.values())
