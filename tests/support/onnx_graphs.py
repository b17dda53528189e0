"""Hand-built ONNX graphs of one BERT layer: six Linear weights in a chain of products, each stored
the way a test chooses (MatMul, Transpose, Gemm, Cast, ...), with a config.json beside the graph; and
:func:`export`, a transformers model exported by ``torch.onnx.export``."""

import json
import warnings

import numpy as np
import onnx  # noqa: TID253
import pytest
from onnx import TensorProto, helper, numpy_helper  # noqa: TID253

N, D_FF = 4, 6
RNG = np.random.default_rng(0)


def matmul_graph(folder, nodes, initializers, config=None):
    """A one-layer BERT-named graph; ``nodes``/``initializers`` are the onnx protos."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        initializer=initializers,
    )
    folder.mkdir(exist_ok=True)
    onnx.save(helper.make_model(graph), str(folder / "model.onnx"))
    (folder / "config.json").write_text(
        json.dumps(
            config
            or dict(
                model_type="bert", num_hidden_layers=1, hidden_size=N, num_attention_heads=2, intermediate_size=D_FF
            )
        )
    )
    return folder


BERT_LINEARS = {
    "attention/self/query": (N, N),
    "attention/self/key": (N, N),
    "attention/self/value": (N, N),
    "attention/output/dense": (N, N),
    "intermediate/dense": (D_FF, N),
    "output/dense": (N, D_FF),
}


def bert_layer(how):
    """One BERT layer's six Linear weights (torch (out, in)) in a chain of products, each stored as
    ``how(path, weight)`` -> (nodes, initializers, product output)."""
    weights = {path: RNG.normal(size=shape) for path, shape in BERT_LINEARS.items()}
    nodes, inits, x = [], [], "x"
    for i, (path, w) in enumerate(weights.items()):
        n, t, x = how(f"/encoder/layer.0/{path}", w, x, i)
        nodes += n
        inits += t
    return weights, nodes, inits


def initializer(name, array, dtype=np.float32):
    return numpy_helper.from_array(array.astype(dtype), name)


def plain_matmul(path, w, x, i):
    return (
        [helper.make_node("MatMul", [x, f"W{i}"], [f"y{i}"], name=f"{path}/MatMul")],
        [initializer(f"W{i}", w.T)],
        f"y{i}",
    )


def export(model, folder, dynamo, wrap, **kwargs):
    """``torch.onnx.export`` of ``model`` (optionally inside a wrapper module, attribute ``m``) to
    ``folder/model.onnx``, with the model's config.json beside it; skips if the exporter fails."""
    import torch

    class Wrap(torch.nn.Module):  # the legacy exporter cannot call transformers 5 models directly
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids).last_hidden_state

    folder.mkdir()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    target = Wrap(model) if wrap else model
    args, kw = ((ids,), {}) if wrap else ((), {"input_ids": ids})
    try:
        with warnings.catch_warnings():  # tracer warnings about transformers' Python control flow
            warnings.simplefilter("ignore")
            torch.onnx.export(
                target,
                args,
                str(folder / "model.onnx"),
                kwargs=kw or None,
                dynamo=dynamo,
                **({"opset_version": 17} if not dynamo else {}),
                **kwargs,
            )
    except ImportError as exc:  # onnxscript missing: no dynamo exporter
        pytest.skip(f"torch.onnx.export(dynamo={dynamo}) unavailable: {exc}")
    model.config.to_json_file(str(folder / "config.json"))
    return folder
