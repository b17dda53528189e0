"""Fuzzing the documents a user or a disk hands the tool besides checkpoints: arch spec files, sweep
configs, source patterns and stored records.  Each ends in a value or one SpecboundError line; a
damaged record is set aside with a warning and never stops a reader."""

import json
import shutil
import warnings
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import EDITS, FUZZ, JSON, clean_outcome, mutate

from specbound.archs import parse_spec
from specbound.report.scaling import scaling_table
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import Pattern, Source, load_sweep_config
from specbound.sweep.store import Store

BERT_SPEC = json.loads(resources.files("specbound.archs").joinpath("data", "bert.json").read_text())


@FUZZ
@given(
    path=st.lists(
        st.sampled_from(
            [
                "family",
                "config",
                "tensors",
                "q",
                "name",
                "layout",
                "ignore",
                "block",
                "feed_forward",
                "block_switch",
                "shared_layers",
                "prefixes",
                "fused",
                "num_layers",
                "description",
                "ff_size_multiplier",
            ]
        ),
        min_size=1,
        max_size=3,
    ),
    value=JSON,
)
def test_arch_spec_values(path, value):
    """A JSON value put anywhere in the shipped BERT spec: parsed, or refused in one line."""

    spec = json.loads(json.dumps(BERT_SPEC))
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else node
    node[path[-1]] = value
    clean_outcome(parse_spec, spec, "fuzzed.json")


@FUZZ
@given(pattern=st.text(alphabet="abc^$()[]{}|.*+?\\\\wd0123456789,-", max_size=30))
def test_ignore_patterns(pattern):
    """Any ignore pattern: compiled and matched against real tensor names within the time limit,
    or refused in one line (invalid, or catastrophically slow)."""

    spec = clean_outcome(parse_spec, {**BERT_SPEC, "ignore": [pattern]}, "fuzzed.json")
    if not isinstance(spec, Exception):
        for name in ("encoder.layer.0.attention.self.query.weight", "bert.pooler.dense.bias", "x" * 200):
            clean_outcome(spec.is_ignored, name, "bert.")


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200))
def test_sweep_configs(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("toml") / "sweep.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    clean_outcome(load_sweep_config, path)


@FUZZ
@given(
    options=st.dictionaries(
        st.sampled_from(
            [
                "grid_m",
                "rank_tol",
                "l_phi",
                "method",
                "gram_rtol",
                "arch_spec",
                "n",
                "margin",
                "delta",
                "lead_constant",
                "confidence_constant",
            ]
        ),
        JSON,
        max_size=3,
    )
)
def test_sweep_config_options(tmp_path_factory, options):
    tomllib = pytest.importorskip("tomllib")
    del tomllib
    lines = ['sources = ["m"]', "[options]"]
    for key, value in options.items():
        lines.append(f"{key} = {json.dumps(value)}")
    path = tmp_path_factory.mktemp("opts") / "sweep.toml"
    path.write_text("\n".join(lines))
    clean_outcome(load_sweep_config, path)


@FUZZ
@given(
    pattern=st.text(alphabet="{}.,=*+-/%()0123456789LHAxyz_ ", max_size=40),
    candidate=st.text(alphabet="0123456789LHA_-xyz", max_size=20),
)
def test_source_patterns(pattern, candidate):
    parsed = clean_outcome(Pattern.parse, pattern)
    if not isinstance(parsed, Exception):
        clean_outcome(parsed.match, candidate)


@pytest.fixture(scope="module")
def one_record_store(tiny_family, tmp_path_factory):
    root = tmp_path_factory.mktemp("records") / "store"
    source = sorted(tiny_family.iterdir())[0]
    report = run_sweep([Source("m", str(source))], root, progress=False)
    assert len(report.written) == 1
    return root


@FUZZ
@given(
    target=st.sampled_from(
        ["record.json", "matrices.parquet", "layers.parquet", "singular_values.parquet", "curves.parquet"]
    ),
    edits=EDITS,
    replacement=st.none() | JSON,
)
def test_damaged_records(one_record_store, tmp_path_factory, target, edits, replacement):
    """Any damage to a stored record: readers see a sound record or none (with a warning), the
    table and the scaling fits never crash, and the damaged record is moved out of the way."""

    root = shutil.copytree(one_record_store, tmp_path_factory.mktemp("damaged") / "store")
    (folder,) = (root / "records").iterdir()
    path = folder / target
    if replacement is not None and target == "record.json":
        path.write_text(json.dumps(replacement))
    else:
        path.write_bytes(mutate(path.read_bytes(), edits))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = Store(root)
        table = clean_outcome(store.table)
        assert not isinstance(table, Exception)
        for key in store.keys():
            clean_outcome(store.load, key)
        clean_outcome(scaling_table, Store(root))
