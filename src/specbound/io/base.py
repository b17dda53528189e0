"""The base of every checkpoint format: a model's config and its weight tensors, read on demand,
one at a time, upcast to float64 and checked for NaN/Inf (one module per format beside this one;
:mod:`specbound.io.dispatch` picks the format)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


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
    # None, or one sentence saying that the weights read are not the stored values as trained (a
    # quantized GGUF file: dequantized values, so the bounds are of the quantized model); the
    # analysis reports it.
    weights_note: str | None = None
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



def read_config(folder: Path) -> dict[str, Any]:
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


