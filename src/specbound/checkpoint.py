"""Opening a checkpoint: resolve a source to ``config.json`` plus lazily read weight tensors.

Supported now: a local Hugging Face model folder holding ``config.json`` and either
``model.safetensors`` or a sharded ``model.safetensors.index.json``.  Tensors are read one at a
time through ``safetensors`` (numpy framework, memory-mapped), upcast to float64 and checked for
NaN/Inf; torch is never imported.
"""

from __future__ import annotations

import json
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

    def _handle(self, path: Path):
        from safetensors import SafetensorError, safe_open

        if path not in self._handles:
            try:
                self._handles[path] = safe_open(str(path), framework="numpy")
            except (SafetensorError, OSError) as exc:
                raise _corrupt(path, exc) from None
        return self._handles[path]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self.shards[name]).get_slice(name).get_shape())

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a float64 array; NaN/Inf is an error naming the tensor."""
        from safetensors import SafetensorError

        path = self.shards[name]
        try:
            raw = self._handle(path).get_tensor(name)
        except (SafetensorError, OSError, ValueError, TypeError) as exc:
            raise _corrupt(path, exc, name) from None
        array = np.asarray(raw, dtype=np.float64)
        if not np.isfinite(array).all():
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise SpecboundError(
                f"tensor {name!r} in {path} holds {bad} NaN/Inf value(s); the bounds are undefined "
                f"for non-finite weights: re-export the checkpoint from a healthy training state"
            )
        return array

    def close(self) -> None:
        self._handles.clear()


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
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SpecboundError(f"cannot read the shard index {index}: {exc!r}") from None
        shards = {}
        for name, shard in weight_map.items():
            shard_path = folder / shard
            if not shard_path.is_file():
                raise SpecboundError(
                    f"the shard index {index} maps {name!r} to {shard}, which is missing from {folder}"
                )
            shards[name] = shard_path
        return shards
    present = sorted(p.name for p in folder.iterdir())[:20]
    raise SpecboundError(
        f"{folder} has no weights: expected {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX}, "
        f"found {present}"
    )


def _safetensors_names(path: Path) -> list[str]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as exc:
        raise _corrupt(path, exc) from None
