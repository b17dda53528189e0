"""Every analysis says where the model departs from the theorem's (JSON ``assumptions``, the text
summary), so a reader can tell which numbers are theorems and which are proxies."""

import json

import pytest

import specbound
from specbound.archs.model import ModelDims
from specbound.bounds.assumptions import assumptions, is_theorem

BERT = ModelDims(L=2, N=16, H=4, H_kv=4, d_head=4, d_ff=24)


def _applying(entries):
    return {e["name"] for e in entries if e["applies"]}


def test_bert_breaks_the_theorems_own_assumptions_and_uses_no_extension():
    entries = assumptions(BERT, "bert", rotary=False, init=False, gap=False)
    assert {e["name"] for e in entries} >= {"no_residual_connections", "normalisation_as_projection",
                                           "unit_norm_inputs", "fixed_embeddings_and_head", "iid_samples"}
    applying = _applying(entries)
    assert {"no_residual_connections", "normalisation_as_projection", "unit_norm_inputs"} <= applying
    assert not applying & {"gated_feed_forward", "parallel_block", "grouped_query_attention", "shared_weights",
                           "rotary_positions", "iid_samples"}
    assert not is_theorem(entries)  # residual connections alone make every number a proxy
    assert all(set(e) == {"name", "applies", "kind", "effect"} and e["effect"] for e in entries)


@pytest.mark.parametrize("dims, flags, expected", [
    (ModelDims(L=2, N=16, H=4, H_kv=2, d_head=4, d_ff=24, feed_forward="gated"), dict(rotary=True),
     {"gated_feed_forward", "grouped_query_attention", "rotary_positions"}),
    (ModelDims(L=2, N=16, H=4, H_kv=4, d_head=4, d_ff=24, block="parallel"), dict(rotary=True, init=True),
     {"parallel_block", "rotary_positions", "rotary_distance_from_init"}),
    (ModelDims(L=4, N=16, H=4, H_kv=4, d_head=4, d_ff=24, stored=(0, 0, 1, 1)), dict(gap=True),
     {"shared_weights", "iid_samples"}),
])
def test_each_extension_is_named_when_it_is_used(dims, flags, expected):
    entries = assumptions(dims, "x", **{"rotary": False, "init": False, "gap": False, **flags})
    assert expected <= _applying(entries)
    assert {e["name"] for e in entries if e["kind"] == "extension" and e["applies"]} == \
        expected - {"iid_samples"}


def test_every_output_carries_the_list(tiny_bert_dir):
    a = specbound.analyze(tiny_bert_dir, threads=1, n=1000, margin=0.5)
    doc = json.loads(a.to_json())
    assert doc["assumptions"] == a.assumptions and "iid_samples" in _applying(doc["assumptions"])
    text = str(a)
    assert "not a theorem" in text and "no_residual_connections" in text
    assert "unpaid_unions" in doc["gap_bound"] and len(doc["gap_bound"]["unpaid_unions"]) == 3
    # no rotary positions: no rotation-blind variants (they would only repeat the headline)
    assert "spectral_adaptive_rotation_blind" not in a.adaptive_variants and "edelman_rotation_blind" not in a.baselines
    assert a.model["rotary"] is None
