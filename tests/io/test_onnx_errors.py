"""Malformed ONNX graphs: cycles on a weight's path, nodes without inputs, oversized
metadata and external data outside the model's folder end in one line, never in a hang."""

import json
import time

import numpy as np
import pytest

from specbound import SpecboundError
from specbound.io import open_checkpoint

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402, TID253

N = 8
CONFIG = dict(model_type="bert", num_hidden_layers=1, hidden_size=N, num_attention_heads=2, intermediate_size=12)


def _save(folder, nodes, initializers=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        initializer=list(initializers),
    )
    folder.mkdir(exist_ok=True)
    onnx.save(helper.make_model(graph), str(folder / "model.onnx"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def _weight(name="W"):
    return numpy_helper.from_array(np.ones((N, N), np.float32), name)


def _open_quickly(folder):
    start = time.perf_counter()
    try:
        return open_checkpoint(folder)
    finally:
        assert time.perf_counter() - start < 10  # the trace used to loop forever


def test_identity_self_loop_on_a_matmul_weight(tmp_path):
    nodes = [
        helper.make_node("Identity", ["w"], ["w"], name="loop"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="/encoder/layer.0/attention/self/query/MatMul"),
    ]
    with pytest.raises(SpecboundError, match="no MatMul/Gemm node with a stored floating-point weight"):
        _open_quickly(_save(tmp_path / "m", nodes))


def test_two_node_cycle_on_a_matmul_weight(tmp_path):
    nodes = [
        helper.make_node("Identity", ["b"], ["a"], name="one"),
        helper.make_node("Cast", ["a"], ["b"], name="two", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "a"], ["y"], name="/encoder/layer.0/attention/self/query/MatMul"),
    ]
    with pytest.raises(SpecboundError, match="no MatMul/Gemm node"):
        _open_quickly(_save(tmp_path / "m", nodes))


def test_identity_without_input(tmp_path):
    nodes = [
        helper.make_node("Identity", [], ["encoder.layer.0.attention.self.key.weight"], name="empty"),
        helper.make_node("MatMul", ["x", "W"], ["y"], name="/encoder/layer.0/attention/self/query/MatMul"),
    ]
    ckpt = _open_quickly(_save(tmp_path / "m", nodes, [_weight()]))
    assert ckpt.names == ["encoder.layer.0.attention.self.query.weight"]


def test_huge_name_scope_metadata_is_not_parsed(tmp_path):
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="anonymous")
    entry = node.metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", "[" * 100_000 + "]" * 100_000
    with pytest.raises(SpecboundError, match="cannot tell which parameter"):
        _open_quickly(_save(tmp_path / "m", [node], [_weight()]))


@pytest.mark.parametrize("location", ["../outside.data", "/etc/passwd", "sub/../../x.data"])
def test_external_data_outside_the_folder(tmp_path, location):
    weight = _weight()
    weight.data_location = TensorProto.EXTERNAL
    weight.ClearField("raw_data")
    for key, value in (("location", location), ("offset", "0"), ("length", str(4 * N * N))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="/encoder/layer.0/attention/self/query/MatMul")]
    (tmp_path / "outside.data").write_bytes(bytes(4 * N * N))
    with pytest.raises(SpecboundError, match="outside the model's folder"):
        open_checkpoint(_save(tmp_path / "m", nodes, [weight]))


def test_files_lists_the_model_and_its_external_data(tmp_path):
    from onnx.external_data_helper import convert_model_to_external_data

    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="/encoder/layer.0/attention/self/query/MatMul")]
    folder = _save(tmp_path / "m", nodes, [_weight()])
    model = onnx.load(str(folder / "model.onnx"))
    convert_model_to_external_data(model, location="model.onnx.data", size_threshold=0)
    onnx.save(model, str(folder / "model.onnx"))
    ckpt = open_checkpoint(folder)
    assert ckpt.files() == [folder / "model.onnx", folder / "model.onnx.data"]
    np.testing.assert_array_equal(ckpt.read("encoder.layer.0.attention.self.query.weight"), np.ones((N, N)))


def test_declared_dims_beyond_the_file_are_refused_before_allocation(tmp_path):
    """An initializer declaring 10^6 x 10^6 values over 256 stored bytes."""
    weight = _weight()
    del weight.dims[:]
    weight.dims.extend([10**6, 10**6])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="/encoder/layer.0/attention/self/query/MatMul")]
    ckpt = open_checkpoint(_save(tmp_path / "m", nodes, [weight]))
    with pytest.raises(SpecboundError, match="lies about the tensor's size"):
        ckpt.read("encoder.layer.0.attention.self.query.weight")
