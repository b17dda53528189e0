"""Opening a checkpoint: resolve a source to ``config.json`` plus lazily read weight tensors.

Sources: a Hugging Face model folder (``config.json`` + ``model.safetensors``, its sharded index,
``pytorch_model.bin`` single or sharded, or an ONNX export ``model.onnx``), a weights file with
config.json beside it, a hub id in the local cache (:mod:`.hub_cache`), or an in-memory model
(:mod:`.pytorch`).  torch is imported only for PyTorch pickles and in-memory models, onnx only for
ONNX files (:mod:`.onnx_graph`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import SpecboundError, os_errors, refuse_oversized_integers
from .base import Checkpoint, read_config
from .safetensors_file import (SAFETENSORS_INDEX, SAFETENSORS_SINGLE, SafetensorsCheckpoint, safetensors_names,
                               safetensors_shards)


def open_checkpoint(source: Any, config: dict[str, Any] | None = None) -> Checkpoint:
    """Resolve ``source`` to a :class:`Checkpoint`.

    ``source`` is a Hugging Face model folder (safetensors, single or sharded, else PyTorch
    ``pytorch_model.bin`` single or sharded, else an ONNX export ``model.onnx``), a weights file
    (``.safetensors``, ``.bin``, ``.pt``, ``.pth``, ``.onnx``) with config.json beside it, a hub id
    (``org/name[@revision]``) resolved from the local Hugging Face cache, or an in-memory ``torch.nn.Module`` / state dict (``config`` needed for a
    bare state dict).
    """
    refuse_oversized_integers(config, "config", "pass the dimensions as config.json holds them")
    if not isinstance(source, (str, os.PathLike)):
        from .pytorch import from_memory

        return from_memory(source, config)
    with os_errors(f"open the checkpoint {source}"):
        ckpt = _open_path(source, config)
    if config:  # the caller's keys (--config FILE, --set key=value) win over config.json's
        ckpt.config = {**ckpt.config, **config}
    return ckpt


def _open_path(source: str | os.PathLike, config: dict[str, Any] | None) -> Checkpoint:
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
        return _open_file(path, config)
    if not (path / "config.json").is_file():
        for onnx_file in (path / ONNX_SINGLE, path / ONNX_HUB):
            if onnx_file.is_file():  # an export on its own: dimensions inferred from the graph
                return _open_file(onnx_file)
    cfg = config if config and not (path / "config.json").is_file() else read_config(path)
    _refuse_folders_named_like_files(path)
    shards = safetensors_shards(path)
    if shards is not None:
        return _with_config(SafetensorsCheckpoint(location=str(path), config=cfg, shards=shards), path)
    from .pytorch import pickle_shards  # torch only if the folder really holds pickles

    if any((path / n).is_file() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        return _with_config(_pickle_folder(path, cfg, pickle_shards), path)
    for onnx_file in (path / ONNX_SINGLE, path / ONNX_HUB):
        if onnx_file.is_file():
            from .onnx_graph import open_onnx

            return _with_config(open_onnx(onnx_file, cfg), path)
    for other in (path / "tf_model.h5", path / "flax_model.msgpack"):  # TF/Keras, Flax: no torch
        if other.is_file():
            return _open_file(other, cfg)
    _no_weights(path)


def _with_config(ckpt: Checkpoint, folder: Path) -> Checkpoint:
    if (folder / "config.json").is_file():  # not when the caller's --config stands in for it
        ckpt.config_path = folder / "config.json"
    return ckpt


def _refuse_folders_named_like_files(folder: Path) -> None:
    """A folder where a weights file or index belongs is an error naming it (not "no weights")."""
    for name in (SAFETENSORS_SINGLE, SAFETENSORS_INDEX, "pytorch_model.bin", "pytorch_model.bin.index.json",
                 str(ONNX_SINGLE), "tf_model.h5", "flax_model.msgpack"):
        if (folder / name).is_dir():
            raise SpecboundError(f"{folder / name} is a folder, not a file: a model folder holds its weights "
                                 f"in the file {name}; move the folder away or put the weights file there")


def _pickle_folder(path: Path, cfg: dict[str, Any], pickle_shards) -> Checkpoint:
    from .pytorch import PickleCheckpoint

    return PickleCheckpoint(location=str(path), config=cfg, shards=pickle_shards(path))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".gguf", ".h5", ".msgpack")
ONNX_SINGLE = "model.onnx"
ONNX_HUB = Path("onnx") / "model.onnx"  # where sentence-transformers / Optimum repositories keep it


def _open_file(path: Path, config: dict[str, Any] | None = None) -> Checkpoint:
    from .gguf_file import is_gguf, open_gguf  # GGUF: config in the file's metadata, no config.json

    if is_gguf(path):
        return open_gguf(path)
    if path.suffix not in WEIGHT_SUFFIXES:
        raise SpecboundError(
            f"expected a model folder or a weights file ({', '.join(WEIGHT_SUFFIXES)}) with config.json "
            f"beside it, found the file {path}"
        )
    folder = path.parent
    if path.suffix == ".onnx" and folder.name == "onnx" and not (folder / "config.json").is_file():
        folder = folder.parent  # the hub layout: onnx/model.onnx, config.json at the repository's root
    if path.suffix == ".onnx" and not (folder / "config.json").is_file():
        from .onnx_graph import open_onnx  # an export on its own: dimensions inferred from the graph

        return open_onnx(path, None)
    cfg = config if config and not (folder / "config.json").is_file() else read_config(folder)
    if path.suffix == ".safetensors":
        return _with_config(SafetensorsCheckpoint(str(path), cfg, {n: path for n in safetensors_names(path)}), folder)
    if path.suffix == ".onnx":
        from .onnx_graph import open_onnx

        return _with_config(open_onnx(path, cfg), folder)
    if path.suffix == ".h5":
        from .tf_file import open_h5

        return _with_config(open_h5(path, cfg), folder)
    if path.suffix == ".msgpack":
        from .flax_file import open_flax

        return _with_config(open_flax(path, cfg), folder)
    from .pytorch import from_pickle_file

    return _with_config(from_pickle_file(path, cfg), folder)



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
        f"pytorch_model.bin, {ONNX_SINGLE}, tf_model.h5, flax_model.msgpack), found {shown}; {hint}"
    )


