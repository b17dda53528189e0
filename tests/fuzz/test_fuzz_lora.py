"""PEFT LoRA adapters under attack, and merged exactly as PEFT merges them.

* ``fan_in_fan_out`` as PEFT applies it: reset to False for an ``nn.Linear`` (PEFT warns and merges
  ``B A``; a square Linear used to be merged as ``(B A)^T``), set for GPT-2's ``Conv1D``: every
  tensor read equals ``merge_and_unload()``'s.
* Two factors for one module (``base_model.model.X.lora_A.weight`` and ``X.lora_A.weight``), rank-0
  factors, and every config value of the wrong type or out of range (``lora_alpha`` 1e308, an
  ``alpha_pattern`` value of 1e300, 20,000 pattern keys, ``target_modules`` an object) are one line
  within seconds; ``base_model_name_or_path`` is read from the adapter's folder and stays within
  the folder holding it.
"""

import json
import math
import shutil
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file
from support.fuzz import FUZZ, JSON, clean_outcome, time_limit
from support.peft_models import build_adapter, tiny_bert, tiny_gpt2

from specbound.errors import SpecboundError
from specbound.io import open_checkpoint
from specbound.pipeline import open_models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


_bert, _gpt2 = tiny_bert, tiny_gpt2


def build(root, make, seed=0, **lora):
    """``(base, adapter, merged tensors)``: :func:`build_adapter`'s folders, PEFT's own
    ``merge_and_unload()`` read back as float64 arrays."""

    base, adapter, merged = build_adapter(root, make, seed=seed, **lora)
    return base, adapter, load_file(str(merged / "model.safetensors"))


def assert_reads_as_peft_merges(adapter, base, merged, adapted):
    """Opened as an analysis opens it (the family spec bound, which orients square updates by their
    module's kind), every adapted tensor is PEFT's merged tensor."""

    ckpt = open_models(adapter, base=base)[0].opened_checkpoint
    try:
        for suffix in adapted:  # the same tensor under each one's names (GPT-2's transformer. prefix)
            [ours] = [n for n in ckpt.names if n == suffix or n.endswith("." + suffix)]
            [theirs] = [k for k in merged if k == suffix or k.endswith("." + suffix)]
            assert ours in ckpt.updates, ours
            np.testing.assert_allclose(ckpt.read(ours), merged[theirs], rtol=1e-12, atol=1e-14, err_msg=ours)
    finally:
        ckpt.close()


def test_fan_in_fan_out_on_a_square_linear_is_reset_as_peft_resets_it(tmp_path):
    base, adapter, merged = build(
        tmp_path, _bert, r=2, lora_alpha=4, fan_in_fan_out=True, target_modules=["query", "value"]
    )
    # PEFT resets the flag before saving; an adapter config written by hand (or an older PEFT) keeps it
    cfg_path = adapter / "adapter_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "fan_in_fan_out": True}))
    names = ["encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.value.weight"]
    assert_reads_as_peft_merges(adapter, base, merged, names)
    # the transposed update would differ: the test is not blind to the orientation; read without a
    # family spec, the update follows the flag (what PEFT saves, right for every adapter it wrote)
    ckpt = open_checkpoint(adapter, base=base)
    p, q = ckpt.delta_factors(names[0])
    assert not np.allclose(p @ q, (p @ q).T) and ckpt.updates[names[0]].transposed
    ckpt.close()


@pytest.mark.parametrize("flag", [False, True])
def test_gpt2_conv1d_is_merged_transposed_whatever_the_flag(tmp_path, flag):
    """GPT-2's square attn.c_proj (Conv1D, stored (in, out)): PEFT sets fan_in_fan_out and merges
    (B A)^T, also when the adapter's config says false."""
    base, adapter, merged = build(
        tmp_path, _gpt2, seed=1, r=2, lora_alpha=4, fan_in_fan_out=flag, target_modules=["c_proj", "c_attn"]
    )
    cfg_path = adapter / "adapter_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "fan_in_fan_out": flag}))
    assert_reads_as_peft_merges(
        adapter, base, merged, ["h.0.attn.c_proj.weight", "h.0.attn.c_attn.weight", "h.0.mlp.c_proj.weight"]
    )


def test_rank_and_alpha_patterns_are_merged_as_peft_merges(tmp_path):
    base, adapter, merged = build(
        tmp_path,
        _bert,
        seed=4,
        r=2,
        lora_alpha=4,
        rank_pattern={"value": 3},
        alpha_pattern={"value": 9},
        target_modules=["query", "value"],
    )
    assert_reads_as_peft_merges(
        adapter, base, merged, ["layer.0.attention.self.query.weight", "layer.0.attention.self.value.weight"]
    )


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return build(tmp_path_factory.mktemp("lora"), _bert, seed=3, r=2, lora_alpha=2, target_modules=["query", "value"])


def copy_adapter(small, root, edit_config=None, edit_tensors=None):
    base, adapter, _ = small
    out = root / "adapter"
    shutil.copytree(adapter, out)
    if edit_config is not None:
        cfg = json.loads((out / "adapter_config.json").read_text())
        edit_config(cfg)
        (out / "adapter_config.json").write_text(json.dumps(cfg))
    if edit_tensors is not None:
        tensors = load_file(str(out / "adapter_model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(out / "adapter_model.safetensors"))
    return base, out


def opened(adapter, base):
    """Open the adapter with its base and read one adapted tensor; the tensor or the error."""

    def run():
        ckpt = open_checkpoint(adapter, base=base)
        try:
            return ckpt.read("encoder.layer.0.attention.self.query.weight")
        finally:
            ckpt.close()

    return clean_outcome(run)


def _duplicate(tensors):
    for key in [k for k in tensors if "lora_A" in k]:
        tensors[key.replace("base_model.model.", "")] = tensors[key] + 1.0


def _rank_zero(tensors):
    for key in list(tensors):
        if "query.lora_A" in key:
            tensors[key] = np.zeros((0, tensors[key].shape[1]), tensors[key].dtype)
        elif "query.lora_B" in key:
            tensors[key] = np.zeros((tensors[key].shape[0], 0), tensors[key].dtype)


@pytest.mark.parametrize(
    "edit, needles",
    [(_duplicate, ["two lora_A factors", "encoder.layer.0"]), (_rank_zero, ["rank 0"])],
    ids=["duplicate", "rank_zero"],
)
def test_hostile_factors_are_one_line(small, tmp_path, edit, needles):
    base, adapter = copy_adapter(small, tmp_path, edit_tensors=edit)
    outcome = opened(adapter, base)
    assert isinstance(outcome, SpecboundError), outcome
    assert all(n in str(outcome) for n in needles), str(outcome)


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"lora_alpha": 1e308}, ["lora_alpha=1e+308", "at most 1e+06"]),
        ({"lora_alpha": float("inf")}, ["lora_alpha=inf"]),
        ({"lora_alpha": True}, ["lora_alpha=True"]),
        ({"r": 2.5}, ["r=2.5", "whole rank"]),
        ({"alpha_pattern": {"query": 1e300}}, ["alpha_pattern['query']=1e+300"]),
        ({"alpha_pattern": {"query": "3"}}, ["alpha_pattern['query']='3'"]),
        ({"alpha_pattern": ["query"]}, ["alpha_pattern as ['query']"]),
        ({"rank_pattern": {"query": 2.5}}, ["rank_pattern['query']=2.5"]),
        ({"alpha_pattern": {f"m{i}": 1 for i in range(20_000)}}, ["20,000 keys", "at most 1,000"]),
        ({"target_modules": {"query": 1}}, ["target_modules="]),
        ({"modules_to_save": 3}, ["modules_to_save=3"]),
        ({"use_rslora": "yes"}, ["use_rslora='yes'"]),
        ({"alpha_pattern": {"(a+)+$" + "x" * 30: 2}}, []),
        ({"r": 4}, ["have rank 2", "declares r=4"]),
        ({"rank_pattern": {"query": 3}}, ["attention.self.query", "declares r=3"]),
    ],
)
def test_hostile_config_values_are_one_line(small, tmp_path, change, needles):
    base, adapter = copy_adapter(small, tmp_path, edit_config=lambda c: c.update(change))
    started = time.perf_counter()
    outcome = opened(adapter, base)
    assert time.perf_counter() - started < 10
    if needles:
        assert isinstance(outcome, SpecboundError), outcome
        assert all(n in str(outcome) for n in needles), str(outcome)
    else:
        assert isinstance(outcome, SpecboundError) or np.isfinite(outcome).all()


def test_a_thousand_pattern_keys_are_matched_in_linear_time(small, tmp_path):
    patterns = {f"other{i}": 7 for i in range(999)} | {"query": 6}
    base, adapter = copy_adapter(small, tmp_path, edit_config=lambda c: c.update(alpha_pattern=patterns))
    with time_limit(10):
        ckpt = open_checkpoint(adapter, base=base)
    assert ckpt.updates["encoder.layer.0.attention.self.query.weight"].scale == 3.0
    assert ckpt.updates["encoder.layer.0.attention.self.value.weight"].scale == 1.0
    ckpt.close()


VALUES = st.one_of(JSON, st.sampled_from([math.inf, math.nan, 1e300, 1e308, -1, 0, 2**64, "8", True, [], {}]))


@FUZZ
@given(
    key=st.sampled_from(
        [
            "r",
            "lora_alpha",
            "alpha_pattern",
            "rank_pattern",
            "target_modules",
            "modules_to_save",
            "use_rslora",
            "fan_in_fan_out",
            "base_model_name_or_path",
        ]
    ),
    value=VALUES,
)
def test_any_config_value_is_merged_finite_or_one_line(small, tmp_path_factory, key, value):
    base, adapter = copy_adapter(small, tmp_path_factory.mktemp("f"), edit_config=lambda c: c.update({key: value}))
    outcome = opened(adapter, base)
    if not isinstance(outcome, SpecboundError):
        assert np.isfinite(outcome).all()


def test_the_base_it_names_is_read_from_the_adapter_folder(small, tmp_path, monkeypatch):
    base, adapter, merged = small
    root = tmp_path / "models"
    shutil.copytree(base, root / "base")
    _, moved = copy_adapter(small, root, edit_config=lambda c: c.update(base_model_name_or_path="../base"))
    monkeypatch.chdir(tmp_path)  # "../base" from here is nothing: the adapter's folder decides
    ckpt = open_checkpoint(moved)
    try:
        assert ckpt.base_ckpt.location.startswith(str(root / "adapter" / ".." / "base"))
    finally:
        ckpt.close()
    assert_reads_as_peft_merges(moved, None, merged, ["encoder.layer.0.attention.self.query.weight"])


def test_a_relative_base_leading_outside_is_refused(small, tmp_path):
    base, _, _ = small
    shutil.copytree(base, tmp_path / "outside" / "base")
    nest = tmp_path / "a" / "b"
    nest.mkdir(parents=True)
    _, adapter = copy_adapter(
        small, nest, edit_config=lambda c: c.update(base_model_name_or_path="../../../outside/base")
    )
    outcome = clean_outcome(open_checkpoint, adapter)
    assert isinstance(outcome, SpecboundError) and "leads outside the folder holding the adapter" in str(outcome)
