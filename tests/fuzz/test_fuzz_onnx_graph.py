"""Hostile graph hints in an ONNX export without config.json (io/onnx_graph.py, archs/graph_config.py):
non-integer or non-finite Reshape targets, huge or infinite scale constants, attributes that are not
UTF-8, contradictory Reshapes (refused with both pieces of evidence), and graph-hint constants stored
as external data (read from the model's folder under the weights' confinement, never from the
current directory).  Every outcome is a result whose head count the graph shows, or one line."""

import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import FUZZ, clean_outcome
from support.onnx_hints import H, N, bert_graph, save

import specbound
from specbound.errors import SpecboundError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, numpy_helper  # noqa: E402, TID253


def const(values, dtype):
    return numpy_helper.from_array(np.array(values, dtype))


def external(values, location, dims=None):
    """An int64 constant whose values live in the file ``location`` (relative to the model)."""
    tensor = numpy_helper.from_array(np.array(values, np.int64))
    tensor.ClearField("raw_data")
    if dims is not None:
        del tensor.dims[:]
        tensor.dims.extend(dims)
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return tensor


HOSTILE = {
    "reshape_nan": (
        dict(reshapes=[const([0, 0, np.nan, 4], np.float32)]),
        ["'shape0' = [0.0, 0.0, nan, 4.0]", "FLOAT"],
    ),
    "reshape_inf": (dict(reshapes=[const([0, 0, np.inf, 4], np.float64)]), ["inf", "DOUBLE", "not an int64 shape"]),
    "reshape_float": (dict(reshapes=[const([0, 0, 2.5, 4], np.float32)]), ["2.5", "not an int64 shape"]),
    "gelu_not_utf8": (dict(gelu_approximate=b"\xff\xfe"), ["Gelu node", "not UTF-8"]),
    "contradictory_reshapes": (
        dict(reshapes=[const([0, 0, 2, 4], np.int64), const([0, 0, 4, 2], np.int64)]),
        ["contradict", "[0, 0, 2, 4] (2 heads of 4)", "[0, 0, 4, 2] (4 heads of 2)"],
    ),
    "scale_1e300_only": (
        dict(reshapes=[], scale=const(1e300, np.float64)),
        ["does not show the number of attention heads"],
    ),
    "scale_inf_only": (dict(reshapes=[], scale=const(np.inf, np.float32)), ["does not show"]),
    "scale_nan_only": (dict(reshapes=[], scale=const(np.nan, np.float32)), ["does not show"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_hint_is_one_line(case, tmp_path):
    kwargs, needles = HOSTILE[case]
    outcome = clean_outcome(specbound.analyze, save(bert_graph(**kwargs), tmp_path / "m"), threads=1)
    assert isinstance(outcome, SpecboundError), outcome
    for needle in needles:
        assert needle in str(outcome), (needle, str(outcome))


def test_the_plain_graph_shows_its_heads(tmp_path):
    result = specbound.analyze(save(bert_graph(), tmp_path / "m"), threads=1)
    assert result.model["H"] == H and all(math.isfinite(v) for v in result.bounds.values())


def test_a_valid_scale_decides_when_no_reshape_does(tmp_path):
    result = specbound.analyze(save(bert_graph(reshapes=[]), tmp_path / "m"), threads=1)
    assert result.model["H"] == H


def test_the_callers_head_count_settles_contradictory_reshapes(tmp_path):
    graph = bert_graph(reshapes=[const([0, 0, 2, 4], np.int64), const([0, 0, 4, 2], np.int64)])
    result = specbound.analyze(save(graph, tmp_path / "m"), config={"num_attention_heads": 4}, threads=1)
    assert result.model["H"] == 4


def test_external_hints_are_read_from_the_models_folder(tmp_path, monkeypatch):
    """The same export gives the same head count wherever it is run from (a hint.bin in the current
    directory saying otherwise is not read)."""
    path = save(bert_graph(reshapes=[external([0, 0, H, N // H], "hint.bin")]), tmp_path / "m")
    (path.parent / "hint.bin").write_bytes(np.array([0, 0, H, N // H], "<i8").tobytes())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "hint.bin").write_bytes(np.array([0, 0, 4, 2], "<i8").tobytes())
    monkeypatch.chdir(elsewhere)
    assert specbound.analyze(path, threads=1).model["H"] == H


def test_external_hints_are_confined_like_weights(tmp_path):
    path = save(bert_graph(reshapes=[external([0, 0, H, N // H], "../hint.bin")]), tmp_path / "m")
    (tmp_path / "hint.bin").write_bytes(np.array([0, 0, H, N // H], "<i8").tobytes())
    outcome = clean_outcome(specbound.analyze, path, threads=1)
    assert isinstance(outcome, SpecboundError) and "outside the model's folder" in str(outcome)


def test_an_external_hint_in_a_fifo_is_refused_not_read(tmp_path):
    path = save(bert_graph(reshapes=[external([0, 0, H, N // H], "hint.bin")]), tmp_path / "m")
    os.mkfifo(path.parent / "hint.bin")
    outcome = clean_outcome(specbound.analyze, path, threads=1)
    assert isinstance(outcome, SpecboundError) and "not a regular file" in str(outcome)


def test_a_huge_external_constant_is_no_hint_and_is_not_read(tmp_path):
    """A 'shape' declaring 2^40 values is not read (no allocation); the scale then shows the heads."""
    path = save(bert_graph(reshapes=[external([0, 0, H, N // H], "hint.bin", dims=[2**40])]), tmp_path / "m")
    (path.parent / "hint.bin").write_bytes(bytes(64))
    assert specbound.analyze(path, threads=1).model["H"] == H


TYPES = st.sampled_from([np.int64, np.int32, np.float32, np.float64, np.float16, np.uint8, np.bool_])
NUMBERS = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**63), 2**63 - 1)


def _array(values, dtype):
    with np.errstate(all="ignore"):
        try:
            return np.array(values).astype(dtype)
        except (OverflowError, ValueError):
            return np.zeros(len(values), dtype)


@FUZZ
@given(
    target=st.lists(NUMBERS, max_size=5), target_type=TYPES, scale=NUMBERS, scale_type=TYPES, with_reshape=st.booleans()
)
def test_any_reshape_target_and_scale(tmp_path_factory, target, target_type, scale, scale_type, with_reshape):
    reshapes = [numpy_helper.from_array(_array(target, target_type))] if with_reshape else []
    graph = bert_graph(reshapes=reshapes, scale=numpy_helper.from_array(_array([scale], scale_type).reshape(())))
    outcome = clean_outcome(specbound.analyze, save(graph, tmp_path_factory.mktemp("g") / "m"), threads=1)
    if not isinstance(outcome, Exception):
        assert N % outcome.model["H"] == 0
        assert all(math.isfinite(v) and v >= 0 for v in outcome.bounds.values())
