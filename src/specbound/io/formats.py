"""The weight formats specbound reads, in one table: each format's file suffixes, the files a model
folder keeps it in, its shard indexes, the function that opens it and the pip extra its reader needs.

:mod:`.dispatch` probes a folder and dispatches a file by this table, the records name a weights
file by its suffixes and a sweep fingerprints the index files it lists; a new format is one row here
and one module with its opener (docs/extending.md).  Openers are named ``"module:function"`` and
imported only when a file of their format is opened, so no reader's dependency is loaded before.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Format:
    """One weight format.

    Attributes
    ----------
    name : str
    suffixes : tuple of str
        A weights file named with one of these is read as this format.
    folder_files : tuple of str
        Where a model folder keeps it (paths relative to the folder, tried in order).
    index_files : tuple of str
        The shard index of a sharded checkpoint in a folder (``{"weight_map": {tensor: shard}}``).
    opener : str
        ``"module:function"`` of :mod:`specbound.io`: ``function(path, config) -> Checkpoint`` opens
        one file (``config``: the parsed config.json, or None where the format carries its own).
    folder_opener : str or None
        ``"module:function"``, ``function(folder, config) -> Checkpoint``, for a format whose folder
        may hold shards; None: the folder's first existing ``folder_files`` entry is opened as a file.
    extra : str or None
        The optional dependency group (``pip install 'specbound[extra]'``) whose package reads it; None
        for a reader among specbound's own dependencies.
    """

    name: str
    suffixes: tuple[str, ...]
    folder_files: tuple[str, ...]
    index_files: tuple[str, ...] = ()
    opener: str = ""
    folder_opener: str | None = None
    extra: str | None = None

    def open(self, path: Path, config: dict[str, Any] | None):
        """Open the file ``path`` as this format."""
        return _function(self.opener)(path, config)

    def open_folder(self, folder: Path, config: dict[str, Any] | None):
        """Open the model folder ``folder`` (which holds one of :attr:`folder_files` or :attr:`index_files`)."""
        if self.folder_opener is not None:
            return _function(self.folder_opener)(folder, config)
        return self.open(next(folder / f for f in self.folder_files if (folder / f).is_file()), config)

    def in_folder(self, folder: Path) -> bool:
        """Whether ``folder`` holds this format's weights (a folder file or a shard index)."""
        return any((folder / f).is_file() for f in (*self.folder_files, *self.index_files))

    def install_hint(self) -> str:
        """How to install this format's reader."""
        return f"pip install 'specbound[{self.extra}]'"


SAFETENSORS = Format(
    "safetensors",
    (".safetensors",),
    ("model.safetensors",),
    ("model.safetensors.index.json",),
    opener="safetensors_file:open_safetensors_file",
    folder_opener="safetensors_file:open_safetensors_folder",
)
PYTORCH = Format(
    "pytorch",
    (".bin", ".pt", ".pth"),
    ("pytorch_model.bin",),
    ("pytorch_model.bin.index.json",),
    opener="pytorch:from_pickle_file",
    folder_opener="pytorch:open_pickle_folder",
    extra="torch",
)
# onnx/model.onnx: where sentence-transformers / Optimum repositories keep an export
ONNX = Format("onnx", (".onnx",), ("model.onnx", "onnx/model.onnx"), opener="onnx_graph:open_onnx", extra="onnx")
GGUF = Format("gguf", (".gguf",), (), opener="gguf_mmproj:open_gguf_file")
TF = Format("tf", (".h5",), ("tf_model.h5",), opener="tf_file:open_h5", extra="tf")
FLAX = Format("flax", (".msgpack",), ("flax_model.msgpack",), opener="flax_file:open_flax", extra="flax")
# CTranslate2 (faster-whisper, OpenNMT): model.bin, told from a PyTorch .bin by its first bytes
# (dispatch), its config rebuilt from the spec (config.json is CTranslate2's own).
CTRANSLATE2 = Format(
    "ctranslate2",
    (),
    ("model.bin",),
    opener="ctranslate2_file:open_ctranslate2",
    folder_opener="ctranslate2_file:open_ctranslate2_folder",
)

# In the order a model folder is probed: the first format it holds is read.
FORMATS = (SAFETENSORS, PYTORCH, ONNX, GGUF, TF, FLAX, CTRANSLATE2)
WEIGHT_SUFFIXES = tuple(s for f in FORMATS for s in f.suffixes)
FOLDER_FILES = tuple(name for f in FORMATS for name in f.folder_files)
INDEX_FILES = tuple(name for f in FORMATS for name in f.index_files)


def format_of(path: Path) -> Format | None:
    """The format a weights file's suffix names, or None."""
    return next((f for f in FORMATS if path.suffix in f.suffixes), None)


def _function(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)
