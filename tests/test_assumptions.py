"""Every analysis says where the model departs from the theorem's (JSON ``assumptions``, the text
summary), so a reader can tell which numbers are theorems and which are proxies."""

import json

import numpy as np
import pytest

import specbound
from specbound.archs.model import ModelDims
from specbound.bounds.assumptions import AssumptionContext, assumptions, is_theorem
from specbound.compute.propagation import LayerSpectralNorms, layer_lipschitz

BERT = ModelDims(L=2, N=16, H=4, H_kv=4, d_head=4, d_ff=24)


def _applying(entries):
    return {e["name"] for e in entries if e["applies"]}


def test_bert_breaks_the_theorems_own_assumptions_and_uses_no_extension():
    entries = assumptions(AssumptionContext(BERT))
    assert {e["name"] for e in entries} >= {
        "no_residual_connections",
        "normalisation_as_projection",
        "unit_norm_inputs",
        "fixed_embeddings_and_head",
        "iid_samples",
    }
    applying = _applying(entries)
    assert {"no_residual_connections", "normalisation_as_projection", "unit_norm_inputs"} <= applying
    assert not applying & {
        "gated_feed_forward",
        "parallel_block",
        "grouped_query_attention",
        "shared_weights",
        "rotary_positions",
        "iid_samples",
    }
    assert not is_theorem(entries)  # residual connections alone make every number a proxy
    assert all(set(e) == {"name", "applies", "kind", "effect"} and e["effect"] for e in entries)


@pytest.mark.parametrize(
    "dims, flags, expected",
    [
        (
            ModelDims(L=2, N=16, H=4, H_kv=2, d_head=4, d_ff=24, feed_forward="gated"),
            dict(rotary=True),
            {"gated_feed_forward", "grouped_query_attention", "rotary_positions"},
        ),
        (
            ModelDims(L=2, N=16, H=4, H_kv=4, d_head=4, d_ff=24, block="parallel"),
            dict(rotary=True),
            {"parallel_block", "rotary_positions"},
        ),
        (
            ModelDims(L=4, N=16, H=4, H_kv=4, d_head=4, d_ff=24, stored=(0, 0, 1, 1)),
            dict(gap=True),
            {"shared_weights", "iid_samples"},
        ),
    ],
)
def test_each_extension_is_named_when_it_is_used(dims, flags, expected):
    entries = assumptions(AssumptionContext(dims, **flags))
    assert expected <= _applying(entries)
    assert {e["name"] for e in entries if e["kind"] == "extension" and e["applies"]} == expected - {"iid_samples"} | (
        {"gap_forms"} if flags.get("gap") else set()
    )


@pytest.mark.parametrize(
    "dims, form",
    [
        (BERT, "Lambda = L_phi c(FF_in) c(FF_out) sum_h c(OV_h)(1 + 4 c(QK_h))"),
        (
            ModelDims(L=2, N=16, H=4, H_kv=2, d_head=4, d_ff=24, feed_forward="gated"),
            "Lambda = (L_phi + c_phi) c(FF_gate) c(FF_up) c(FF_out) sum_h c(OV_h)(1 + 4 c(QK_h))",
        ),
        (
            ModelDims(L=2, N=16, H=4, H_kv=4, d_head=4, d_ff=24, block="parallel"),
            "Lambda = sum_h c(OV_h)(1 + 4 c(QK_h)) + L_phi c(FF_in) c(FF_out)",
        ),
        (
            ModelDims(L=2, N=16, H=4, H_kv=4, d_head=4, d_ff=24, block="parallel", feed_forward="gated"),
            "Lambda = sum_h c(OV_h)(1 + 4 c(QK_h)) + (L_phi + c_phi) c(FF_gate) c(FF_up) c(FF_out)",
        ),
    ],
)
def test_each_family_is_told_its_own_layer_form(dims, form):
    """The Lambda the assumptions print is the one compute.propagation.layer_lipschitz uses."""

    entry = next(e for e in assumptions(AssumptionContext(dims)) if e["name"] == "multi_head_layer_form")
    assert entry["effect"].startswith(form)
    # the printed form, evaluated by hand, is the code's
    qk, ov, l_phi = np.array([0.5, 0.1]), np.array([0.7, 0.9]), 1.3
    ff = (
        {"FF_gate": 2.0, "FF_up": 3.0, "FF_out": 5.0} if dims.feed_forward == "gated" else {"FF_in": 2.0, "FF_out": 5.0}
    )
    attention = float(np.sum(ov * (1 + 4 * qk)))
    feed_forward = (l_phi + 1.0) * 30.0 if dims.feed_forward == "gated" else l_phi * 10.0
    expected = attention + feed_forward if dims.block == "parallel" else attention * feed_forward
    assert layer_lipschitz(LayerSpectralNorms(qk, ov, ff, dims.block), l_phi) == pytest.approx(expected)


def test_iid_samples_is_a_condition_not_a_broken_assumption(tiny_bert_dir):
    entries = assumptions(AssumptionContext(BERT, gap=True))
    kinds = {e["name"]: e["kind"] for e in entries}
    assert kinds["iid_samples"] == "condition" and kinds["gap_forms"] == "extension"
    text = str(specbound.analyze(tiny_bert_dir, threads=1, n=1000, margin=0.5))
    broken = next(line for line in text.splitlines() if "broken by this model" in line)
    assert "iid_samples" not in broken and "no_residual_connections" in broken
    assert "iid_samples" in next(line for line in text.splitlines() if "conditions" in line)


def test_the_activation_constant_is_stated(tiny_bert_dir):
    a = specbound.analyze(tiny_bert_dir, threads=1)
    entry = next(e for e in a.assumptions if e["name"] == "activation_constant")
    assert entry["applies"] and f"L_phi = {a.options['l_phi']:g}" in entry["effect"]
    user = specbound.analyze(tiny_bert_dir, threads=1, l_phi=2.0)
    assert "as given (--l-phi)" in next(e for e in user.assumptions if e["name"] == "activation_constant")["effect"]


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
