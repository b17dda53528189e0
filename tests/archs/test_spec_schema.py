"""The spec document's keys, declared once on ArchSpec (archs/schema.py): each documented, each used by a
shipped family, each key of a shipped file declared for its kind of document, and each regular key's
constraint refusing in one line what it does not accept."""

import json
from importlib import resources
from pathlib import Path

import pytest

from specbound.archs.schema import declared, document_keys
from specbound.archs.spec import REFERENCE_KEYS, ROTARY_OPTIONS, TOWER_KEYS, ArchSpec, parse_spec
from specbound.errors import SpecboundError
from specbound.tools.doc_tables import blocks

DATA = resources.files("specbound.archs") / "data"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "architectures.md"


def _shipped():
    return {entry.name: json.loads(entry.read_text()) for entry in DATA.iterdir() if entry.name.endswith(".json")}


def _kind(doc) -> str:
    towers = doc.get("towers") or {}
    if any("family" in tower for tower in towers.values()):
        return "wrapper"
    return "towers" if towers else "stacks" if "stacks" in doc else "chain"


def test_every_declared_key_is_documented():
    """A row of docs/architectures.md's generated tables per declared key, rotary option and tower key, with
    its line."""
    found = blocks(DOCS.read_text())
    for d in declared(ArchSpec):
        assert d.meta["doc"].strip(), d.name
        assert f"\n| `{d.name}` | " in found["spec-keys"], d.name
    for block, keys in (("spec-keys", ROTARY_OPTIONS), ("tower-keys", TOWER_KEYS), ("wrapper-keys", REFERENCE_KEYS)):
        for name, doc in keys.items():
            assert doc.strip() and f"\n| `{name}` | " in found[block], (block, name)


def test_every_key_of_a_shipped_file_is_declared_for_its_document():
    """Each shipped file's keys, its variants' overrides and its towers' spec keys are declared for that kind
    of document, its rotary keys are rotary options; and every declared key is used by some shipped family."""
    used = set()
    for name, doc in _shipped().items():
        kind = _kind(doc)
        assert set(doc) <= document_keys(ArchSpec, kind), (name, kind, set(doc) - document_keys(ArchSpec, kind))
        for variant in doc.get("variants", []):
            overrides = set(variant) - {"when"}
            assert overrides <= document_keys(ArchSpec, "variant"), (name, overrides)
            used |= overrides
        towers = (doc.get("towers") or {}).values()
        assert all(set(t) <= set(REFERENCE_KEYS if kind == "wrapper" else TOWER_KEYS) for t in towers), name
        chains = [doc] + [t for t in towers if kind == "towers"]
        for chain in chains:
            assert set(chain.get("rotary") or {}) <= {"pairing", *ROTARY_OPTIONS}, name
        used |= set(doc) | {k for t in chains[1:] for k in t if k in document_keys(ArchSpec, "chain")}
    assert {d.name for d in declared(ArchSpec)} <= used


BERT = json.loads((DATA / "bert.json").read_text())
BART = json.loads((DATA / "bart.json").read_text())


@pytest.mark.parametrize(
    "key, value, needles",
    [
        ("family", "", ["'family' must be a non-empty string, found ''"]),
        ("description", 3, ["'description' must be a string, found 3"]),
        ("model_types", "bert", ["'model_types' must be a list of strings, found 'bert'"]),
        ("prefixes", [1], ["'prefixes' must be a list of strings, found [1]"]),
        ("block", "serial", ["'block' must be one of ['sequential', 'parallel'], found 'serial'"]),
        ("feed_forward", None, ["'feed_forward' must be one of ['plain', 'gated'], found None"]),
        ("ff_size_multiplier", 0, ["'ff_size_multiplier' must be a positive integer, found 0"]),
        ("ff_size_multiplier", True, ["'ff_size_multiplier' must be a positive integer, found True"]),
        ("shared_layers", {"inner_key": "x"}, ["'shared_layers' must be an object with 'groups_key'"]),
        ("alibi", 1, ["'alibi' must be true, false or a boolean config.json key, found 1"]),
        ("activation", ["gelu"], ["'activation' must be an activation name", "found ['gelu']"]),
        ("activation_names", {"a": 1}, ["'activation_names' must be an object mapping", "found {'a': 1}"]),
    ],
)
def test_a_regular_key_refuses_what_its_constraint_does_not_accept(key, value, needles):
    with pytest.raises(SpecboundError) as err:
        parse_spec({**BERT, key: value}, "fuzzed.json")
    message = str(err.value)
    assert "\n" not in message and message.startswith("invalid architecture spec fuzzed.json: ")
    assert all(n in message for n in needles), message


def test_an_absent_key_takes_its_declared_default():
    """Only the required keys given: every other field holds its declared default."""
    spec = parse_spec({k: BERT[k] for k in ("family", "model_types", "config", "tensors")}, "minimal.json")
    assert (spec.description, spec.prefixes, spec.block, spec.feed_forward, spec.ignore) == (
        "",
        ("",),
        "sequential",
        "plain",
        (),
    )
    assert (spec.alibi, spec.refuse, spec.rotary, spec.rotary_options, spec.experts) == (False, (), None, {}, None)


@pytest.mark.parametrize("config", [None, 3, ["d_model"]])
def test_a_stacked_spec_whose_shared_config_is_not_an_object_is_refused(config):
    """Was a TypeError (``'int' object is not a mapping``) from merging the stacks' configs."""
    with pytest.raises(SpecboundError, match=r"^invalid architecture spec bad\.json: 'config' must map fields"):
        parse_spec({**BART, "config": config}, "bad.json")


def test_keys_a_stacked_spec_does_not_support_are_named():
    with pytest.raises(
        SpecboundError, match="'shared_layers', 'rotary' and 'position_terms' are not supported with 'stacks'"
    ):
        parse_spec({**BART, "rotary": {"pairing": "half"}}, "bad.json")


def test_a_variant_may_not_override_the_family_keys():
    variant = {"when": {"x": 1}, "model_types": ["other"]}
    with pytest.raises(SpecboundError, match="variant 0 may not override 'family', 'model_types' or 'variants'"):
        parse_spec({**BERT, "variants": [variant]}, "bad.json")
