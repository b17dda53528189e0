"""What a reader found out about a checkpoint (io.base.ReaderFacts) reaches the analysis by one route: every
wrapper (LoRA adapter, quantized model, tower view) forwards its inner checkpoint's facts whole, whatever
facts are declared, and the pipeline reads them from the checkpoint it analyses."""

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from specbound.archs.towers import TowerView
from specbound.io.base import WEIGHTS_NOTE, ReaderFacts
from specbound.io.lora import LoraCheckpoint
from specbound.io.pytorch import TensorMapCheckpoint
from specbound.io.quantized import QuantizedCheckpoint


def _every_fact_set() -> ReaderFacts:
    """Facts with every declared field away from its default (a sentinel object each, notes a real mapping),
    so a wrapper that drops, resets or forgets one -- a field added later included -- is caught."""
    notes = {"reader_assumed": "one sentence of what the reader assumed"}
    facts = ReaderFacts(**{f.name: notes if f.name == "notes" else object() for f in fields(ReaderFacts)})
    assert all(getattr(facts, f.name) != getattr(ReaderFacts(), f.name) for f in fields(ReaderFacts))
    return facts


@pytest.fixture
def base():
    ckpt = TensorMapCheckpoint("base", {"model_type": "bert"}, {"encoder.query.weight": np.eye(2)})
    ckpt.set_facts(**{f.name: getattr(_every_fact_set(), f.name) for f in fields(ReaderFacts)})
    return ckpt


def test_a_lora_adapter_forwards_every_fact_but_the_source(base):
    """The adapter's source is its own folder (or hub id, set by the opener), not its base's."""
    factors = TensorMapCheckpoint(
        "adapter",
        {},
        {
            "base_model.model.encoder.query.lora_A.weight": np.ones((1, 2)),
            "base_model.model.encoder.query.lora_B.weight": np.ones((2, 1)),
        },
    )
    adapter = LoraCheckpoint(Path("adapter"), {"r": 1, "lora_alpha": 1}, factors, base, "base", "given")
    assert list(adapter.updates) == ["encoder.query.weight"]
    assert adapter.facts == replace(base.facts, hub_source=None)


def test_a_quantized_model_forwards_every_fact_with_its_quantization_noted_first(base):
    quantized = QuantizedCheckpoint(stored_ckpt=base, method="gptq", description="4-bit GPTQ", modules={})
    assert list(quantized.facts.notes) == [WEIGHTS_NOTE, *base.facts.notes]
    assert "4-bit GPTQ" in quantized.facts.notes[WEIGHTS_NOTE]
    assert replace(quantized.facts, notes=base.facts.notes) == base.facts


def test_a_tower_view_shares_its_checkpoint_facts(base):
    assert TowerView(base, {}, "text").facts is base.facts


def test_set_facts_changes_only_what_it_names(base):
    before = base.facts
    base.set_facts(hub_source="org/name@0123")
    assert base.facts == replace(before, hub_source="org/name@0123")
