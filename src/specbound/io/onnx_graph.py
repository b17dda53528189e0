"""ONNX exports: every weight mapped back to the PyTorch parameter it came from.

An exporter stores an ``nn.Linear`` weight as the right operand ``B`` of a ``MatMul`` (``x @ B``:
``B = weight.T`` folded into a new, anonymous initializer ``onnx::MatMul_<n>`` or ``val_<n>``,
stored ``(in, out)``) or of a ``Gemm`` (``transB=1``: the parameter itself, ``(out, in)``, usually
under its own name; ``transB=0``: ``(in, out)``, e.g. GPT-2's ``Conv1D`` through ``addmm``).  The
parameter's name comes from the consuming node: the legacy exporter (``dynamo=False``) names nodes
after the module path (``/encoder/layer.0/attention/self/query/MatMul``), the dynamo exporter
records it in the node's ``pkg.torch.onnx.name_scopes`` metadata.  The storage orientation comes
from the node too (MatMul or Gemm and its ``transB``, and every ``Transpose`` between the
initializer and the node), never from shapes: :meth:`OnnxCheckpoint.layout` reports it, and the
family spec's own layout is used only for tensors stored as the model stores them.

What is exposed (every initializer is either exposed or listed in ``skipped`` with the reason):

* a floating-point rank-2 initializer reached (through ``Identity``/``Cast``/``Transpose``) as the
  ``B`` operand of a MatMul/Gemm: as ``<module path>.weight`` with the orientation the node implies.
  One whose module cannot be read from its node is an error (it is most likely a weight we need);
* a floating-point initializer whose name is a dotted parameter path (biases, norms, embeddings:
  ``encoder.layer.0.attention.self.query.bias``) under its own name, as stored; also the parameter
  names that de-duplicated tensors keep as ``Identity`` outputs;
* nothing else.  Integer and boolean initializers are shape/index constants; floating-point ones with
  generated names (``val_85``, ``embedding_2``: e.g. a position table sliced to the export's sequence
  length, a folded attention mask or rotary table) are exporter constants, not parameters.  Skipping
  them cannot hide a weight the bounds need: a role tensor that is not exposed is reported missing.

The ``onnx`` package is imported only here (``pip install -e '.[onnx]'`` in a checkout).  Tensors are read
lazily, one at a time, from the model file or its external data (``model.onnx.data``).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .base import Checkpoint, ReaderFacts
from .formats import ONNX
from .shard_index import inside
from ..errors import SpecboundError, os_errors

# TensorProto data types -> safetensors dtype codes (the rest keep their ONNX name and are refused
# by Checkpoint.read as non-float weights).
_FLOAT_CODES = {1: "F32", 10: "F16", 11: "F64", 16: "BF16"}
_PASS_THROUGH = ("Identity", "Cast", "Transpose")
_QUANTIZED_OPS = (
    "DequantizeLinear",
    "QuantizeLinear",
    "DynamicQuantizeLinear",
    "QLinearMatMul",
    "MatMulInteger",
    "MatMulNBits",
    "QGemm",
    "DynamicQuantizeMatMul",
)
# A PyTorch parameter path: dotted identifiers (``encoder.layer.0.attention.self.query.bias``).
# Leading components may be digits: a module inside nn.Sequential (sentence-transformers' ``0.auto_model.``);
# a component starting with a letter rules out numbers (``0.5``).
_PARAMETER_NAME = re.compile(r"^(?=(?:\w*\.)*[A-Za-z_])\w+(\.\w+)+$")
_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
# A real name-scope list is a few hundred characters; a longer one is not parsed (literal_eval
# recurses once per nesting level and allocates with the text).
_MAX_SCOPES_CHARS = 20_000


def _import_onnx():
    try:
        import onnx
    except ImportError:
        raise SpecboundError(
            f"reading ONNX models needs the onnx package: {ONNX.install_hint()} (or analyse the "
            "model's safetensors weights, which need no extra package)"
        ) from None
    return onnx


@dataclass(frozen=True)
class _Exposed:
    """One exposed tensor: the initializer (or Constant output) holding it, and its layout
    (``"linear"`` = ``(out, in)``, ``"conv1d"`` = ``(in, out)``; None: stored as the model stores it)."""

    source: str
    layout: str | None
    via: str  # the node (or "initializer") that named it, for messages


@dataclass
class OnnxCheckpoint(Checkpoint):
    """An ONNX model file, its tensors exposed under PyTorch parameter names (module docstring).

    Attributes
    ----------
    path : Path
        The ``.onnx`` file; external data is read relative to its folder.
    skipped : dict[str, str]
        Initializers that are not exposed, and why.
    """

    location: str
    config: dict[str, Any]
    path: Path
    _tensors: dict[str, Any] = field(repr=False)
    _exposed: dict[str, _Exposed] = field(repr=False)
    skipped: dict[str, str] = field(default_factory=dict, repr=False)
    # No config.json (facts.needs_config): the config holds only the user's overrides;
    # ``archs.graph_config.complete_config`` fills in the rest from the tensor shapes and the graph's
    # facts (facts.graph_hints, :class:`GraphHints`).
    facts: ReaderFacts = field(default_factory=ReaderFacts, repr=False)

    @property
    def names(self) -> list[str]:
        return sorted(self._exposed)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._tensors[self._exposed[name].source].dims)

    def dtype(self, name: str) -> str:
        data_type = self._tensors[self._exposed[name].source].data_type
        return _FLOAT_CODES.get(data_type) or _import_onnx().TensorProto.DataType.Name(data_type)

    def layout(self, name: str) -> str | None:
        return self._exposed[name].layout

    def where(self, name: str) -> str:
        entry = self._exposed[name]
        return f"{self.path} (initializer {entry.source!r}, named by {entry.via})"

    def files(self) -> list[Path]:
        """The model file and every external data file its tensors name."""
        extra = {self.path.parent / loc for t in self._tensors.values() if (loc := _external_location(t))}
        return sorted({self.path} | extra)

    def _stored_in(self, name: str) -> Path | None:
        location = _external_location(self._tensors[self._exposed[name].source])
        return self.path.parent / location if location else self.path

    def _raw(self, name: str) -> np.ndarray:
        onnx = _import_onnx()
        from onnx import numpy_helper
        from onnx.external_data_helper import uses_external_data

        proto = self._tensors[self._exposed[name].source]
        if uses_external_data(proto):  # read into a copy: the loaded graph stays small
            copy = onnx.TensorProto()
            copy.CopyFrom(proto)
            proto = copy
        try:
            array = numpy_helper.to_array(proto, base_dir=str(self.path.parent))
        except Exception as exc:  # noqa: BLE001  (OSError, ValueError, onnx's ValidationError, ...)
            raise SpecboundError(
                f"cannot read tensor {name!r} from {self.where(name)}: {exc}; the model file or its "
                f"external data (.onnx.data beside it) is missing, truncated or corrupt"
            ) from None
        if self.dtype(name) == "BF16":  # ml_dtypes bfloat16: float32 holds it exactly
            array = array.astype(np.float32)
        return array


def open_onnx(path: Path, config: dict[str, Any] | None) -> OnnxCheckpoint:
    """Load ``path``'s graph (not its external data) and map its weights to parameter names.

    ``config`` None: no config.json; the checkpoint's config starts empty and ``facts.needs_config`` is
    set, with the graph facts the dimensions are inferred from (:func:`graph_hints`)."""
    onnx = _import_onnx()
    with os_errors(f"read {path}"):
        path.stat()  # unreadable or missing: an OS error, not a decoding one
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001  (DecodeError, OSError, ...)
        raise SpecboundError(
            f"cannot read {path} as an ONNX model ({type(exc).__name__}: {str(exc)[:200]}); "
            f"re-export it with torch.onnx.export"
        ) from None
    graph = model.graph
    tensors = {t.name: t for t in graph.initializer}
    for node in graph.node:  # some tools store constants as Constant nodes instead of initializers
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    tensors.setdefault(node.output[0], attr.t)
    _refuse_quantized(graph, path)
    _confine_external_data(tensors, path)
    exposed, skipped = map_weights(graph, tensors, path)
    return OnnxCheckpoint(
        location=str(path),
        config=dict(config or {}),
        path=path,
        _tensors=tensors,
        _exposed=exposed,
        skipped=skipped,
        facts=ReaderFacts()
        if config is not None
        else ReaderFacts(needs_config=True, graph_hints=graph_hints(graph, tensors, path)),
    )


def _refuse_quantized(graph, path: Path) -> None:
    ops = sorted({n.op_type for n in graph.node if n.op_type in _QUANTIZED_OPS})
    if ops:
        raise SpecboundError(
            f"{path} is a quantized ONNX model (it uses {', '.join(ops)}): its stored integers are not "
            f"the weights; analyse the floating-point export (or its safetensors weights) instead"
        )


def _external_location(tensor) -> str | None:
    """The external data file a tensor names (relative to the model's folder), None if inline."""
    if getattr(tensor, "data_location", 0) != 1:  # TensorProto.EXTERNAL
        return None
    return next((e.value for e in tensor.external_data if e.key == "location"), None)


def _confine_external_data(tensors: dict, path: Path) -> None:
    """Every external data file must lie in the model's folder (symlinks that stay inside are fine)
    and be a regular file (a FIFO would block the read, a device never end); a missing one is
    reported when its tensor is read."""
    for key, tensor in tensors.items():
        location = _external_location(tensor)
        if location is None:
            continue
        if not location or not inside(path.parent, path.parent / location):
            raise SpecboundError(
                f"{path}: the initializer {key!r} names its external data file {location!r} outside the "
                f"model's folder {path.parent}; an ONNX model may only name data files beside it (re-export it)"
            )
        target = path.parent / location
        with os_errors(f"check the external data file {target}"):
            if target.exists() and not target.is_file():
                raise SpecboundError(
                    f"{path}: the initializer {key!r} names the external data file {target}, which "
                    f"is not a regular file (a folder, FIFO or device); re-export the model"
                )


def _is_float(tensor) -> bool:
    return tensor.data_type in _FLOAT_CODES


def _trace(name: str, tensors: dict, producers: dict) -> tuple[str | None, int]:
    """Follow ``name`` back through Identity/Cast/Transpose to a stored tensor.

    Returns the tensor's name (None when the value is computed) and the number of 2-D transposes
    on the way.  A Transpose with another permutation is not a weight path (None).
    """
    transposes, seen = 0, set()
    while name not in tensors:
        node = producers.get(name)
        if node is None or node.op_type not in _PASS_THROUGH or not node.input or name in seen:
            return None, 0  # computed, a node without input, or a cycle (a malformed graph)
        seen.add(name)
        if node.op_type == "Transpose":
            perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
            if perm and perm[0] != [1, 0]:
                return None, 0
            transposes += 1
        name = node.input[0]
    return name, transposes


def module_path(node) -> str | None:
    """The PyTorch module a MatMul/Gemm node belongs to, or None when the node does not say.

    Dynamo exporter: ``pkg.torch.onnx.name_scopes`` lists the enclosing module paths and ends with
    the aten op (``[..., 'encoder.layer.0.attention.self.query', 'linear']``): the module is the
    second-to-last entry.  Legacy exporter: the node is named ``/<module path with '/'>/MatMul``.
    """
    for prop in node.metadata_props:
        if prop.key == _NAME_SCOPES:
            if not isinstance(prop.value, str) or len(prop.value) > _MAX_SCOPES_CHARS:
                return None
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                return None
            if isinstance(scopes, list) and len(scopes) >= 2 and all(isinstance(s, str) for s in scopes):
                return scopes[-2]
            return None
    if isinstance(node.name, str) and node.name.startswith("/"):  # bytes: a name that is not UTF-8
        # A called container (nn.Sequential ``model``) is a scope of its own before its children's
        # ``model.0``: ``/model/model.0/auto_model/...`` is the module ``model.0.auto_model``.
        parts: list[str] = []
        for part in node.name.split("/")[1:-1]:
            if parts and part.startswith(parts[-1] + "."):
                parts[-1] = part
            else:
                parts.append(part)
        return ".".join(parts)
    return None


def map_weights(graph, tensors: dict, path: Path) -> tuple[dict[str, _Exposed], dict[str, str]]:
    """Exposed name -> where it is stored and how; and the skipped tensors with the reason."""
    producers = {out: node for node in graph.node for out in node.output}
    exposed: dict[str, _Exposed] = {}
    weights: set[str] = set()
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        source, transposes = _trace(node.input[1], tensors, producers)
        if source is None or not _is_float(tensors[source]) or len(tensors[source].dims) != 2:
            continue  # a computed operand (attention scores, values), not a stored weight
        module = module_path(node)
        if module is None:
            raise SpecboundError(
                f"cannot tell which parameter the initializer {source!r} {tuple(tensors[source].dims)} of "
                f"{path} is: its {node.op_type} node {node.name!r} carries neither a module path in its "
                f"name (legacy exporter) nor {_NAME_SCOPES} metadata (dynamo exporter); export the model "
                f"with torch.onnx.export, or analyse its safetensors weights"
            )
        trans_b = [a.i for a in node.attribute if a.name == "transB"] if node.op_type == "Gemm" else []
        flips = transposes + (trans_b[0] if trans_b else 0)
        # x @ B with B (in, out): Conv1D's storage; one flip more is nn.Linear's (out, in).
        entry = _Exposed(source, "conv1d" if flips % 2 == 0 else "linear", f"{node.op_type} node {node.name!r}")
        name = f"{module}.weight" if module else "weight"
        previous = exposed.get(name)
        if previous is not None and (previous.source, previous.layout) != (entry.source, entry.layout):
            raise SpecboundError(
                f"{path}: two different tensors map to the parameter {name!r} ({previous.source!r} through "
                f"{previous.via}, {source!r} through {entry.via}); the module calls more than one matrix "
                f"product of its own, so its weights cannot be named from the graph"
            )
        exposed[name] = entry
        weights.add(source)
    if not exposed:
        raise SpecboundError(
            f"{path} has no MatMul/Gemm node with a stored floating-point weight in its main graph; "
            f"export the model with torch.onnx.export (weights as initializers, no model-local functions)"
        )
    skipped = {}
    for key, tensor in tensors.items():
        if not _is_float(tensor):
            skipped[key] = "integer/boolean constant (a shape, index or mask), not a weight"
        elif isinstance(key, str) and _PARAMETER_NAME.match(key):
            exposed.setdefault(key, _Exposed(key, None, "initializer"))
        elif key not in weights:
            skipped[key] = "floating-point constant generated by the exporter (no parameter name), not a weight"
    for node in graph.node:  # de-duplicated tensors keep their parameter names as Identity outputs
        if (
            node.op_type == "Identity"
            and node.input
            and node.output
            and isinstance(node.output[0], str)
            and _PARAMETER_NAME.match(node.output[0])
            and node.output[0] not in exposed
        ):
            source, transposes = _trace(node.input[0], tensors, producers)
            if source is not None and transposes == 0 and _is_float(tensors[source]):
                exposed[node.output[0]] = _Exposed(source, None, f"Identity node {node.name!r}")
    return exposed, skipped


@dataclass
class GraphHints:
    """What only the graph says about a model's dimensions, by module path (the module that each
    node belongs to, as :func:`module_path` reads it), for inferring a missing config.json.

    Attributes
    ----------
    reshapes : dict[str, list[tuple[str, list[int | None]]]]
        Module -> ``(node name, target shape)`` of its Reshape nodes; an entry is None where the
        target is computed (a batch or sequence length), known where it is a constant.
    scalars : dict[str, list[tuple[str, str, float]]]
        Module -> ``(node name, op, value)`` of its Mul/Div nodes by a constant scalar (the attention
        scale ``1/sqrt(d_head)``, or ``d_head^(-1/4)`` applied to q and k).
    ops : dict[str, list[tuple[str, str]]]
        Module -> ``(node name, op)`` of its nodes (``Erf``, ``Tanh``, ``Sigmoid``, ``Gelu`` with its
        ``approximate`` attribute as ``Gelu:tanh``, ...).
    """

    reshapes: dict[str, list] = field(default_factory=dict)
    scalars: dict[str, list] = field(default_factory=dict)
    ops: dict[str, list] = field(default_factory=dict)


# A graph hint is a shape (a few entries) or a scalar; a constant with more values is no hint and is
# not read (it may be external data of any size).
_MAX_HINT_VALUES = 64
_INTEGER_TYPES = (6, 7)  # TensorProto INT32, INT64: what a Reshape's shape input may be


def _constant(name: str, tensors: dict, base_dir: Path) -> np.ndarray | None:
    """The values of the constant ``name`` (flat), or None when it is not a small readable constant.
    External data is read from the model's folder (``base_dir``; confined by :func:`open_onnx`),
    never from the current directory."""
    if name not in tensors or math.prod(int(d) for d in tensors[name].dims) > _MAX_HINT_VALUES:
        return None
    from onnx import numpy_helper

    try:
        return np.asarray(numpy_helper.to_array(tensors[name], base_dir=str(base_dir))).ravel()
    except Exception:  # noqa: BLE001  (external data missing or unreadable, a malformed constant)
        return None


def _integers(name: str, node, tensors: dict, path: Path) -> list[int] | None:
    """A shape constant's entries; a non-integer one (a float tensor, NaN, infinity) is a malformed
    graph, refused naming the node, never rounded."""
    values = _constant(name, tensors, path.parent)
    if values is None:
        return None
    if tensors[name].data_type not in _INTEGER_TYPES:
        shown = ", ".join(str(v) for v in values[:8])
        kind = _import_onnx().TensorProto.DataType.Name(tensors[name].data_type)
        raise SpecboundError(
            f"{path}: the Reshape node {node.name!r} reshapes to the constant {name!r} = [{shown}] of type {kind}, "
            f"not an int64 shape: the graph is malformed (ONNX Reshape takes int64 shapes); re-export the model, "
            f"or put its config.json beside it"
        )
    return [int(v) for v in values]


def _shape_target(name: str, node, tensors: dict, producers: dict, path: Path) -> list[int | None] | None:
    """A Reshape target with its constant entries: a constant, or a Concat of constants and
    ``Unsqueeze``d computed scalars (the legacy exporter's dynamic shapes); None when unknown."""
    values = _integers(name, node, tensors, path)
    if values is not None:
        return values
    concat = producers.get(name)
    if concat is None or concat.op_type != "Concat":
        return None
    target: list[int | None] = []
    for part in concat.input:
        values = _integers(part, node, tensors, path)
        if values is not None:
            target += values
        elif producers.get(part) is not None and producers[part].op_type == "Unsqueeze":
            target.append(None)
        else:
            return None
    return target


def _gelu_op(node, path: Path) -> str:
    """``Gelu:<approximate>`` (``none`` when the attribute is absent); an attribute that is not
    UTF-8 text is a malformed graph."""
    approx = [a.s for a in node.attribute if a.name == "approximate"]
    if not approx:
        return "Gelu:none"
    try:
        return f"Gelu:{approx[0].decode('utf-8')}"
    except UnicodeDecodeError:
        raise SpecboundError(
            f"{path}: the Gelu node {node.name!r} has an 'approximate' attribute that is not "
            f"UTF-8 text ({approx[0][:20]!r}): the graph is malformed; re-export the model, or put "
            f"its config.json beside it"
        ) from None


def graph_hints(graph, tensors: dict, path: Path) -> GraphHints:
    """Collect the :class:`GraphHints` of the graph of the model file ``path`` (every node with a
    readable module path); constants stored as external data are read from the model's folder."""
    producers = {out: node for node in graph.node for out in node.output}
    hints = GraphHints()
    for node in graph.node:
        module = module_path(node)
        if module is None:
            continue
        op = _gelu_op(node, path) if node.op_type == "Gelu" else node.op_type
        hints.ops.setdefault(module, []).append((node.name, op))
        if node.op_type == "Reshape" and len(node.input) > 1:
            target = _shape_target(node.input[1], node, tensors, producers, path)
            if target is not None:
                hints.reshapes.setdefault(module, []).append((node.name, target))
        elif node.op_type in ("Mul", "Div") and len(node.input) == 2:
            for operand in node.input:
                values = _constant(operand, tensors, path.parent)
                if values is not None and len(values) == 1 and values.dtype.kind in "fiu" and np.isfinite(values[0]):
                    hints.scalars.setdefault(module, []).append((node.name, node.op_type, float(values[0])))
    return hints
