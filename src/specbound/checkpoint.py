"""Opening a checkpoint: resolve a source to ``config.json`` plus lazily read weight tensors.

Supported now: a local Hugging Face model folder holding ``config.json`` and either
``model.safetensors`` or a sharded ``model.safetensors.index.json``.  Tensors are read one at a
time through ``safetensors`` (numpy framework, memory-mapped), upcast to float64 and checked for
NaN/Inf; torch is never imported.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SpecboundError

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclass
class Checkpoint:
    """A model's config and its weight tensors, read on demand.

    Attributes
    ----------
    location : str
        Human-readable origin (the folder).
    config : dict
        Decoded ``config.json``.
    shards : dict[str, Path]
        Tensor name -> safetensors file holding it.
    """

    location: str
    config: dict[str, Any]
    shards: dict[str, Path]
    _handles: dict[Path, Any] = field(default_factory=dict, repr=False)

    @property
    def names(self) -> list[str]:
        return sorted(self.shards)

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

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a float64 array; NaN/Inf is an error naming the tensor.

        Floating-point tensors (F64, F32, F16, BF16) are upcast exactly; any other dtype (integer,
        8-bit float: a quantized checkpoint) is an error, since its stored values are not the weights.
        """
        from safetensors import SafetensorError

        path = self.shards[name]
        dtype = self.dtype(name)
        if dtype not in FLOAT_DTYPES:
            raise SpecboundError(
                f"tensor {name!r} in {path} is stored as {dtype}, not as a floating-point weight "
                f"({', '.join(FLOAT_DTYPES)}): a quantized checkpoint's stored values are not its "
                f"weights; dequantize it and save it in float16/bfloat16/float32 first"
            )
        try:
            if dtype == "BF16":  # numpy has no bfloat16: read the raw 16-bit words from the file
                raw = _read_bf16(path, name)
            else:
                raw = self._handle(path, name).get_tensor(name)
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise _corrupt(path, exc, name) from None
        if not np.isfinite(raw).all():  # checked before the upcast: half the memory traffic
            bad = int(np.count_nonzero(~np.isfinite(raw)))
            raise SpecboundError(
                f"tensor {name!r} in {path} holds {bad} NaN/Inf value(s); the bounds are undefined "
                f"for non-finite weights: re-export the checkpoint from a healthy training state"
            )
        return np.asarray(raw, dtype=np.float64)

    def close(self) -> None:
        self._handles.clear()


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def _read_bf16(path: Path, name: str) -> np.ndarray:
    """A BF16 tensor as float32 (exact: bfloat16 is the top half of a float32), read through the
    file's header; the header was already validated by ``safe_open``."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(header_len))[name]
    start, end = entry["data_offsets"]
    count = int(np.prod(entry["shape"], dtype=np.int64))
    if end - start != 2 * count:
        raise ValueError(f"BF16 tensor of shape {entry['shape']} spans {end - start} bytes")
    words = np.fromfile(path, dtype="<u2", count=count, offset=8 + header_len + start)
    if words.size != count:
        raise ValueError(f"expected {count} BF16 values, the file holds {words.size}")
    return (words.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _corrupt(path: Path, exc: Exception, name: str | None = None) -> SpecboundError:
    what = f"tensor {name!r} of " if name else ""
    return SpecboundError(
        f"cannot read {what}{path}: the safetensors file is truncated or corrupt ({exc}); "
        f"re-download or re-save the checkpoint"
    )


def open_checkpoint(source: str | Path) -> Checkpoint:
    """Resolve ``source`` (a local Hugging Face model folder) to a :class:`Checkpoint`."""
    path = Path(source).expanduser()
    if not path.exists():
        raise SpecboundError(
            f"checkpoint not found: {source!s} does not exist; pass a Hugging Face model folder "
            f"(config.json + model.safetensors)"
        )
    if not path.is_dir():
        raise SpecboundError(
            f"expected a model folder holding config.json and model.safetensors, found the file {path}"
        )
    config = _read_config(path)
    return Checkpoint(location=str(path), config=config, shards=_weight_shards(path))


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


def _weight_shards(folder: Path) -> dict[str, Path]:
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
    present = sorted(p.name for p in folder.iterdir())
    hint = "save the model with save_pretrained (safetensors is its default format)"
    if any(name.endswith((".bin", ".pt", ".pth", ".ckpt")) for name in present):
        hint = ("PyTorch pickle weights (.bin/.pt) are not read, since unpickling needs torch and can run "
                "code: convert them once with transformers, model.save_pretrained(folder, "
                "safe_serialization=True)")
    shown = present[:20] + (["..."] if len(present) > 20 else [])
    raise SpecboundError(
        f"{folder} has no weights: expected {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX}, "
        f"found {shown}; {hint}"
    )


def _safetensors_names(path: Path) -> list[str]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as exc:
        raise _corrupt(path, exc) from None
