"""Weights that come through PyTorch: ``.bin``/``.pt`` pickles (``torch.load(weights_only=True)``
only: a pickle that would run code is refused) and in-memory ``nn.Module``\\s or state dicts.

torch is imported here only, when such a source is used; it stays an optional dependency.
"""

from __future__ import annotations

import re
import zipfile

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError, os_errors
from .base import Checkpoint, ShardedCheckpoint, fingerprint
from .formats import PYTORCH
from .shard_index import read_weight_map

_DTYPE_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _dtype_code(tensor: Any) -> str:
    name = str(tensor.dtype).replace("torch.", "")
    return _DTYPE_CODES.get(name, name)


def _to_numpy(tensor: Any, name: str, where: str) -> np.ndarray:
    """The tensor's values as an array: a sparse tensor (COO, CSR, ...) as the dense matrix it
    stands for (its size was checked by ``Checkpoint.check_size``), on any device; a meta tensor
    has no values and is refused by name."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if getattr(tensor, "is_meta", False):
        raise SpecboundError(
            f"tensor {name!r} in {where} is a meta tensor: it has a shape but no values (a model "
            f"built on the meta device, or loaded with device_map/low_cpu_mem_usage and never "
            f"materialised); load the weights first (from_pretrained on the CPU) and pass that model"
        )
    t = tensor.detach().cpu()
    if str(getattr(t, "layout", "torch.strided")) != "torch.strided":
        t = t.to_dense()
    if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16; float32 holds it exactly
        t = t.float()
    return t.numpy()


@dataclass
class TensorMapCheckpoint(Checkpoint):
    """Tensors held in a mapping (an in-memory state dict), torch tensors or numpy arrays."""

    location: str
    config: dict[str, Any]
    tensors: Mapping[str, Any]

    @property
    def names(self) -> list[str]:
        return sorted(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.tensors[name].shape)

    def dtype(self, name: str) -> str:
        return _dtype_code(self.tensors[name])

    def _raw(self, name: str) -> np.ndarray:
        return _to_numpy(self.tensors[name], name, self.where(name))


@dataclass
class PickleCheckpoint(ShardedCheckpoint):
    """``.bin``/``.pt`` files, single or sharded, each loaded (memory-mapped) when first needed."""

    location: str
    config: dict[str, Any]
    shards: dict[str, Path]
    _loaded: dict[Path, Mapping[str, Any]] = field(default_factory=dict, repr=False)

    def _tensor(self, name: str) -> Any:
        path = self.shards[name]
        if path not in self._loaded:
            self._loaded[path] = load_state_dict(path)
        try:
            return self._loaded[path][name]
        except KeyError:
            raise SpecboundError(
                f"{path.name} does not contain the tensor {name!r}, but the shard index "
                f"maps it there: re-download or re-save the checkpoint"
            ) from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._tensor(name).shape)

    def dtype(self, name: str) -> str:
        return _dtype_code(self._tensor(name))

    def _raw(self, name: str) -> np.ndarray:
        return _to_numpy(self._tensor(name), name, self.where(name))

    def close(self) -> None:
        self._loaded.clear()


def _import_torch():
    try:
        import torch
    except ImportError:
        raise SpecboundError(
            f"reading PyTorch .bin/.pt weights needs torch: {PYTORCH.install_hint()} (or convert "
            "the checkpoint to safetensors, which needs no torch)"
        ) from None
    return torch


def load_state_dict(path: Path) -> Mapping[str, Any]:
    """``torch.load(path, weights_only=True)``; anything but a tensor mapping is refused.

    A plain state dict, or a training checkpoint holding one under ``state_dict`` / ``model``.
    A zip checkpoint (``torch.save``'s format since PyTorch 1.6) has every member's CRC-32 checked
    first, then is memory-mapped; a legacy (non-zip) one is read into memory, as torch requires.
    """
    torch = _import_torch()
    with os_errors(f"read {path}"):
        is_zip = _verify_zip(path)
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=is_zip)
    except Exception as exc:  # noqa: BLE001  (UnpicklingError, RuntimeError, EOFError, ...)
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", str(exc))  # PyTorch's message carries ANSI escapes
        pickled = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        if pickled:  # torch.save(model): the pickle names the model's class
            raise SpecboundError(
                f"{path} is a whole pickled Python object (class {pickled.group(1)}, saved with "
                f"torch.save(model)), not a state dict; specbound never unpickles arbitrary objects (a pickle "
                f"can run code). If you trust the file, analyse the loaded model in Python: "
                f"specbound.analyze(torch.load({str(path)!r}, weights_only=False)); or re-save it with "
                f"model.save_pretrained(folder) or torch.save(model.state_dict(), file)"
            ) from None
        reason = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        raise SpecboundError(
            f"refused or failed to load {path} with torch.load(weights_only=True): {reason[:300]}. "
            f"specbound never unpickles arbitrary objects (a pickle can run code); if you trust the "
            f"file, re-save its state dict with safetensors"
        ) from None
    for candidate in (obj, *(obj.get(k) for k in ("state_dict", "model") if isinstance(obj, Mapping))):
        if (
            isinstance(candidate, Mapping)
            and candidate
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in candidate.items())
        ):
            return candidate
    raise SpecboundError(
        f"{path} holds no state dict (a mapping of tensor names to tensors), found {type(obj).__name__}"
    )


def _verify_zip(path: Path) -> bool:
    """Whether ``path`` is a zip checkpoint, after checking every member against its CRC-32.

    ``torch.load(mmap=True)`` maps the tensor bytes without reading them, so it never notices
    altered bytes: a flipped bit would silently become a different weight.  Python's zipfile
    checks each member's CRC as it reads it to the end (one sequential pass over the file, at disk
    speed).  A legacy (non-zip) checkpoint carries no checksum to verify.
    """
    version = fingerprint(path)
    if version in _VERIFIED:  # this very version passed already (a sweep opens a file several times)
        return True
    try:
        if not zipfile.is_zipfile(path):  # itself raises on some damaged end records
            return False
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    while member.read(1 << 22):
                        pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, NotImplementedError) as exc:
        raise SpecboundError(
            f"{path} is a corrupt PyTorch zip checkpoint ({type(exc).__name__}: {str(exc)[:200]}): its "
            f"stored bytes do not match their checksums (CRC-32); re-download or re-save the checkpoint"
        ) from None
    if fingerprint(path) == version:  # not rewritten while it was read
        _VERIFIED.add(version)
    return True


# Fingerprints (io.base.fingerprint) of the zip checkpoints whose CRCs this process has verified.
_VERIFIED: set[str] = set()


def pickle_shards(folder: Path) -> dict[str, Path] | None:
    """Tensor -> file for ``pytorch_model.bin`` or its sharded index; None when neither is there."""
    (single,), (index,) = (folder / f for f in PYTORCH.folder_files), (folder / f for f in PYTORCH.index_files)
    if single.is_file():
        return {name: single for name in load_state_dict(single)}
    if index.is_file():
        return read_weight_map(index)
    return None


def from_pickle_file(path: Path, config: dict[str, Any]) -> PickleCheckpoint:
    """One pickled state dict (``.bin``, ``.pt``, ``.pth``)."""
    return PickleCheckpoint(str(path), config, {name: path for name in load_state_dict(path)})


def open_pickle_folder(folder: Path, config: dict[str, Any]) -> PickleCheckpoint:
    """A folder's ``pytorch_model.bin`` or its shards."""
    return PickleCheckpoint(location=str(folder), config=config, shards=pickle_shards(folder))


def _is_array(value: Any) -> bool:
    """A torch tensor or numpy array (what :func:`_to_numpy` converts), without importing torch."""
    if isinstance(value, np.ndarray):
        return True
    return type(value).__module__.startswith("torch") and hasattr(value, "shape") and hasattr(value, "dtype")


def from_memory(model: Any, config: dict[str, Any] | None) -> TensorMapCheckpoint:
    """An ``nn.Module`` (its ``state_dict()``; config from ``model.config`` when it has one) or a
    state dict (``config`` required)."""
    if hasattr(model, "state_dict") and callable(model.state_dict):
        if config is None and hasattr(model, "config"):
            cfg = model.config
            config = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        tensors, what = model.state_dict(), f"in-memory {type(model).__name__}"
    elif isinstance(model, Mapping):
        tensors, what = model, "in-memory state dict"
    else:
        raise SpecboundError(
            f"expected a model folder, a weights file, a hub id (a str or path), a torch.nn.Module or a "
            f"state dict (a mapping of tensor names to tensors), found {type(model).__name__}"
        )
    bad = next(((k, v) for k, v in tensors.items() if not isinstance(k, str) or not _is_array(v)), None)
    if bad is not None:
        raise SpecboundError(
            f"the {what} maps {bad[0]!r} to a {type(bad[1]).__name__}: expected tensor names (str) mapped "
            f"to torch tensors or numpy arrays; pass model.state_dict()"
        )
    if config is None:
        raise SpecboundError(
            f"analysing an {what} needs its config: pass config=dict(model_type=..., "
            f"num_hidden_layers=..., ...) as in config.json"
        )
    if not isinstance(config, Mapping):
        raise SpecboundError(f"config must be a mapping like config.json, found {type(config).__name__}")
    return TensorMapCheckpoint(what, dict(config), dict(tensors))
