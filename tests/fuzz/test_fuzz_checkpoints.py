"""Fuzzing the checkpoint readers: byte-level mutations of real safetensors, PyTorch zip and ONNX
files, and random JSON in config.json and shard indexes.  Every outcome is an analysis with finite
bounds or one SpecboundError line."""

import json
import math
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import load_file
from support.fuzz import EDITS, FUZZ, JSON, clean_outcome, mutate
from support.numpy_bert import write_tiny_bert

import specbound


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny BERT (L=1, N=8, 2 heads): each analysis takes milliseconds."""
    return write_tiny_bert(tmp_path_factory.mktemp("fuzz") / "m", seed=0, L=1, N=8, H=2, d_ff=12)


def _analysed(folder):
    """Analyse ``folder``; a result must have finite, non-negative headline bounds."""
    result = clean_outcome(specbound.analyze, folder, threads=1, jobs=1)
    if not isinstance(result, Exception):
        for name, value in result.bounds.items():
            assert math.isfinite(value) and value >= 0, (name, value)
    return result


@FUZZ
@given(edits=EDITS, in_header=st.booleans())
def test_mutated_safetensors(model, tmp_path_factory, edits, in_header):
    folder = shutil.copytree(model, tmp_path_factory.mktemp("st") / "m")
    path = folder / "model.safetensors"
    data = path.read_bytes()
    if in_header:  # most of a real file is tensor bytes: aim half the edits at the 8-byte length and header
        header_end = 8 + int.from_bytes(data[:8], "little")
        edits = [(k, p % header_end, v) for k, p, v in edits]
    path.write_bytes(mutate(data, edits))
    _analysed(folder)


@FUZZ
@given(
    key=st.sampled_from(
        [
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "model_type",
            "hidden_act",
            "head_dim",
            "num_key_value_heads",
        ]
    ),
    value=JSON | st.integers(-10, 10**40),
)
def test_config_values(model, tmp_path_factory, key, value):
    """Any JSON value under any key config.json's dimensions are read from (10**30 layers included)."""
    folder = shutil.copytree(model, tmp_path_factory.mktemp("cfg") / "m")
    config = json.loads((folder / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    _analysed(folder)


@FUZZ
@given(document=JSON)
def test_config_documents(model, tmp_path_factory, document):
    folder = shutil.copytree(model, tmp_path_factory.mktemp("doc") / "m")
    (folder / "config.json").write_text(json.dumps(document))
    _analysed(folder)


@FUZZ
@given(
    weight_map=JSON | st.dictionaries(st.text(max_size=40), st.text(max_size=40) | JSON, max_size=5),
    pickle_index=st.booleans(),
)
def test_shard_indexes(model, tmp_path_factory, weight_map, pickle_index):
    folder = shutil.copytree(model, tmp_path_factory.mktemp("idx") / "m")
    (folder / "model.safetensors").rename(folder / "shard-1.safetensors")
    name = "pytorch_model.bin.index.json" if pickle_index else "model.safetensors.index.json"
    (folder / name).write_text(json.dumps({"weight_map": weight_map}))
    _analysed(folder)


@pytest.fixture(scope="module")
def pickled(model, tmp_path_factory):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    folder = shutil.copytree(model, tmp_path_factory.mktemp("pickled") / "m")
    torch.save(load_file(str(folder / "model.safetensors")), str(folder / "pytorch_model.bin"))
    (folder / "model.safetensors").unlink()
    return folder


@FUZZ
@given(edits=EDITS)
def test_mutated_pytorch_zip(pickled, tmp_path_factory, edits):
    """A flipped byte anywhere in a zip .bin: refused (CRC-32, zip structure, unpickler) or, when
    it only touched zip padding or metadata nothing reads, analysed to the original numbers."""
    folder = shutil.copytree(pickled, tmp_path_factory.mktemp("zip") / "m")
    path = folder / "pytorch_model.bin"
    path.write_bytes(mutate(path.read_bytes(), edits))
    result = _analysed(folder)
    if not isinstance(result, Exception):
        reference = specbound.analyze(pickled, threads=1, jobs=1)
        assert result.bounds == reference.bounds  # never silently different numbers


@pytest.fixture(scope="module")
def onnx_model(model, tmp_path_factory):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weights = load_file(str(model / "model.safetensors"))
    nodes, inits = [], []
    for i, (name, w) in enumerate(sorted(weights.items())):
        if name.endswith(".weight") and w.ndim == 2 and ".layer." in name:
            nodes.append(
                helper.make_node(
                    "MatMul", ["x", f"W{i}"], [f"y{i}"], name="/" + "/".join(name.split(".")[:-1]) + "/MatMul"
                )
            )
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), f"W{i}"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        initializer=inits,
    )
    folder = tmp_path_factory.mktemp("onnx") / "m"
    folder.mkdir()
    onnx.save(helper.make_model(graph), str(folder / "model.onnx"))
    shutil.copy(model / "config.json", folder / "config.json")
    return folder


@FUZZ
@given(edits=EDITS)
def test_mutated_onnx(onnx_model, tmp_path_factory, edits):
    folder = shutil.copytree(onnx_model, tmp_path_factory.mktemp("onnxm") / "m")
    path = folder / "model.onnx"
    path.write_bytes(mutate(path.read_bytes(), edits))
    _analysed(folder)


@FUZZ
@given(
    state=st.dictionaries(st.text(max_size=30) | st.integers(), JSON | st.just(np.zeros((2, 2))), max_size=4),
    config=JSON,
)
def test_in_memory_state_dicts(state, config):
    clean_outcome(specbound.analyze, state, config=config, threads=1)
