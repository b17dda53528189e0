"""A GGUF file's header (metadata and tensor index) read with bounded work and checked before any
tensor byte is used.

The layout (ggml's ``docs/gguf.md``, versions 2 and 3): the magic ``GGUF``, a ``uint32`` version,
``uint64`` tensor and metadata counts, the metadata (key string, ``uint32`` value type, value), the
tensor infos (name, ``uint32`` dimension count, ``uint64`` dimensions innermost first, ``uint32``
ggml type, ``uint64`` offset into the data section), padding to ``general.alignment`` (default 32),
then the data section.  A string is a ``uint64`` byte length and UTF-8 bytes; an array a ``uint32``
element type, a ``uint64`` count and the elements.

Every count and length is checked against the bytes left in the file before it is used, so a
hostile header (an array declaring 2^63 elements, a string longer than the file) is one line in
microseconds, never a loop or an allocation.  Arrays longer than :data:`MAX_LIST` (a vocabulary,
its merges and scores: hundreds of thousands of entries) are stepped over without decoding them:
fixed-size elements in one jump, strings by their length prefixes.  What is checked besides:

* every string that is used (keys, tensor names, string values) is UTF-8; keys and tensor names are
  unique; value types are known; arrays nest at most :data:`MAX_NESTING` deep;
* ``general.alignment`` is a ``uint32`` power of two;
* each tensor has at most 4 dimensions (``GGML_MAX_DIMS``), a ggml type the ``gguf`` package knows,
  rows that are whole blocks of a quantized type, an offset that is a multiple of the alignment, and
  bytes that lie inside the data section (in exact integer arithmetic: nothing wraps around) and
  overlap no other tensor's.

A big-endian file (the version reads as ``0x03000000`` little-endian; ``gguf_convert_endian.py``
writes them for s390x) is read in its own byte order: its header here, its float tensors and the
half-precision scales of the quantized types that converter swaps (:data:`BIG_ENDIAN_FIELDS`) by
the tensor reader; any other quantized type of a big-endian file is refused there.
"""

from __future__ import annotations

import math
import mmap
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError, os_errors

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_LIST = 64  # arrays longer than this (vocabularies, merges) are stepped over, not decoded
MAX_NESTING = 4  # arrays of arrays: a real file has none
# GGUF value types: code -> (name, struct format or None for the variable-size ones).
VALUE_TYPES = {
    0: ("UINT8", "B"),
    1: ("INT8", "b"),
    2: ("UINT16", "H"),
    3: ("INT16", "h"),
    4: ("UINT32", "I"),
    5: ("INT32", "i"),
    6: ("FLOAT32", "f"),
    7: ("BOOL", "?"),
    8: ("STRING", None),
    9: ("ARRAY", None),
    10: ("UINT64", "Q"),
    11: ("INT64", "q"),
    12: ("FLOAT64", "d"),
}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
# Bytes of one tensor info at least: an empty name (8), no dimension (4), the type (4), the offset (8).
_MIN_TENSOR_INFO = 24
# Bytes of one metadata entry at least: an empty key (8), the type (4), a one-byte value.
_MIN_ENTRY = 13
# Quantized types whose blocks hold multi-byte fields that gguf_convert_endian.py byte-swaps in a
# big-endian file: type name -> (offsets of the fp16 fields inside a block).  Q4_0 / Q8_0: the
# block's scale first; Q4_K: its two scales first; Q6_K: the scale after 208 bytes of quants.
BIG_ENDIAN_FIELDS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


class _Bad(Exception):
    """A malformed header, with the byte where it was found (turned into a SpecboundError)."""

    def __init__(self, reason: str, at: int):
        super().__init__(reason)
        self.at = at


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array longer than :data:`MAX_LIST`, stepped over: its element type and length."""

    element: str
    count: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the index, checked (module docstring).

    Attributes
    ----------
    name : str
    kind : str
        The ggml type's name (``"F32"``, ``"Q8_0"``).
    shape : tuple[int, ...]
        Outermost first (``(out, in)`` for a matrix; GGUF stores the reverse).
    start : int
        Absolute offset of the first byte in the file.
    n_bytes : int
    n_elements : int
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    start: int
    n_bytes: int
    n_elements: int


@dataclass
class GGUFHeader:
    """What :func:`read_header` returns.

    Attributes
    ----------
    path : Path
    byteorder : str
        ``"<"`` (the usual) or ``">"`` (a big-endian file).
    metadata : dict[str, Any]
        Key -> value: a Python scalar, a str, a list (arrays up to :data:`MAX_LIST`) or a
        :class:`SkippedArray`.
    types : dict[str, str]
        Key -> its GGUF value type name (``"UINT32"``, ``"ARRAY"``).
    tensors : dict[str, TensorInfo]
    size : int
        The file's size in bytes when it was read.
    """

    path: Path
    byteorder: str
    metadata: dict[str, Any]
    types: dict[str, str]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    size: int = 0

    @property
    def big_endian(self) -> bool:
        return self.byteorder == ">"


class _Cursor:
    """Reads little- or big-endian values from a buffer, never past its end."""

    def __init__(self, buffer, order: str):
        self.buffer, self.order, self.at = buffer, order, 0
        self.size = len(buffer)

    def left(self) -> int:
        return self.size - self.at

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise _Bad(f"{what} needs {n:,} bytes but the file has {self.left():,} left", self.at)

    def scalar(self, fmt: str, what: str):
        width = struct.calcsize(fmt)
        self.need(width, what)
        (value,) = struct.unpack_from(self.order + fmt, self.buffer, self.at)
        self.at += width
        return value

    def string(self, what: str, decode: bool = True) -> str | None:
        length = self.scalar("Q", f"the length of {what}")
        self.need(length, f"{what} ({length:,} bytes)")
        start, self.at = self.at, self.at + length
        if not decode:
            return None
        try:
            return bytes(self.buffer[start : self.at]).decode("utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"{what} is not UTF-8", start) from None


def _shortest_float32(value: float) -> float:
    """The shortest decimal whose float32 rounding is ``value``'s (as numpy prints a float32)."""
    return float(str(np.float32(value)))


def _value(cur: _Cursor, code: int, what: str, depth: int = 0):
    """One metadata value of type ``code``: decoded, or (a long array) stepped over."""
    if code not in VALUE_TYPES:
        raise _Bad(f"{what} has the unknown value type {code} (GGUF defines 0..12)", cur.at - 4)
    name, fmt = VALUE_TYPES[code]
    if fmt == "f":  # float32: read as the shortest decimal that rounds to it (1e-06, not 9.99999997e-07),
        value = cur.scalar(fmt, what)  # the config's constant the converter wrote, equal to the folder's
        return _shortest_float32(value) if math.isfinite(value) else value
    if fmt is not None:
        return cur.scalar(fmt, what)
    if code == _STRING:
        return cur.string(what)
    if depth >= MAX_NESTING:
        raise _Bad(f"{what} nests arrays more than {MAX_NESTING} deep", cur.at)
    element = cur.scalar("I", f"the element type of {what}")
    count = cur.scalar("Q", f"the length of {what}")
    if element not in VALUE_TYPES:
        raise _Bad(f"{what} is an array of the unknown value type {element} (GGUF defines 0..12)", cur.at - 12)
    element_name, element_fmt = VALUE_TYPES[element]
    least = struct.calcsize(element_fmt) if element_fmt else (8 if element == _STRING else 12)
    cur.need(count * least, f"{what} ({count:,} {element_name} elements of at least {least} bytes)")
    if count <= MAX_LIST:
        return [_value(cur, element, f"element {i} of {what}", depth + 1) for i in range(count)]
    if element_fmt is not None:  # fixed-size elements: one jump
        cur.at += count * least
    elif element == _STRING:
        _skip_strings(cur, count, what)
    else:  # arrays of arrays: each stepped over in turn (at least 12 bytes each, so bounded by the file)
        for i in range(count):
            _value(cur, element, f"element {i} of {what}", depth + 1)
    return SkippedArray(element_name, count)


def _skip_strings(cur: _Cursor, count: int, what: str) -> None:
    """Step over ``count`` strings by their length prefixes (a 150,000-token vocabulary: ~0.05 s)."""
    unpack, buffer, at, end = struct.Struct(cur.order + "Q").unpack_from, cur.buffer, cur.at, cur.size
    for i in range(count):
        if at + 8 > end:
            raise _Bad(f"string {i} of {what} ({count:,} strings) runs past the end of the file", min(at, end))
        at += 8 + unpack(buffer, at)[0]
    if at > end:
        raise _Bad(f"the last string of {what} runs past the end of the file", end)
    cur.at = at


INSTALL_HINT = "pip install gguf (a base dependency of specbound: reinstall it with pip install specbound)"


def import_gguf():
    """The ``gguf`` package (its ggml type table and dequantizers), or a one-line error."""
    try:
        import gguf
    except ImportError:
        raise SpecboundError(f"reading GGUF files needs the gguf package: {INSTALL_HINT}") from None
    return gguf


def _ggml_types():
    gguf = import_gguf()
    return gguf.GGMLQuantizationType, gguf.GGML_QUANT_SIZES


def read_header(path: Path) -> GGUFHeader:
    """Read and check ``path``'s header (module docstring); any defect is one line naming the byte."""
    with os_errors(f"read the GGUF file {path}"):
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise SpecboundError(
                f"{path} is not a regular file (a FIFO, a device or a socket?); a GGUF model "
                f"is a file on disk: pass its path"
            )
        if info.st_size < 24:
            raise SpecboundError(
                f"cannot read {path} as a GGUF file: truncated or corrupt (it has {info.st_size} "
                f"bytes, a GGUF header at least 24); re-download or re-convert it"
            )
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            try:
                return _parse(buffer, path)
            except _Bad as bad:
                raise SpecboundError(
                    f"cannot read {path} as a GGUF file: truncated or corrupt ({bad}, at byte "
                    f"{bad.at:,}); re-download or re-convert it"
                ) from None


def _parse(buffer, path: Path) -> GGUFHeader:
    if bytes(buffer[:4]) != GGUF_MAGIC:
        raise _Bad(f"the magic is {bytes(buffer[:4])!r}, not {GGUF_MAGIC!r}", 0)
    (version,) = struct.unpack_from("<I", buffer, 4)
    order = "<"
    if version & 0xFFFF == 0 and version:  # written for the other byte order
        order, version = ">", struct.unpack_from(">I", buffer, 4)[0]
    if version not in VERSIONS:
        raise _Bad(f"GGUF version {version} (this reader reads versions {', '.join(map(str, VERSIONS))})", 4)
    cur = _Cursor(buffer, order)
    cur.at = 8
    n_tensors = cur.scalar("Q", "the tensor count")
    n_keys = cur.scalar("Q", "the metadata count")
    if n_keys * _MIN_ENTRY > cur.left():
        raise _Bad(
            f"the header declares {n_keys:,} metadata entries, more than the file's {cur.left():,} bytes can hold", 16
        )
    if n_tensors * _MIN_TENSOR_INFO > cur.left():
        raise _Bad(f"the header declares {n_tensors:,} tensors, more than the file's {cur.left():,} bytes can hold", 8)
    header = GGUFHeader(path=path, byteorder=order, metadata={}, types={}, size=cur.size)
    for i in range(n_keys):
        start = cur.at
        key = cur.string(f"the key of metadata entry {i}")
        code = cur.scalar("I", f"the value type of {key!r}")
        if key in header.metadata:
            raise _Bad(f"the metadata key {key!r} appears twice", start)
        header.metadata[key] = _value(cur, code, f"the value of {key!r}")
        header.types[key] = VALUE_TYPES[code][0]
    alignment = _alignment(header)
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_start = -(-cur.at // alignment) * alignment
    header.tensors = _check_tensors(infos, data_start, alignment, cur.size, path)
    return header


def _alignment(header: GGUFHeader) -> int:
    if "general.alignment" not in header.metadata:
        return DEFAULT_ALIGNMENT
    value, kind = header.metadata["general.alignment"], header.types["general.alignment"]
    if kind != "UINT32" or value <= 0 or value & (value - 1):
        raise _Bad(f"general.alignment is {value!r} ({kind}); expected a UINT32 power of two", 0)
    return value


def _tensor_info(cur: _Cursor, i: int) -> tuple:
    start = cur.at
    name = cur.string(f"the name of tensor {i}")
    n_dims = cur.scalar("I", f"the dimension count of {name!r}")
    if n_dims > MAX_DIMS:
        raise _Bad(f"tensor {name!r} declares {n_dims:,} dimensions (ggml tensors have at most {MAX_DIMS})", start)
    dims = [cur.scalar("Q", f"dimension {d} of {name!r}") for d in range(n_dims)]
    code = cur.scalar("I", f"the type of {name!r}")
    offset = cur.scalar("Q", f"the offset of {name!r}")
    return name, tuple(dims), code, offset, start


def _check_tensors(infos: list, data_start: int, alignment: int, size: int, path: Path) -> dict[str, TensorInfo]:
    """Each tensor's type, shape and place in the data section (module docstring), in exact integers."""
    kinds, sizes = _ggml_types()
    tensors: dict[str, TensorInfo] = {}
    for name, dims, code, offset, at in infos:
        if name in tensors:
            raise _Bad(f"the tensor {name!r} appears twice", at)
        try:
            kind = kinds(code)
        except ValueError:
            raise SpecboundError(
                f"{path}: tensor {name!r} is stored in the quantization type {code}, which this gguf package does "
                f"not know; "
                f"upgrade gguf (pip install -U gguf) or re-quantize the model with llama-quantize"
            ) from None
        block, type_size = sizes[kind]
        kind_name = kind.name
        count = math.prod(dims)
        if block > 1 and not dims:
            raise _Bad(f"tensor {name!r} ({kind_name}) has no dimension: a quantized tensor is rows of blocks", at)
        if dims and dims[0] % block:
            raise _Bad(
                f"tensor {name!r} ({kind_name}) has rows of {dims[0]:,} values, not a multiple of its block size "
                f"{block}",
                at,
            )
        n_bytes = count // block * type_size
        if offset % alignment:
            raise _Bad(
                f"tensor {name!r} starts at offset {offset:,} of the data section, not a multiple of the "
                f"alignment {alignment}",
                at,
            )
        start = data_start + offset
        if start + n_bytes > size:
            raise _Bad(
                f"tensor {name!r} ({kind_name}, {count:,} values) lies at bytes {start:,}..{start + n_bytes:,}, "
                f"past the end of the {size:,}-byte file",
                at,
            )
        tensors[name] = TensorInfo(name, kind_name, tuple(reversed(dims)), start, n_bytes, count)
    placed = sorted((t for t in tensors.values() if t.n_bytes), key=lambda t: t.start)
    for before, after in zip(placed, placed[1:]):
        if after.start < before.start + before.n_bytes:
            raise _Bad(
                f"tensors {before.name!r} (bytes {before.start:,}..{before.start + before.n_bytes:,}) and "
                f"{after.name!r} (from byte {after.start:,}) overlap",
                after.start,
            )
    return tensors
