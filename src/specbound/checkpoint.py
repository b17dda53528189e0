"""Opening a checkpoint: resolve a source to ``config.json`` plus lazily read weight tensors.

Sources: a Hugging Face model folder (``config.json`` + ``model.safetensors``, its sharded index,
``pytorch_model.bin`` single or sharded, or an ONNX export ``model.onnx``), a weights file with
config.json beside it, a hub id in the local cache (``hub_cache.py``), or an in-memory model
(``torch_weights.py``).  Tensors are read one at a time, upcast to float64 and checked for NaN/Inf;
torch is imported only for PyTorch pickles and in-memory models, onnx only for ONNX files
(``onnx_weights.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SpecboundError

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"


class Checkpoint:
    """A model's config and its weight tensors, read on demand, one at a time.

    Subclasses store the tensors (safetensors files, PyTorch pickles read with
    ``weights_only=True``, an in-memory state dict); this class upcasts and validates them.

    Attributes
    ----------
    location : str
        Human-readable origin.
    config : dict
        Decoded ``config.json`` (or the in-memory model's config).
    """

    location: str
    config: dict[str, Any]
    # Layers analysed in parallel threads read one tensor at a time: loaded pickle shards, ONNX
    # graphs and in-memory tensors are shared state.  Safetensors reads open their own file handle
    # and overlap (SafetensorsCheckpoint).
    _read_lock: Any = threading.RLock()

    @property
    def names(self) -> list[str]:
        raise NotImplementedError

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, name: str) -> str:
        """The stored dtype as a safetensors code (``"F32"``, ``"F16"``, ``"BF16"``, ...)."""
        raise NotImplementedError

    def _raw(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def layout(self, name: str) -> str | None:
        """How ``name`` is stored when the format, not the model, decides it: ``"linear"`` for
        ``(out, in)``, ``"conv1d"`` for ``(in, out)`` (an ONNX ``MatMul`` operand). None: as the model
        stores it, so the family spec's layout applies."""
        return None

    def where(self, name: str) -> str:
        """The file (or object) holding ``name``, for messages."""
        return self.location

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a float64 array; NaN/Inf is an error naming the tensor.

        Floating-point tensors (F64, F32, F16, BF16) are upcast exactly; any other dtype (integer,
        8-bit float: a quantized checkpoint) is an error, since its stored values are not the weights.
        """
        with self._read_lock:  # layers analysed in parallel threads (see _read_lock)
            dtype = self.dtype(name)
            raw = self._raw(name) if dtype in FLOAT_DTYPES else None
        if raw is None:
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} is stored as {dtype}, not as a floating-point weight "
                f"({', '.join(FLOAT_DTYPES)}): a quantized checkpoint's stored values are not its "
                f"weights; dequantize it and save it in float16/bfloat16/float32 first"
            )
        array = np.asarray(raw, dtype=np.float64)
        # A NaN or an infinity makes the sum non-finite, so a finite sum clears the tensor in one
        # pass without a mask; a non-finite sum (or an overflow of huge finite values) is counted.
        with np.errstate(over="ignore", invalid="ignore"):
            total = array.sum()
        bad = 0 if np.isfinite(total) else int(np.count_nonzero(~np.isfinite(array)))
        if bad:
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} holds {bad} NaN/Inf value(s); the bounds are undefined "
                f"for non-finite weights: re-export the checkpoint from a healthy training state"
            )
        return array

    def close(self) -> None:
        """Release open files and cached shards."""


@dataclass
class SafetensorsCheckpoint(Checkpoint):
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

    @property
    def names(self) -> list[str]:
        return sorted(self.shards)

    def where(self, name: str) -> str:
        return str(self.shards[name])

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
                    f"{path.parent / SAFETENSORS_INDEX} maps it there: the index and its shards do not "
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


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


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


def open_checkpoint(source: Any, config: dict[str, Any] | None = None) -> Checkpoint:
    """Resolve ``source`` to a :class:`Checkpoint`.

    ``source`` is a Hugging Face model folder (safetensors, single or sharded, else PyTorch
    ``pytorch_model.bin`` single or sharded, else an ONNX export ``model.onnx``), a weights file
    (``.safetensors``, ``.bin``, ``.pt``, ``.pth``, ``.onnx``) with config.json beside it, a hub id
    (``org/name[@revision]``) resolved from the local Hugging Face cache, or an in-memory ``torch.nn.Module`` / state dict (``config`` needed for a
    bare state dict).
    """
    if not isinstance(source, (str, os.PathLike)):
        from .torch_weights import from_memory

        return from_memory(source, config)
    path = Path(source).expanduser()
    if not path.exists():
        from .hub_cache import looks_like_hub_id, resolve_hub_id

        if not looks_like_hub_id(str(source)):
            raise SpecboundError(
                f"checkpoint not found: {source!s} does not exist; pass a Hugging Face model folder "
                f"(config.json + model.safetensors), a weights file or a hub id in the local cache"
            )
        path = resolve_hub_id(str(source))
    if path.is_file():
        return _open_file(path)
    cfg = _read_config(path)
    shards = _weight_shards(path)
    if shards is not None:
        return SafetensorsCheckpoint(location=str(path), config=cfg, shards=shards)
    from .torch_weights import pickle_shards  # torch only if the folder really holds pickles

    if any((path / n).is_file() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        return _pickle_folder(path, cfg, pickle_shards)
    for onnx_file in (path / ONNX_SINGLE, path / ONNX_HUB):
        if onnx_file.is_file():
            from .onnx_weights import open_onnx

            return open_onnx(onnx_file, cfg)
    _no_weights(path)


def _pickle_folder(path: Path, cfg: dict[str, Any], pickle_shards) -> Checkpoint:
    from .torch_weights import PickleCheckpoint

    return PickleCheckpoint(location=str(path), config=cfg, shards=pickle_shards(path))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx")
ONNX_SINGLE = "model.onnx"
ONNX_HUB = Path("onnx") / "model.onnx"  # where sentence-transformers / Optimum repositories keep it


def _open_file(path: Path) -> Checkpoint:
    if path.suffix not in WEIGHT_SUFFIXES:
        raise SpecboundError(
            f"expected a model folder or a weights file ({', '.join(WEIGHT_SUFFIXES)}) with config.json "
            f"beside it, found the file {path}"
        )
    folder = path.parent
    if path.suffix == ".onnx" and folder.name == "onnx" and not (folder / "config.json").is_file():
        folder = folder.parent  # the hub layout: onnx/model.onnx, config.json at the repository's root
    cfg = _read_config(folder)
    if path.suffix == ".safetensors":
        return SafetensorsCheckpoint(str(path), cfg, {n: path for n in _safetensors_names(path)})
    if path.suffix == ".onnx":
        from .onnx_weights import open_onnx

        return open_onnx(path, cfg)
    from .torch_weights import from_pickle_file

    return from_pickle_file(path, cfg)


def _read_config(folder: Path) -> dict[str, Any]:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise SpecboundError(
            f"{folder} has no config.json: a Hugging Face model folder needs config.json beside "
            f"its weights (save the model with save_pretrained)"
        )
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecboundError(f"cannot parse {cfg_path} as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SpecboundError(f"{cfg_path} must hold a JSON object, found {type(config).__name__}")
    return config


def _weight_shards(folder: Path) -> dict[str, Path] | None:
    """Tensor -> safetensors file, or None when the folder holds no safetensors weights."""
    single = folder / SAFETENSORS_SINGLE
    index = folder / SAFETENSORS_INDEX
    if single.is_file():
        return {name: single for name in _safetensors_names(single)}
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise SpecboundError(
                f"cannot read the shard index {index} ({type(exc).__name__}: {exc}): expected a JSON "
                f"object with a 'weight_map'; re-download or re-save the checkpoint"
            ) from None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise SpecboundError(
                f"the shard index {index} is malformed: its 'weight_map' must map tensor names to shard "
                f"file names, found {type(weight_map).__name__}; re-download or re-save the checkpoint"
            )
        missing = sorted({shard for shard in weight_map.values() if not (folder / shard).is_file()})
        if missing:
            names = [n for n, shard in weight_map.items() if shard == missing[0]]
            raise SpecboundError(
                f"the shard index {index} names {len(missing)} shard file(s) missing from {folder}: "
                f"{', '.join(missing)} (holding e.g. {names[0]!r}); download every shard the index "
                f"lists, or re-save the checkpoint"
            )
        return {name: folder / shard for name, shard in weight_map.items()}
    return None


def _no_weights(folder: Path):
    present = sorted(p.name for p in folder.iterdir())
    hint = "save the model with save_pretrained (safetensors is its default format)"
    if any(name.endswith((".bin", ".pt", ".pth", ".ckpt")) for name in present):
        hint = ("PyTorch weights are read from pytorch_model.bin (or its index) in a folder, or when "
                "named as a file: specbound analyze folder/weights.pt")
    if any(name.endswith(".onnx") for name in present):
        hint = (f"ONNX exports are read from {ONNX_SINGLE} or {ONNX_HUB} in a folder, or when named as a "
                f"file: specbound analyze folder/exported.onnx")
    shown = present[:20] + (["..."] if len(present) > 20 else [])
    raise SpecboundError(
        f"{folder} has no weights: expected {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX} (or "
        f"pytorch_model.bin, {ONNX_SINGLE}), found {shown}; {hint}"
    )


def _safetensors_names(path: Path) -> list[str]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as exc:
        raise _corrupt(path, exc) from None
