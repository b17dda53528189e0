"""Safetensors files, single or sharded: headers read by ``safetensors``, tensors by plain chunked
file reads upcast exactly to float64 (no torch)."""

from __future__ import annotations

import contextlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .base import ShardedCheckpoint
from .formats import SAFETENSORS
from .shard_index import read_weight_map



@dataclass
class SafetensorsCheckpoint(ShardedCheckpoint):
    """Single or sharded safetensors files, read lazily through ``safetensors`` (numpy).

    Attributes
    ----------
    shards : dict[str, Path]
        Tensor name -> safetensors file holding it.
    """

    location: str
    config: dict[str, Any]
    shards: dict[str, Path]
    _handles: dict[Path, Any] = field(default_factory=dict, repr=False)
    _headers: dict[Path, tuple[int, dict]] = field(default_factory=dict, repr=False)
    # Every read opens its own file handle; the caches above are filled idempotently (a class
    # attribute, not a field: nothing per instance).
    _read_lock = contextlib.nullcontext()

    def _handle(self, path: Path, name: str | None = None):
        from safetensors import SafetensorError, safe_open

        if path not in self._handles:
            try:
                self._handles[path] = safe_open(str(path), framework="numpy")
            except (SafetensorError, OSError) as exc:
                raise _corrupt(path, exc, name) from None
        return self._handles[path]

    def _slice(self, name: str):
        """The lazy safetensors slice of ``name``; a tensor absent from its file is an error."""
        from safetensors import SafetensorError

        path = self.shards[name]
        handle = self._handle(path, name)
        try:
            return handle.get_slice(name)
        except SafetensorError as exc:
            if name not in handle.keys():
                raise SpecboundError(
                    f"{path.name} does not contain the tensor {name!r}, but the shard index "
                    f"{path.parent / SAFETENSORS.index_files[0]} maps it there: the index and its shards do not "
                    f"belong together; re-download or re-save the checkpoint"
                ) from None
            raise _corrupt(path, exc, name) from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """The stored safetensors dtype code (``"F32"``, ``"F16"``, ``"BF16"``, ...)."""
        return str(self._slice(name).get_dtype())

    def _raw(self, name: str) -> np.ndarray:
        path = self.shards[name]
        if path not in self._headers:
            self._headers[path] = _read_header(path)
        try:
            return _read_float_tensor(path, *self._headers[path], name)
        except (OSError, ValueError, KeyError) as exc:
            raise _corrupt(path, exc, name) from None

    def close(self) -> None:
        self._handles.clear()



# Stored dtype -> numpy dtype of the raw little-endian words (BF16 is the top half of a float32).
_RAW_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
_CHUNK = 1 << 22  # values converted at a time (32 MB of float64)


def _read_header(path: Path) -> tuple[int, dict]:
    """``(header length, header)`` of a safetensors file (already validated by ``safe_open``)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        return header_len, json.loads(f.read(header_len))


def _read_float_tensor(path: Path, header_len: int, header: dict, name: str) -> np.ndarray:
    """One tensor as float64, read with plain file reads in chunks and upcast exactly.

    Not memory-mapped, and never holding a second full-size copy: peak memory is the float64
    result plus one chunk, whatever the stored dtype.
    """
    entry = header[name]
    raw_dtype = np.dtype(_RAW_DTYPES[entry["dtype"]])
    start, end = entry["data_offsets"]
    count = int(np.prod(entry["shape"], dtype=np.int64))
    if end - start != count * raw_dtype.itemsize:
        raise ValueError(f"{entry['dtype']} tensor of shape {entry['shape']} spans {end - start} bytes")
    out = np.empty(count, dtype=np.float64)
    with open(path, "rb") as f:
        f.seek(8 + header_len + start)
        for i in range(0, count, _CHUNK):
            n = min(_CHUNK, count - i)
            words = np.fromfile(f, dtype=raw_dtype, count=n)
            if words.size != n:
                raise ValueError(f"expected {count} values, the file ends after {i + words.size}")
            out[i:i + n] = (words.astype(np.uint32) << 16).view(np.float32) if entry["dtype"] == "BF16" else words
    return out.reshape(entry["shape"])


def _corrupt(path: Path, exc: Exception, name: str | None = None) -> SpecboundError:
    what = f"tensor {name!r} of " if name else ""
    return SpecboundError(
        f"cannot read {what}{path}: the safetensors file is truncated or corrupt ({exc}); "
        f"re-download or re-save the checkpoint"
    )



def safetensors_names(path: Path) -> list[str]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as exc:
        raise _corrupt(path, exc) from None


def open_safetensors_file(path: Path, config: dict[str, Any]) -> SafetensorsCheckpoint:
    """One ``.safetensors`` file."""
    return SafetensorsCheckpoint(str(path), config, {n: path for n in safetensors_names(path)})


def open_safetensors_folder(folder: Path, config: dict[str, Any]) -> SafetensorsCheckpoint:
    """A folder's ``model.safetensors`` or its shards."""
    return SafetensorsCheckpoint(location=str(folder), config=config, shards=safetensors_shards(folder))


def safetensors_shards(folder: Path) -> dict[str, Path] | None:
    """Tensor -> safetensors file, or None when the folder holds no safetensors weights."""
    (single,), (index,) = (folder / f for f in SAFETENSORS.folder_files), (folder / f for f in SAFETENSORS.index_files)
    if single.is_file():
        return {name: single for name in safetensors_names(single)}
    if index.is_file():
        return read_weight_map(index)
    return None
