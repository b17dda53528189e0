"""ONNX exports published on their own (no config.json), as sentence-transformers repositories do:
the dimensions are inferred from the graph, each with the node or tensor it was read from, and the
analysis equals the one of the same model saved with save_pretrained (its config.json included).

Exports are made by torch.onnx.export (both exporters) of tiny transformers models wrapped like a
SentenceTransformer (``nn.Sequential`` whose module ``0`` holds ``auto_model``: names
``0.auto_model.encoder.layer.<i>...``), also one level deeper (``model.0.auto_model.``).
"""

import json
import warnings

import numpy as np
import pytest
from support.same_numbers import assert_same_numbers
from support.tiny_models import build_tiny_model

import specbound
from specbound import SpecboundError
from specbound.archs.tensor_names import find_layer_stack
from specbound.cli import main
from specbound.io import open_checkpoint
from specbound.pipeline import open_model

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")


class AutoModel(torch.nn.Module):
    """sentence-transformers' Transformer module: the Hugging Face model as ``auto_model``."""

    def __init__(self, model):
        super().__init__()
        self.auto_model = model

    def forward(self, input_ids):
        return self.auto_model(input_ids=input_ids).last_hidden_state


class Outer(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.model = inner

    def forward(self, input_ids):
        return self.model(input_ids)


def export_alone(model, path, dynamo, deeper=False):
    """``torch.onnx.export`` of ``model`` wrapped like a SentenceTransformer to ``path``, no config.json."""
    target = torch.nn.Sequential(AutoModel(model))
    if deeper:
        target = Outer(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    extra = {} if dynamo else {"opset_version": 17, "input_names": ["ids"], "dynamic_axes": {"ids": {0: "b", 1: "s"}}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(target, (ids,), str(path), dynamo=dynamo, **extra)
    except ImportError as exc:
        pytest.skip(f"torch.onnx.export(dynamo={dynamo}) unavailable: {exc}")
    assert not (path.parent / "config.json").exists()
    return path


@pytest.fixture(scope="module")
def bert(tiny_bert_dir):
    return build_tiny_model("bert"), specbound.analyze(tiny_bert_dir, threads=1)


@pytest.mark.parametrize(
    "dynamo, deeper",
    [(False, False), (True, False), (False, True)],
    ids=["legacy", "dynamo", "legacy-model.0.auto_model"],
)
def test_sentence_transformers_export_without_config(bert, tmp_path, dynamo, deeper):
    model, reference = bert
    path = export_alone(model, tmp_path / "st" / "model.onnx", dynamo, deeper)
    ckpt = open_checkpoint(path)
    assert ckpt.facts.needs_config and ckpt.config == {}
    assert_same_numbers(reference, specbound.analyze(path, threads=1))
    assert_same_numbers(reference, specbound.analyze(path.parent, threads=1))  # the folder, too

    opened = open_model(path)
    assert opened.prefix == ("model." if deeper else "") + "0.auto_model."
    evidence = opened.ckpt.config["specbound_inferred"]
    assert evidence["num_heads"].startswith("4 (") and "attention/self" in evidence["num_heads"].replace(".", "/")
    node = "Gelu" if dynamo else "Erf"
    assert evidence["activation"].startswith(f"gelu ({node}")
    assert evidence["num_layers"].startswith("2 (") and evidence["ff_size"].startswith("48 (")


def test_set_and_config_override_the_graph(bert, tmp_path, capsys):
    model, _ = bert
    path = export_alone(model, tmp_path / "st" / "model.onnx", False)
    assert main(["analyze", str(path), "--format", "json", "--set", "num_attention_heads=2", "--threads", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["H"] == 2 and doc["model"]["d_head"] == 16
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_attention_heads": 8, "hidden_act": "relu"}))
    assert main(["analyze", str(path), "--format", "json", "--config", str(config), "--threads", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["H"] == 8 and doc["model"]["activation"] == "relu"
    assert main(["analyze", str(path), "--set", "num_attention_heads"]) == 2
    assert "--set expects KEY=VALUE" in capsys.readouterr().err


def test_llama_export_without_config(tmp_path):
    """Gated SiLU feed-forward (Sigmoid in the graph) and grouped-query attention (k/v narrower)."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_key_value_heads=2,
        intermediate_size=48,
        vocab_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=40,
    )
    torch.manual_seed(3)
    model = transformers.LlamaModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.2)
    model.save_pretrained(str(tmp_path / "st"))
    reference = specbound.analyze(tmp_path / "st", threads=1)
    path = export_alone(model, tmp_path / "onnx" / "model.onnx", True)
    # the rotary settings are not in the graph: never guessed; the bounds valid for every rotation apply
    blind = specbound.analyze(path, threads=1)
    assert blind.model["rotary"]["max_positions"] is None

    assert "--set max_position_embeddings=N" in open_model(path).ckpt.config["specbound_inferred"]["rotary"]
    rotary = {"max_position_embeddings": 40, "rope_theta": config.rope_parameters["rope_theta"]}
    result = specbound.analyze(path, config=rotary, threads=1)
    assert (result.model["H"], result.model["H_kv"], result.model["activation"]) == (4, 2, "silu")
    assert_same_numbers(reference, result)


def test_arch_infer_picks_the_layer_stack_not_the_wrapper(bert, tmp_path, capsys):
    model, _ = bert
    path = export_alone(model, tmp_path / "st" / "model.onnx", False, deeper=True)
    assert main(["arch", "infer", str(path)]) == 0
    out = capsys.readouterr()
    spec = json.loads(out.out)
    assert spec["tensors"]["q"]["name"].endswith("encoder.layer.${layer}.attention.self.query.weight")
    assert "model.0.auto_model.encoder.layer.${layer} with L = 2" in out.err
    assert "self-check on this checkpoint: ok" in out.err


def test_heads_not_in_the_graph_is_a_one_line_error(tmp_path):
    """A hand-built graph with the weights but no attention Reshape/scale: the heads must be given."""
    from onnx import TensorProto, helper, numpy_helper

    n, d_ff = 4, 6
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, (module, shape) in enumerate(
        [
            ("attention/self/query", (n, n)),
            ("attention/self/key", (n, n)),
            ("attention/self/value", (n, n)),
            ("attention/output/dense", (n, n)),
            ("intermediate/dense", (n, d_ff)),
            ("output/dense", (d_ff, n)),
        ]
    ):
        inits.append(numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"], name=f"/encoder/layer.0/{module}/MatMul"))
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)],
        initializer=inits,
    )
    path = tmp_path / "alone.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(SpecboundError) as info:
        specbound.analyze(path, threads=1)
    assert "\n" not in str(info.value) and "--set num_attention_heads=H" in str(info.value)
    assert specbound.analyze(path, config={"num_attention_heads": 2}, threads=1).model["H"] == 2


class _Names:
    """A checkpoint of names and shapes only (what the layer-stack search reads)."""

    location = "names"

    def __init__(self, shapes):
        self._shapes = shapes
        self.names = sorted(shapes)

    def shape(self, name):
        return self._shapes[name]


def test_layer_stack_prefers_the_configs_layer_count_and_skips_wrappers():
    shapes = {f"encoder.layer.{i}.w{j}.weight": (4, 4) for i in range(4) for j in range(2)}
    shapes.update({f"decoder.block.{i}.w{j}.weight": (4, 4) for i in range(2) for j in range(5)})
    assert find_layer_stack(_Names(shapes)).path == "decoder.block"  # the most weights
    assert find_layer_stack(_Names(shapes), layers=4).path == "encoder.layer"  # the config's count wins
    wrapped = {f"model.0.auto_model.encoder.layer.{i}.w.weight": (4, 4) for i in range(3)}
    stack = find_layer_stack(_Names(wrapped))
    assert (stack.path, stack.L) == ("model.0.auto_model.encoder.layer", 3)  # not model.<0>
