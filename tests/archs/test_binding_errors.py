"""Checkpoints whose tensors do not match their config or family, refused when the family is bound
to the checkpoint (archs/binding.py) before any number is computed."""

import numpy as np
import pytest
from support.one_line import assert_broken_checkpoint_error, edit_tensors, write_config

from specbound import SpecboundError
from specbound.archs import spec_for_config


def missing_tensor(d):
    edit_tensors(d, lambda t: t.pop("encoder.layer.1.output.dense.weight"))
    return d, ["missing tensor 'encoder.layer.1.output.dense.weight'", "layer 1", "2 layers"]


def config_says_more_layers(d):
    write_config(d, num_hidden_layers=3)
    return d, ["missing tensor 'encoder.layer.2.", "3 layers"]


def no_layer_tensors(d):  # layer tensors under other names: not this family's layout
    edit_tensors(d, lambda t: t.update({k.replace("encoder.layer.", "encoder.block."): t.pop(k) for k in list(t)}))
    return d, [
        "encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.0",
        "--arch-spec",
        "specbound arch infer SOURCE",
    ]


def two_wrapped_models(d):  # a wrapper prefix is accepted only when it is unambiguous
    def edit(t):
        for k in list(t):
            t["student." + k] = t[k].copy()
            t["teacher." + k] = t.pop(k)

    edit_tensors(d, edit)
    return d, ["ambiguous", "'student.'", "'teacher.'"]


def ff_size_mismatch(d):
    write_config(d, intermediate_size=64)  # the tensors are 48 wide
    return d, ["'encoder.layer.0.intermediate.dense.weight'", "(48, 32)", "ff_size=64", "(64, 32)"]


def hidden_size_mismatch(d):
    write_config(d, hidden_size=64)  # the tensors are 32 wide
    return d, ["'encoder.layer.0.attention.self.query.weight'", "(32, 32)", "hidden_size=64", "(64, 64)"]


def heads_do_not_divide(d):
    write_config(d, num_attention_heads=5)
    return d, ["hidden_size=32", "num_heads=5"]


def config_not_an_integer(d):
    write_config(d, num_hidden_layers="two")
    return d, ["num_hidden_layers", "'two'"]


def stray_tensor(d):
    edit_tensors(d, lambda t: t.update({"encoder.layer.0.attention.adapter.weight": np.ones((4, 4), np.float32)}))
    return d, ["unaccounted", "encoder.layer.0.attention.adapter.weight", "ignore", "--arch-spec"]


def config_says_absurdly_many_layers(d):
    """num_hidden_layers = 10**30: every layer's tensor names were listed before any was checked
    (memory grew without limit); now the count is bounded by the tensors present first."""
    write_config(d, num_hidden_layers=10**30)
    return d, [f"config.json says {10**30} layers", "tensors in all"]


EXTRACT_CASES = [
    missing_tensor,
    config_says_more_layers,
    no_layer_tensors,
    two_wrapped_models,
    ff_size_mismatch,
    hidden_size_mismatch,
    heads_do_not_divide,
    config_not_an_integer,
    stray_tensor,
    config_says_absurdly_many_layers,
]


@pytest.mark.parametrize("breaker", EXTRACT_CASES, ids=[f.__name__ for f in EXTRACT_CASES])
def test_broken_checkpoint(breaker, healthy, capsys):
    assert_broken_checkpoint_error(breaker, healthy, capsys)


def test_shared_layer_depth_is_bounded():
    """ALBERT's depth is not bounded by its stored tensors: a 10**30-deep stack is refused by its spec."""

    spec = spec_for_config({"model_type": "albert"})
    assert spec.stored_layers({"num_hidden_groups": 1}, 12) == [0] * 12
    with pytest.raises(SpecboundError, match="at most 100,000"):
        spec.stored_layers({"num_hidden_groups": 1}, 10**30)
