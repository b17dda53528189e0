"""A tiny BERT layer as an ONNX graph without config.json, built node by node with onnx.helper (no
exporter: milliseconds), so that a test can plant exactly one hostile graph hint: a Reshape target,
a scale constant, an attribute, a constant stored as external data.

The graph is what the legacy exporter writes for a BERT layer, reduced to what the dimensions are
inferred from: one MatMul per role weight (``x @ W.T``, the initializer stored ``(in, out)``), the
attention's Reshape to ``[batch, seq, H, d_head]``, its scale Div by ``sqrt(d_head)`` and the
feed-forward's Erf (exact GELU), each node named after its module (``/encoder/layer.0/...``).
"""

from __future__ import annotations

import numpy as np

N, H, D_FF = 8, 2, 12
SELF = "/encoder/layer.0/attention/self"
ROLES = {
    "query": f"{SELF}/query",
    "key": f"{SELF}/key",
    "value": f"{SELF}/value",
    "attention.output.dense": "/encoder/layer.0/attention/output/dense",
    "intermediate.dense": "/encoder/layer.0/intermediate/dense",
    "output.dense": "/encoder/layer.0/output/dense",
}


def layer_weights(seed=0):
    """Role -> ``(out, in)`` float32 weight of the one layer."""
    rng = np.random.default_rng(seed)
    shapes = {
        "query": (N, N),
        "key": (N, N),
        "value": (N, N),
        "attention.output.dense": (N, N),
        "intermediate.dense": (D_FF, N),
        "output.dense": (N, D_FF),
    }
    return {role: (0.3 * rng.standard_normal(shape)).astype(np.float32) for role, shape in shapes.items()}


def bert_graph(reshapes=None, scale=None, gelu_approximate=None, extra_nodes=(), extra_initializers=()):
    """The graph (an onnx ModelProto).

    ``reshapes``: TensorProtos used as the targets of one attention Reshape each (default one
    int64 ``[0, 0, H, N/H]``); ``scale``: the TensorProto of the scale Div (default
    ``sqrt(N/H)``); ``gelu_approximate``: bytes for a Gelu node's ``approximate`` attribute in place
    of the Erf node."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    for i, (role, weight) in enumerate(layer_weights().items()):
        nodes.append(helper.make_node("MatMul", ["x", f"W{i}"], [f"y{i}"], name=f"{ROLES[role]}/MatMul"))
        inits.append(numpy_helper.from_array(np.ascontiguousarray(weight.T), f"W{i}"))
    targets = reshapes if reshapes is not None else [numpy_helper.from_array(np.array([0, 0, H, N // H], np.int64))]
    for i, target in enumerate(targets):
        target.name = f"shape{i}"
        inits.append(target)
        nodes.append(helper.make_node("Reshape", ["y0", target.name], [f"r{i}"], name=f"{SELF}/Reshape_{i}"))
    divisor = scale if scale is not None else numpy_helper.from_array(np.array(np.sqrt(N / H), np.float32))
    divisor.name = "scale"
    inits.append(divisor)
    nodes.append(helper.make_node("Div", ["r0" if targets else "y0", "scale"], ["scores"], name=f"{SELF}/Div"))
    act = "/encoder/layer.0/intermediate/intermediate_act_fn"
    if gelu_approximate is None:
        nodes.append(helper.make_node("Erf", ["y4"], ["act"], name=f"{act}/Erf"))
    else:
        nodes.append(
            helper.make_node("Gelu", ["y4"], ["act"], name=f"{act}/Gelu", domain="", approximate=gelu_approximate)
        )
    nodes += list(extra_nodes)
    inits += list(extra_initializers)
    graph = helper.make_graph(
        nodes,
        "bert",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return helper.make_model(graph)


def save(model, folder):
    """``model`` saved as ``folder/model.onnx`` (no config.json); the file's path."""
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"
