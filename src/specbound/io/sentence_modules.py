"""A sentence-transformers folder's ``modules.json``: the Transformer module's folder and the modules after it.

sentence-transformers saves a model as a list of modules (``modules.json``: ``[{"idx", "name", "path",
"type"}, ...]``): the Transformer (its folder, ``""`` for the root or ``0_Transformer/`` in the older layout),
then ``1_Pooling/`` (``config.json``: which ``pooling_mode_*`` are on), optionally ``2_Dense/``, ``3_Dense/`` ...
(``config.json``: ``in_features``, ``out_features``, ``bias``, ``activation_function``; weights ``linear.weight``
``(out, in)`` and ``linear.bias`` in ``model.safetensors`` or ``pytorch_model.bin``) and ``Normalize`` (no
files).  specbound analyses the Transformer; every other module is read here and reported
(``model.modules``): a Dense layer's matrix with its own norms (row-vector orientation ``W^T``, ``in x out``)
and its activation, all held fixed outside the analysed chain like the head (docs/formats.md, the
``sentence_transformers_modules`` assumption).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .base import load_json
from .formats import format_of

MODULES_JSON_MAX_BYTES = 1 << 20
MODULE_CONFIG_MAX_BYTES = 1 << 20
# A Dense layer's activation_function (the torch class sentence-transformers records) -> (short name, its
# Lipschitz constant sup |phi'|, as compute/propagation.ACTIVATIONS gives it)
DENSE_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": ("tanh", 1.0),
    "torch.nn.modules.linear.Identity": ("identity", 1.0),
    "torch.nn.modules.activation.ReLU": ("relu", 1.0),
    "torch.nn.modules.activation.GELU": ("gelu", 1.13),
    "torch.nn.modules.activation.Sigmoid": ("sigmoid", 0.25),
    "torch.nn.modules.activation.SiLU": ("silu", 1.0999),
}
DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class SentenceModule:
    """One module after the Transformer: ``path`` (its folder in the model folder), ``kind`` (``Pooling``,
    ``Dense``, ``Normalize``, or the type's last name); a Dense layer's ``weight`` ``(out, in)`` as stored and its
    ``activation`` (the recorded torch class); a Pooling module's ``modes`` (the ``pooling_mode_*`` that are on)."""

    path: str
    kind: str
    weight: np.ndarray | None = None
    activation: str | None = None
    bias: bool = False
    modes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SentenceModules:
    """``transformer``: the Transformer module's folder; ``after``: the modules that follow it, in order."""

    transformer: Path
    after: tuple[SentenceModule, ...] = field(default_factory=tuple)


def read_sentence_modules(folder: Path) -> SentenceModules | None:
    """``folder``'s ``modules.json`` read (None when there is none): the Transformer's folder, which must stay inside
    ``folder``, and every later module (a Dense layer's weight read and shape-checked against its config)."""
    listing = folder / "modules.json"
    if not listing.exists() and not listing.is_symlink():  # a FIFO or a device is refused by the reader
        return None
    modules = load_json(
        listing,
        "sentence-transformers modules.json",
        "sentence-transformers writes a list of {idx, name, path, type} entries",
        MODULES_JSON_MAX_BYTES,
    )
    entries = [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    types = [str(m.get("type", "")) for m in entries]
    first = next((i for i, t in enumerate(types) if t.endswith(".Transformer")), None)
    if first is None:
        raise SpecboundError(
            f"{listing} names no Transformer module (expected an entry with type "
            f"sentence_transformers.models.Transformer); pass the model's own folder"
        )
    root = folder.resolve()
    inner = _inside(folder, listing, entries[first].get("path", ""))
    after = tuple(_module(folder, listing, entry) for entry in entries[first + 1 :])
    return SentenceModules(inner if inner != root else root, after)


def _inside(folder: Path, listing: Path, path: Any, present: bool = True) -> Path:
    """A module's folder, which must be ``folder`` itself or inside it; ``present``: and exist (the Transformer's;
    a module without files, Normalize, has no folder in a hub repository, which keeps no empty folders)."""
    inner = (folder / str(path)).resolve()
    root = folder.resolve()
    if inner != root and (root not in inner.parents or present and not inner.is_dir()):
        raise SpecboundError(
            f"{listing} names the module folder {path!r}, which is not a folder inside {folder}; fix "
            f"modules.json or pass the model's own folder"
        )
    return inner


def _module(folder: Path, listing: Path, entry: dict) -> SentenceModule:
    kind = str(entry.get("type", "")).rpartition(".")[2] or "unknown"
    path = str(entry.get("path", ""))
    where = _inside(folder, listing, path, present=False)
    if kind == "Pooling":
        config = _module_config(where, kind)
        modes = tuple(
            sorted(
                k[len("pooling_mode_") :]
                for k, v in (config or {}).items()
                if k.startswith("pooling_mode_") and v is True
            )
        )
        return SentenceModule(path, kind, modes=modes)
    if kind != "Dense":
        return SentenceModule(path, kind)
    config = _module_config(where, kind)
    fix = f"the Dense module {path!r} needs config.json with in_features, out_features and activation_function"
    if not isinstance(config, dict):
        raise SpecboundError(f"{where / 'config.json'} is missing or not an object: {fix}")
    n_in, n_out, activation = (config.get(k) for k in ("in_features", "out_features", "activation_function"))
    if not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1 << 24 for n in (n_in, n_out)
    ) or not isinstance(activation, str):
        raise SpecboundError(
            f"{where / 'config.json'}: in_features={n_in!r}, out_features={n_out!r}, "
            f"activation_function={activation!r}: {fix} (positive integers and a class name)"
        )
    weight = _dense_weight(where, path, (n_out, n_in))
    return SentenceModule(path, kind, weight=weight, activation=activation, bias=config.get("bias") is True)


def _module_config(where: Path, kind: str) -> Any:
    path = where / "config.json"
    if not path.exists():
        return None
    return load_json(
        path,
        f"sentence-transformers {kind} config.json",
        "sentence-transformers writes one object",
        MODULE_CONFIG_MAX_BYTES,
    )


def _dense_weight(where: Path, path: str, shape: tuple[int, int]) -> np.ndarray:
    """``linear.weight`` of a Dense module's own weights file, checked to be ``(out_features, in_features)``."""
    file = next((where / name for name in DENSE_WEIGHTS if (where / name).is_file()), None)
    if file is None:
        raise SpecboundError(
            f"the Dense module {path!r} of modules.json has no weights ({' or '.join(DENSE_WEIGHTS)} "
            f"in {where}): the folder is incomplete; save the model again with sentence-transformers"
        )
    ckpt = format_of(file).open(file, {})
    try:
        if "linear.weight" not in ckpt.names:
            raise SpecboundError(
                f"{file} holds no linear.weight (found {', '.join(sorted(ckpt.names)[:5]) or 'nothing'})"
                f": not a sentence-transformers Dense module's weights"
            )
        found = tuple(ckpt.shape("linear.weight"))
        if found != shape:
            raise SpecboundError(
                f"{file}: linear.weight has shape {found}, but its config.json (out_features, "
                f"in_features) says {shape}: the Dense module's config does not describe its weights"
            )
        return np.asarray(ckpt.read("linear.weight"), dtype=np.float64)
    finally:
        ckpt.close()
