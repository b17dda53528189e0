"""Opening a checkpoint: resolve a source to ``config.json`` plus lazily read weight tensors.

Sources: a Hugging Face model folder (probed for each format of :mod:`.formats` in turn), a weights
file with config.json beside it (its format by suffix), a hub id (the local cache, else fetched)
(:mod:`.hub_cache`), an in-memory model (:mod:`.pytorch`), or a PEFT LoRA adapter folder read with
its base as the merged model (:mod:`.lora`).  Each format's dependency (torch, onnx, h5py, msgpack,
gguf) is imported only for a file of that format.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import SpecboundError, os_errors, refuse_oversized_integers
from .base import Checkpoint, read_config
from .ctranslate2_file import _looks_like_ct2
from .gguf_file import is_gguf
from .hub_cache import looks_like_hub_id, resolve_hub_id
from .hub_fetch import parse_size
from .lora import is_adapter_folder, open_adapter
from .pytorch import from_memory
from .quantized import maybe_quantized  # GPTQ, AWQ, compressed-tensors, bitsandbytes, MLX
from .sentence_modules import read_sentence_modules
from .formats import (
    CTRANSLATE2,
    FOLDER_FILES,
    FORMATS,
    GGUF,
    INDEX_FILES,
    ONNX,
    PYTORCH,
    SAFETENSORS,
    WEIGHT_SUFFIXES,
    format_of,
)


def open_checkpoint(
    source: Any,
    config: dict[str, Any] | None = None,
    *,
    stream: bool = False,
    disk_budget: int | str | None = None,
    base: Any = None,
) -> Checkpoint:
    """Resolve ``source`` to a :class:`Checkpoint`.

    ``source`` is a Hugging Face model folder (safetensors, single or sharded, else PyTorch
    ``pytorch_model.bin`` single or sharded, else an ONNX export ``model.onnx``), a weights file
    (``.safetensors``, ``.bin``, ``.pt``, ``.pth``, ``.onnx``) with config.json beside it, a hub id
    (``org/name[@revision]``) from the local Hugging Face cache or fetched (:mod:`.hub_fetch`), or an in-memory
    ``torch.nn.Module`` / state dict (``config`` needed for a
    bare state dict).  ``stream``: a hub id not in the cache is read by HTTP range requests, never
    downloaded; ``disk_budget`` (bytes, or ``"20GB"``): a hub id whose files exceed it is streamed
    (default: the free space of the cache's filesystem) (:mod:`.hub_fetch`).  A PEFT LoRA adapter folder
    (``adapter_config.json``) is merged into ``base``
    (any source above; None: the base the adapter names) as it is read (:mod:`.lora`).
    """
    refuse_oversized_integers(config, "config", "pass the dimensions as config.json holds them")
    if stream and (not isinstance(source, (str, os.PathLike)) or Path(source).expanduser().exists()):
        raise SpecboundError(
            f"stream=True (--stream) reads a hub id ORG/NAME by HTTP range requests; "
            f"{_shown(source)} is not one: leave --stream out for a local model"
        )
    if disk_budget is not None:  # a budget that does not parse is an error, cached model or not
        disk_budget = parse_size(disk_budget)
    if not isinstance(source, (str, os.PathLike)):
        _refuse_base(base, f"an in-memory {type(source).__name__}")
        return from_memory(source, config)
    with os_errors(f"open the checkpoint {source}"):
        ckpt = _open_path(source, config, stream=stream, disk_budget=disk_budget, base=base)
    if config:  # the caller's keys (--config FILE, --set key=value) win over config.json's
        ckpt.config = {**ckpt.config, **config}
    return ckpt


def _shown(source: Any) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else f"an in-memory {type(source).__name__}"


def _refuse_base(base: Any, what: str) -> None:
    if base is not None:
        raise SpecboundError(
            f"base={base!s} (--base) names the base model of a PEFT LoRA adapter, but {what} is "
            f"not an adapter folder (adapter_config.json + adapter_model.safetensors); leave base "
            f"out, or pass initial weights with init (--init)"
        )


def _open_path(
    source: str | os.PathLike,
    config: dict[str, Any] | None,
    *,
    stream: bool = False,
    disk_budget: int | str | None = None,
    base: Any = None,
) -> Checkpoint:
    path = Path(source).expanduser()
    if not path.exists():
        if not looks_like_hub_id(str(source)):
            raise SpecboundError(
                f"checkpoint not found: {source!s} does not exist; pass a Hugging Face model folder "
                f"(config.json + model.safetensors), a weights file or a hub id ORG/NAME[@REVISION]"
            )
        try:
            path = resolve_hub_id(str(source), stream=stream, disk_budget=disk_budget)
        except SpecboundError as exc:  # say both readings: no such local path, and what the hub said
            raise SpecboundError(
                f"{exc}; no local folder or file {source!s} exists either (looked in {Path.cwd()})"
            ) from None
        if isinstance(path, Checkpoint):  # streamed: config.json read from the server
            _refuse_base(base, f"the streamed model {source!s}")
            return maybe_quantized(path)  # keeps the streamed checkpoint's hub_source
        ckpt = _open_path(path, config, base=base)  # the snapshot folder, read as any folder
        ckpt.set_facts(hub_source=f"{str(source).partition('@')[0]}@{path.name}")  # ORG/NAME@commit: what was read
        return ckpt
    if is_adapter_folder(path):  # before any "no config.json": an adapter has none of its own
        return open_adapter(path, base, config, open_checkpoint)
    _refuse_base(base, str(source))
    if path.is_file():
        return _open_file(path, config)
    # the sentence-transformers layout, whether or not the folder has its own config.json: modules.json names
    # the Transformer's folder (the root, or 0_Transformer/) and the modules after it (Pooling, Dense, Normalize)
    modules = read_sentence_modules(path)
    if modules is not None:
        inner = modules.transformer
        ckpt = _open_folder(path, config) if inner == path.resolve() else _open_path(inner, config)
        ckpt.set_facts(sentence_modules=modules)
        return ckpt
    return _open_folder(path, config)


def _open_folder(path: Path, config: dict[str, Any] | None) -> Checkpoint:
    if not (path / "config.json").is_file():
        _refuse_tokenizer_only(path)
        for onnx_file in ONNX.folder_files:
            if (path / onnx_file).is_file():  # an export on its own: dimensions inferred from the graph
                return _open_file(path / onnx_file)
    cfg = config if config and not (path / "config.json").is_file() else read_config(path)
    _refuse_folders_named_like_files(path)
    for fmt in FORMATS:  # torch, onnx, h5py, msgpack are imported only for their own format
        if fmt.in_folder(path):
            return _with_config(fmt.open_folder(path, cfg), path)
    _no_weights(path)


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "special_tokens_map.json",
)


def _refuse_tokenizer_only(folder: Path) -> None:
    """A folder holding a tokenizer and nothing of a model says so first (not "no config.json")."""
    names = {p.name for p in folder.iterdir()}
    tokenizer = sorted(names & set(TOKENIZER_FILES))
    weights = [n for n in names if n.endswith(WEIGHT_SUFFIXES) or n.endswith(".index.json")]
    if tokenizer and not weights and "onnx" not in names:
        raise SpecboundError(
            f"{folder} holds a tokenizer only ({', '.join(tokenizer)}): no model weights and no "
            f"config.json; point specbound at the model's folder (config.json + model.safetensors)"
        )


def _with_config(ckpt: Checkpoint, folder: Path) -> Checkpoint:
    ckpt = maybe_quantized(ckpt)
    if (folder / "config.json").is_file() and not ckpt.facts.config_from_weights:  # CTranslate2 rebuilds its config
        ckpt.set_facts(config_path=folder / "config.json")
    return ckpt


def _refuse_folders_named_like_files(folder: Path) -> None:
    """A folder where a weights file or index belongs is an error naming it (not "no weights")."""
    for name in (*FOLDER_FILES, *INDEX_FILES):
        if (folder / name).is_dir():
            raise SpecboundError(
                f"{folder / name} is a folder, not a file: a model folder holds its weights "
                f"in the file {name}; move the folder away or put the weights file there"
            )


def _open_file(path: Path, config: dict[str, Any] | None = None) -> Checkpoint:
    if is_gguf(path):  # GGUF, by suffix or by its magic bytes (Ollama's blobs have no suffix): config in its metadata
        return GGUF.open(path, None)
    if path.suffix == ".bin" and _looks_like_ct2(path):  # CTranslate2's model.bin: not a pickle
        return CTRANSLATE2.open(path, None)
    fmt = format_of(path)
    if fmt is None:
        raise SpecboundError(
            f"expected a model folder or a weights file ({', '.join(WEIGHT_SUFFIXES)}) with config.json "
            f"beside it, found the file {path}"
        )
    folder = path.parent
    if fmt is ONNX and folder.name == "onnx" and not (folder / "config.json").is_file():
        folder = folder.parent  # the hub layout: onnx/model.onnx, config.json at the repository's root
    if fmt is ONNX and not (folder / "config.json").is_file():
        return fmt.open(path, None)  # an export on its own: dimensions inferred from the graph
    cfg = config if config and not (folder / "config.json").is_file() else read_config(folder)
    return _with_config(fmt.open(path, cfg), folder)


def _no_weights(folder: Path):
    present = sorted(p.name for p in folder.iterdir())
    hint = "save the model with save_pretrained (safetensors is its default format)"
    if any(name.endswith((*PYTORCH.suffixes, ".ckpt")) for name in present):
        hint = (
            f"PyTorch weights are read from {PYTORCH.folder_files[0]} (or its index) in a folder, or when "
            "named as a file: specbound analyze folder/weights.pt"
        )
    if any(name.endswith(ONNX.suffixes) for name in present):
        hint = (
            f"ONNX exports are read from {' or '.join(ONNX.folder_files)} in a folder, or when named as a "
            f"file: specbound analyze folder/exported.onnx"
        )
    shown = present[:20] + (["..."] if len(present) > 20 else [])
    others = [f.folder_files[0] for f in FORMATS[1:] if f.folder_files]
    raise SpecboundError(
        f"{folder} has no weights: expected {' or '.join((*SAFETENSORS.folder_files, *SAFETENSORS.index_files))} "
        f"(or {', '.join(others)}), found {shown}; {hint}"
    )
