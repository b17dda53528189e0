"""Hostile flax_model.msgpack files: shapes with infinite, float or 2^63 entries, data that is not
bytes (an integer would make ``bytes(n)`` allocate n bytes), buffers that do not hold their shape,
two names for one parameter: one SpecboundError line each, never an OverflowError, an allocation or
a silent choice; any array leaf and byte edits of a real file: a result or one line."""

import copy
import functools
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load_file
from support.fuzz import EDITS, FUZZ, clean_outcome, mutate

import specbound
from specbound.errors import SpecboundError

msgpack = pytest.importorskip("msgpack")

DATA = Path(__file__).parents[1] / "io" / "data"
QUERY = ("encoder", "layer", "0", "attention", "self", "query")


@functools.cache
def _tree():
    """The committed Flax file's tree (arrays left as msgpack extensions), the query kernel of
    layer 0 stored as one plain array (the file chunks it)."""

    tree = msgpack.unpackb(
        (DATA / "tiny_bert_flax" / "flax_model.msgpack").read_bytes(), raw=False, strict_map_key=False
    )
    weight = load_file(str(DATA / "tiny_bert_safetensors" / "model.safetensors"))
    kernel = np.ascontiguousarray(next(v for k, v in weight.items() if "layer.0.attention.self.query.weight" in k).T)
    _module(tree)["kernel"] = _ext(kernel.shape, "float32", kernel.tobytes())
    return tree


@pytest.fixture
def tree():
    return copy.deepcopy(_tree())


def _module(tree):
    node = tree
    for key in QUERY:
        node = node[key]
    return node


def _ext(shape, dtype, data):
    return msgpack.ExtType(1, msgpack.packb((shape, dtype, data), use_bin_type=True))


def _analyse(tmp_path, tree):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(DATA / "tiny_bert_flax" / "config.json", folder / "config.json")
    (folder / "flax_model.msgpack").write_bytes(msgpack.packb(tree, use_bin_type=True))
    return clean_outcome(specbound.analyze, folder, threads=1)


def _with_kernel(tree, value):
    tree = copy.deepcopy(tree)
    _module(tree)["kernel"] = value
    return tree


def _chunked(shape, chunk):
    return {
        "__msgpack_chunked_array__": True,
        "shape": {str(i): d for i, d in enumerate(shape)},
        "chunks": {"0": chunk},
    }


GOOD = bytes(4096)
HOSTILE = {
    "shape_inf": (lambda t: _ext([math.inf, 32], "float32", GOOD), ["holds inf", "0..2^63-1"]),
    "shape_2e63": (lambda t: _ext([2**63, 32], "float32", GOOD), ["holds 9223372036854775808"]),
    "shape_2e64": (lambda t: _ext([2**64 - 1, 2**64 - 1], "float32", GOOD), ["18446744073709551615"]),
    "shape_negative": (lambda t: _ext([-32, -32], "float32", GOOD), ["holds -32"]),
    "shape_float": (lambda t: _ext([32.0, 32], "float32", GOOD), ["holds 32.0"]),
    "shape_bool": (lambda t: _ext([True, 32], "float32", GOOD), ["holds True"]),
    "shape_not_a_list": (lambda t: _ext(32, "float32", GOOD), ["not a list of dimensions"]),
    "data_2e63": (lambda t: _ext([32, 32], "float32", 2**63), ["data is a int, not bytes"]),
    "data_1e10": (lambda t: _ext([32, 32], "float32", 10**10), ["not bytes"]),
    "data_inf": (lambda t: _ext([32, 32], "float32", math.inf), ["data is a float"]),
    "data_short": (lambda t: _ext([32, 32], "float32", bytes(100)), ["needs 4,096 bytes", "holds 100"]),
    "data_long": (lambda t: _ext([32, 32], "float32", bytes(10_000)), ["holds 10,000"]),
    "dtype_not_utf8": (lambda t: _ext([32, 32], b"\xff\xfe", GOOD), ["not a dtype name"]),
    "not_three_fields": (lambda t: msgpack.ExtType(1, msgpack.packb([1, 2])), ["not (shape, dtype, bytes)"]),
    "chunk_shape_inf": (lambda t: _chunked([math.inf, 32], _module(t)["kernel"]), ["chunked array's shape"]),
    "chunk_shape_2e63": (lambda t: _chunked([2**63, 32], _module(t)["kernel"]), ["9223372036854775808"]),
    "chunk_shape_wrong": (lambda t: _chunked([64, 64], _module(t)["kernel"]), ["needs 16,384 bytes"]),
    "no_chunks": (
        lambda t: {"__msgpack_chunked_array__": True, "shape": {"0": 32}, "chunks": {}},
        ["missing or mixed chunks"],
    ),
    "chunks_not_a_map": (
        lambda t: {"__msgpack_chunked_array__": True, "shape": [32], "chunks": [1]},
        ["without its shape and chunks maps"],
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_flax_array_is_one_line(case, tree, tmp_path):
    make, needles = HOSTILE[case]
    outcome = _analyse(tmp_path, _with_kernel(tree, make(tree)))
    assert isinstance(outcome, SpecboundError), outcome
    for needle in needles:
        assert needle in str(outcome), (needle, str(outcome))


def test_the_fixture_tree_analyses(tree, tmp_path):
    """Each hostile tree differs from this one in one array: it must analyse to the committed file's numbers."""
    reference = specbound.analyze(DATA / "tiny_bert_flax", threads=1)
    assert _analyse(tmp_path, tree).bounds == pytest.approx(reference.bounds, rel=1e-12)


def test_kernel_and_weight_of_one_module_are_refused(tree, tmp_path):
    """``kernel`` and ``weight`` both become ``<module>.weight``: refused as the TF reader refuses
    two variables for one parameter, never one silently winning."""
    doubled = copy.deepcopy(tree)
    _module(doubled)["weight"] = copy.deepcopy(_module(doubled)["kernel"])
    outcome = _analyse(tmp_path, doubled)
    assert isinstance(outcome, SpecboundError)
    assert "two arrays map to the parameter 'encoder.layer.0.attention.self.query.weight'" in str(outcome)
    assert "query/kernel" in str(outcome) and "query/weight" in str(outcome)


def test_a_tree_nested_1000_deep_is_read_without_recursion(tree, tmp_path):
    deep = {"w": _module(tree)["bias"]}
    for _ in range(1000):
        deep = {"a": deep}
    nested = copy.deepcopy(tree)
    nested["deep"] = deep
    outcome = _analyse(tmp_path, nested)
    assert isinstance(outcome, SpecboundError) and "unaccounted tensors" in str(outcome)


# Any value msgpack can hold (its integers are 64-bit, signed or not).
MSGPACK_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@FUZZ
@given(
    shape=MSGPACK_VALUE | st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3),
    dtype=MSGPACK_VALUE
    | st.sampled_from([b"float32", b"float16", b"bfloat16", b"int8", b"V100000000", b"object", b"complex64"]),
    data=MSGPACK_VALUE,
)
def test_any_array_extension(tmp_path_factory, shape, dtype, data):
    outcome = _analyse(tmp_path_factory.mktemp("flax"), _with_kernel(_tree(), _ext(shape, dtype, data)))
    if not isinstance(outcome, Exception):
        assert all(math.isfinite(v) and v >= 0 for v in outcome.bounds.values())


@FUZZ
@given(edits=EDITS)
def test_mutated_flax_msgpack(tmp_path_factory, edits):
    folder = shutil.copytree(DATA / "tiny_bert_flax", tmp_path_factory.mktemp("flaxm") / "m")
    path = folder / "flax_model.msgpack"
    path.write_bytes(mutate(path.read_bytes(), edits))
    outcome = clean_outcome(specbound.analyze, folder, threads=1)
    if not isinstance(outcome, Exception):
        assert all(math.isfinite(v) and v >= 0 for v in outcome.bounds.values())
