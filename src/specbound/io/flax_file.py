"""Flax weights (``flax_model.msgpack``, what ``FlaxPreTrainedModel.save_pretrained`` writes), read
with the ``msgpack`` package and numpy (``pip install -e '.[flax]'``), never JAX or Flax.

The file is ``flax.serialization.to_bytes(params)``: a msgpack map of nested dicts whose leaves are
msgpack extension objects, code 1 (an array: a nested msgpack ``(shape, dtype name, C-order
bytes)``) or 3 (a numpy scalar, same encoding); an array over 1 GiB is a dict
``{"__msgpack_chunked_array__": True, "shape": {"0": ...}, "chunks": {"0": flat part, ...}}``.

Names follow transformers' ``load_flax_weights_in_pytorch_model``: the dict path joined by dots, a
``kernel`` / ``scale`` / ``embedding`` leaf renamed ``weight``
(``encoder.layer.0.attention.self.query.weight``).  A 2-D Dense ``kernel`` is stored ``(in, out)``,
the transpose of ``nn.Linear.weight``: :meth:`FlaxCheckpoint.layout` says ``conv1d`` for it.

The whole file is decoded into memory once (msgpack has no index to seek by); each array stays as
its encoded bytes until it is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .base import Checkpoint
from .formats import FLAX

_CHUNKED = "__msgpack_chunked_array__"
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _import_msgpack():
    try:
        import msgpack
    except ImportError:
        raise SpecboundError(
            f"reading Flax flax_model.msgpack weights needs msgpack: {FLAX.install_hint()} (or "
            f"analyse the model's safetensors weights)"
        ) from None
    return msgpack


# A dimension numpy can index (and what any real array has): 0 <= d < 2^63.
_MAX_DIM = 2**63 - 1


@dataclass(frozen=True)
class _Packed:
    """One array as stored: shape, dtype name and its bytes (or its chunks, concatenated flat)."""

    shape: tuple[int, ...]
    dtype: str
    parts: tuple[bytes, ...]

    def array(self) -> np.ndarray:
        data = b"".join(self.parts)
        if self.dtype == "bfloat16":  # the top half of a float32: exact
            words = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
            flat = words.view(np.float32)
        else:
            flat = np.frombuffer(data, dtype=np.dtype(self.dtype))
        if flat.size != math.prod(self.shape):
            raise ValueError(f"{self.dtype} array of shape {self.shape} holds {flat.size} values")
        return flat.reshape(self.shape)

    def check(self) -> None:
        """The bytes held must be the bytes the shape and dtype declare (when the dtype is known)."""
        itemsize = _itemsize(self.dtype)
        held = sum(len(p) for p in self.parts)
        if itemsize is not None and held != itemsize * math.prod(self.shape):
            raise ValueError(
                f"a {self.dtype} array of shape {self.shape} needs {itemsize * math.prod(self.shape):,} "
                f"bytes but its buffer holds {held:,}"
            )


def _itemsize(dtype: str) -> int | None:
    if dtype == "bfloat16":
        return 2
    try:
        return np.dtype(dtype).itemsize if dtype in _CODES or dtype.startswith(("int", "uint")) else None
    except TypeError:
        return None


def _dims(value: Any, what: str) -> tuple[int, ...]:
    """A shape as msgpack holds it, checked: a sequence of integers in 0..2^63-1 (an infinity, a
    float or a 2^64 entry is refused, never rounded or wrapped)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} is {type(value).__name__}, not a list of dimensions")
    for d in value:
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= _MAX_DIM:
            raise ValueError(f"{what} {list(value)[:8]} holds {d!r}: a dimension is an integer in 0..2^63-1")
    return tuple(value)


def _unpack_array(msgpack, data: bytes) -> _Packed:
    fields = msgpack.unpackb(data, raw=True)
    if not isinstance(fields, (list, tuple)) or len(fields) != 3:
        raise ValueError("an array extension that is not (shape, dtype, bytes)")
    shape, dtype, buffer = fields
    if not isinstance(buffer, bytes):
        raise ValueError(f"an array's data is a {type(buffer).__name__}, not bytes")
    if not isinstance(dtype, bytes) or not dtype.isascii():
        raise ValueError(f"an array's dtype is {dtype!r:.40}, not a dtype name")
    return _Packed(_dims(shape, "an array's shape"), dtype.decode(), (buffer,))


def _unchunk(node: dict) -> _Packed:
    shape_map, chunk_map = node.get("shape"), node.get("chunks")
    if not isinstance(shape_map, dict) or not isinstance(chunk_map, dict):
        raise ValueError("a chunked array without its shape and chunks maps")
    shape = _dims([shape_map[str(i)] for i in range(len(shape_map))], "a chunked array's shape")
    chunks = [chunk_map[str(i)] for i in range(len(chunk_map))]
    if not chunks or not all(isinstance(c, _Packed) for c in chunks) or len({c.dtype for c in chunks}) != 1:
        raise ValueError("a chunked array with missing or mixed chunks")
    return _Packed(shape, chunks[0].dtype, tuple(p for c in chunks for p in c.parts))


def flatten(tree: Any) -> dict[tuple[str, ...], _Packed]:
    """Every array leaf of the decoded tree by its key path (chunked arrays joined); scalars and
    None are not weights.  Without recursion: msgpack
    nests up to 1024 levels, deeper than Python's recursion limit."""
    out: dict[tuple[str, ...], _Packed] = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), tree)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict) and node.get(_CHUNKED):
            node = _unchunk(node)
        if isinstance(node, _Packed):
            out[path] = node
        elif isinstance(node, dict):
            stack.extend((path + (str(key),), value) for key, value in reversed(list(node.items())))
    return dict(sorted(out.items()))


def pt_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """``(PyTorch parameter name, whether the stored array is the transpose)`` of a Flax key path."""
    parts = list(path)
    transposed = parts[-1] == "kernel"
    if parts[-1] in ("kernel", "scale", "embedding"):
        parts[-1] = "weight"
    return ".".join(parts), transposed


@dataclass
class FlaxCheckpoint(Checkpoint):
    """A Flax msgpack file, its arrays under PyTorch parameter names (module docstring)."""

    location: str
    config: dict[str, Any]
    path: Path
    arrays: dict[str, _Packed] = field(repr=False)
    transposed: set[str] = field(default_factory=set)

    @property
    def names(self) -> list[str]:
        return sorted(self.arrays)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.arrays[name].shape

    def dtype(self, name: str) -> str:
        kind = self.arrays[name].dtype
        return _CODES.get(kind, kind)

    def layout(self, name: str) -> str | None:
        return "conv1d" if name in self.transposed and len(self.shape(name)) == 2 else None

    def files(self) -> list[Path]:
        return [self.path]

    def _stored_in(self, name: str) -> Path | None:
        return self.path

    def where(self, name: str) -> str:
        return f"{self.path} (array {name!r})"

    def _raw(self, name: str) -> np.ndarray:
        try:
            return self.arrays[name].array()
        except (ValueError, TypeError) as exc:
            raise SpecboundError(
                f"cannot read {self.where(name)}: the msgpack file is corrupt ({exc}); "
                f"re-download it or re-save the model"
            ) from None


def open_flax(path: Path, config: dict[str, Any]) -> FlaxCheckpoint:
    """Decode ``path`` (arrays kept as bytes until read) and name its arrays."""
    msgpack = _import_msgpack()

    def ext_hook(code: int, data: bytes):
        if code in (1, 3):  # ndarray, numpy scalar
            return _unpack_array(msgpack, data)
        raise ValueError(f"unknown msgpack extension type {code} (flax uses 1, 2 and 3)")

    try:
        tree = msgpack.unpackb(path.read_bytes(), ext_hook=ext_hook, raw=False, strict_map_key=False)
        leaves = flatten(tree)
    except (ValueError, TypeError, KeyError, OSError, msgpack.UnpackException) as exc:
        raise SpecboundError(
            f"cannot read {path} as Flax msgpack weights: truncated or corrupt "
            f"({type(exc).__name__}: {exc}); re-download it, or re-save the model"
        ) from None
    if not isinstance(tree, dict) or not leaves:
        raise SpecboundError(f"{path} holds no arrays; expected the flax_model.msgpack that save_pretrained writes")
    arrays: dict[str, _Packed] = {}
    transposed: set[str] = set()
    sources: dict[str, tuple[str, ...]] = {}
    for key_path, packed in leaves.items():
        name, flip = pt_name(key_path)
        if name in arrays:  # a module's `kernel` and `weight`: which one is the weight cannot be told
            raise SpecboundError(
                f"{path}: two arrays map to the parameter {name!r} ({'/'.join(sources[name])!r}, "
                f"{'/'.join(key_path)!r}); not a transformers Flax checkpoint: re-save the model"
            )
        try:
            packed.check()
        except ValueError as exc:
            raise SpecboundError(
                f"cannot read {path} (array {name!r}): the msgpack file is corrupt ({exc}); "
                f"re-download it or re-save the model"
            ) from None
        arrays[name], sources[name] = packed, key_path
        if flip:
            transposed.add(name)
    return FlaxCheckpoint(location=str(path), config=config, path=path, arrays=arrays, transposed=transposed)
