"""Safetensors files, single or sharded: headers read by ``safetensors``, tensors by plain chunked
file reads upcast exactly to float64 (no torch)."""

from __future__ import annotations

import contextlib
import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

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
    reads_stored = True

    def _handle(self, path: Path, name: str | None = None):
        if path not in self._handles:
            try:
                self._handles[path] = safe_open(str(path), framework="numpy")
            except (SafetensorError, OSError) as exc:
                raise _corrupt(path, exc, name) from None
        return self._handles[path]

    def _slice(self, name: str):
        """The lazy safetensors slice of ``name``; a tensor absent from its file is an error."""
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

    def _raw_compact(self, name: str) -> np.ndarray | None:
        """An F32, F16 or BF16 tensor as float32 (exact), read like :meth:`_raw`; None for F64."""
        path = self.shards[name]
        if path not in self._headers:
            self._headers[path] = _read_header(path)
        header_len, header = self._headers[path]
        if header.get(name, {}).get("dtype") not in ("F32", "F16", "BF16"):
            return None
        try:
            return _read_float_tensor(path, header_len, header, name, np.float32)
        except (OSError, ValueError, KeyError) as exc:
            raise _corrupt(path, exc, name) from None

    def stored(self, name: str) -> np.ndarray:
        """``name``'s stored values in their own dtype (a quantized checkpoint's packed integers,
        scales and zero points: :mod:`.quantized`), read with plain file reads."""
        path = self.shards[name]
        if path not in self._headers:
            self._headers[path] = _read_header(path)
        header_len, header = self._headers[path]
        if name not in header:
            self._slice(name)  # raises: the index maps the tensor to a shard that lacks it
        entry = header[name]
        if entry["dtype"] not in STORED_DTYPES:
            raise SpecboundError(
                f"tensor {name!r} in {path} is stored as {entry['dtype']}, which no reader of "
                f"specbound decodes; re-save the checkpoint"
            )
        start, end = entry["data_offsets"]
        try:
            with open(path, "rb") as f:
                f.seek(8 + header_len + start)
                return stored_values(entry, [f.read(end - start)])
        except (OSError, ValueError) as exc:
            raise _corrupt(path, exc, name) from None

    def _raw_part(self, name: str, index: int) -> np.ndarray:
        """The bytes of ``name[index]`` alone (an expert of a bank; the header's offsets were checked
        against the file when it was read)."""
        path = self.shards[name]
        if path not in self._headers:
            self._headers[path] = _read_header(path)
        header_len, header = self._headers[path]
        entry = header[name]
        start, end = entry["data_offsets"]
        parts = int(entry["shape"][0])
        size = (end - start) // parts
        part = {
            **entry,
            "shape": list(entry["shape"][1:]),
            "data_offsets": [start + index * size, start + (index + 1) * size],
        }
        try:
            return _read_float_tensor(path, header_len, {name: part}, name)
        except (OSError, ValueError, KeyError) as exc:
            raise _corrupt(path, exc, name) from None

    def close(self) -> None:
        self._handles.clear()


# Stored dtype -> numpy dtype of the raw little-endian words (BF16 is the top half of a float32).
_RAW_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
# Every dtype's raw words, for the stored values of a quantized checkpoint (packed integers, 8-bit
# floats as their bytes): read as stored, never upcast (:func:`stored_values`).
STORED_DTYPES = {
    **_RAW_DTYPES,
    "I8": "<i1",
    "U8": "<u1",
    "I16": "<i2",
    "U16": "<u2",
    "I32": "<i4",
    "U32": "<u4",
    "I64": "<i8",
    "U64": "<u8",
    "F8_E4M3": "<u1",
    "F8_E5M2": "<u1",
    "F8_E8M0": "<u1",
    "BOOL": "<u1",
}
_CHUNK = 1 << 22  # values converted at a time (32 MB of float64)
# The safetensors format's own limit on the JSON header (the Rust reader refuses longer ones).
MAX_HEADER_BYTES = 100_000_000


def header_length(first8: bytes, file_size: int) -> int:
    """The JSON header's length from a safetensors file's first 8 bytes (little-endian u64), checked
    to fit in a file of ``file_size`` bytes (a raised ValueError says why not)."""
    if len(first8) != 8 or file_size < 8:
        raise ValueError(f"a safetensors file starts with an 8-byte header length; this one has {file_size} bytes")
    (n,) = struct.unpack("<Q", first8)
    if n > MAX_HEADER_BYTES or 8 + n > file_size:
        raise ValueError(
            f"its header length {n:,} exceeds the file's {file_size:,} bytes (or the format's {MAX_HEADER_BYTES:,})"
        )
    return n


def check_header(raw: bytes, file_size: int) -> dict:
    """The decoded safetensors header (``raw``: its JSON bytes), every entry checked against a file
    of ``file_size`` bytes: a dtype, a shape of non-negative integers, and ``data_offsets`` ``[a, b]``
    inside the data (``0 <= a <= b <= file_size - 8 - len(raw)``) spanning exactly the shape's values
    of a floating-point dtype.  ``__metadata__`` is dropped.  A raised ValueError says what lies."""
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError(f"its header is a JSON {type(header).__name__}, not an object")
    data = file_size - 8 - len(raw)
    header.pop("__metadata__", None)
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int for o in offsets)
            and isinstance(shape, list)
            and all(type(d) is int and d >= 0 for d in shape)
            and isinstance(entry.get("dtype"), str)
        ):
            raise ValueError(f"tensor {name!r} has no dtype, shape and data_offsets [start, end]")
        start, end = offsets
        if not 0 <= start <= end <= data:
            raise ValueError(
                f"tensor {name!r} lies at data bytes {start:,}..{end:,}, beyond the "
                f"{max(data, 0):,} bytes of data the file holds"
            )
        if entry["dtype"] in STORED_DTYPES:
            stored = math.prod(shape) * np.dtype(STORED_DTYPES[entry["dtype"]]).itemsize
            if end - start != stored:
                raise ValueError(
                    f"{entry['dtype']} tensor {name!r} of shape {shape} spans {end - start:,} bytes, not {stored:,}"
                )
    return header


def _read_header(path: Path) -> tuple[int, dict]:
    """``(header length, header)`` of a safetensors file, checked by :func:`check_header`."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header_len = header_length(f.read(8), size)
        return header_len, check_header(f.read(header_len), size)


def upcast(entry: dict, chunks, dtype=np.float64) -> np.ndarray:
    """One tensor as float64 (or ``dtype``: float32 holds F32, F16 and BF16 exactly) from its stored
    bytes, upcast exactly, chunk by chunk.

    ``entry``: its header entry (dtype, shape, data_offsets); ``chunks``: its stored bytes, in order,
    in pieces of any size (a file read in chunks, an HTTP body as it arrives).  Never holding a
    second full-size copy: peak memory is the float64 result plus one chunk, whatever the dtype.
    """
    raw_dtype = np.dtype(_RAW_DTYPES[entry["dtype"]])
    count = math.prod(entry["shape"])
    out = np.empty(count, dtype=dtype)
    filled, carry = 0, b""
    for chunk in chunks:
        buf = carry + chunk if carry else chunk
        n = len(buf) // raw_dtype.itemsize
        if filled + n > count:
            raise ValueError(f"expected {count} values, the bytes hold more")
        words = np.frombuffer(buf, dtype=raw_dtype, count=n)
        out[filled : filled + n] = (
            (words.astype(np.uint32) << 16).view(np.float32) if entry["dtype"] == "BF16" else words
        )
        filled, carry = filled + n, bytes(buf[n * raw_dtype.itemsize :])
    if filled != count or carry:
        raise ValueError(f"expected {count} values, the file ends after {filled}")
    return out.reshape(entry["shape"])


def stored_values(entry: dict, chunks) -> np.ndarray:
    """One tensor's stored values in their own dtype (:data:`STORED_DTYPES`; BF16 as its uint16
    words, an 8-bit float as its bytes), from its bytes in ``chunks`` (as for :func:`upcast`)."""
    raw = np.dtype(STORED_DTYPES[entry["dtype"]])
    count = math.prod(entry["shape"])
    data = b"".join(chunks)
    if len(data) != count * raw.itemsize:
        raise ValueError(f"expected {count} values ({count * raw.itemsize:,} bytes), the file holds {len(data):,}")
    return np.frombuffer(data, dtype=raw).astype(raw.newbyteorder("="), copy=True).reshape(entry["shape"])


def _read_float_tensor(path: Path, header_len: int, header: dict, name: str, dtype=np.float64) -> np.ndarray:
    """One tensor as float64 (or ``dtype``, exact for the tensor), read with plain file reads in chunks
    (not memory-mapped) and upcast."""
    entry = header[name]
    start, end = entry["data_offsets"]
    step = _CHUNK * np.dtype(_RAW_DTYPES[entry["dtype"]]).itemsize

    def chunks():
        with open(path, "rb") as f:
            f.seek(8 + header_len + start)
            for at in range(start, end, step):
                yield f.read(min(step, end - at))

    return upcast(entry, chunks(), dtype)


def _corrupt(path: Path, exc: Exception, name: str | None = None) -> SpecboundError:
    what = f"tensor {name!r} of " if name else ""
    return SpecboundError(
        f"cannot read {what}{path}: the safetensors file is truncated or corrupt ({exc}); "
        f"re-download or re-save the checkpoint"
    )


def safetensors_names(path: Path) -> list[str]:
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
