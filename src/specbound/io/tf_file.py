"""TF/Keras weights (``tf_model.h5``, what ``TFPreTrainedModel.save_pretrained`` writes), read with
h5py (``pip install -e '.[tf]'``), never TensorFlow.

The file is Keras' HDF5 weights format: the root attribute ``layer_names`` lists the top-level
layers (for a transformers model, its main layer: ``bert``), each layer group's ``weight_names``
attribute lists its variables (``tf_bert_model/bert/encoder/layer_._0/attention/self/query/kernel:0``),
and each variable is the dataset at that path inside the layer group.

Names are turned into the PyTorch parameter names exactly as transformers'
``convert_tf_weight_name_to_pt_weight_name`` does: drop ``:0``, ``a___b`` becomes ``b``, ``_._``
(a TF list index) becomes a level, drop the first level (the model's own scope), ``kernel`` /
``gamma`` / ``embeddings`` become ``weight`` and ``beta`` ``bias``:
``bert.encoder.layer.0.attention.self.query.weight``.  A Dense ``kernel`` is stored ``(in, out)``
(``x @ kernel``), the transpose of ``nn.Linear.weight``: :meth:`H5Checkpoint.layout` says
``conv1d`` for every 2-D kernel, so the family spec's own layout is not used for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .base import Checkpoint
from .formats import TF
from .hdf5_confine import confined_dataset, resolve

_CODES = {"float64": "F64", "float32": "F32", "float16": "F16"}


def _import_h5py():
    try:
        import h5py
    except ImportError:
        raise SpecboundError(
            f"reading TF/Keras tf_model.h5 weights needs h5py: {TF.install_hint()} (or analyse "
            f"the model's safetensors weights)"
        ) from None
    return h5py


def pt_name(tf_name: str) -> tuple[str, bool]:
    """``(PyTorch parameter name, whether the stored array is the transpose)`` of a TF variable
    name (transformers' ``convert_tf_weight_name_to_pt_weight_name``, 2-D case)."""
    name = tf_name.replace(":0", "")
    name = re.sub(r"/[^/]*___([^/]*)/", r"/\1/", name)
    name = name.replace("_._", "/")
    name = re.sub(r"//+", "/", name)
    parts = name.split("/")
    if len(parts) > 1:
        parts = parts[1:]
    transposed = parts[-1] in ("kernel", "pointwise_kernel", "depthwise_kernel")
    if parts[-1] in ("kernel", "embeddings", "gamma"):
        parts[-1] = "weight"
    elif parts[-1] == "beta":
        parts[-1] = "bias"
    return ".".join(parts), transposed


def _decode(values) -> list[str]:
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in np.asarray(values).ravel()]


def _attribute_list(attrs, key: str) -> list[str] | None:
    """A list attribute as Keras writes it: ``key`` itself, or (over HDF5's 64 KiB header limit)
    split into ``key0``, ``key1``, ... (``load_attributes_from_hdf5_group``)."""
    if key in attrs:
        return _decode(attrs[key])
    chunks, i = [], 0
    while f"{key}{i}" in attrs:
        chunks += _decode(attrs[f"{key}{i}"])
        i += 1
    return chunks if i else None


@dataclass
class H5Checkpoint(Checkpoint):
    """A Keras HDF5 weights file, its variables under PyTorch parameter names (module docstring).

    Attributes
    ----------
    path : Path
    sources : dict[str, str]
        Parameter name -> dataset path in the file.
    transposed : set[str]
        Parameters stored as the transpose of the PyTorch tensor (Dense kernels).
    """

    location: str
    config: dict[str, Any]
    path: Path
    sources: dict[str, str]
    transposed: set[str] = field(default_factory=set)
    _file: Any = field(default=None, repr=False)

    def _h5(self):
        if self._file is None:
            self._file = _import_h5py().File(self.path, "r")
        return self._file

    @property
    def names(self) -> list[str]:
        return sorted(self.sources)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._h5()[self.sources[name]].shape)

    def dtype(self, name: str) -> str:
        kind = str(self._h5()[self.sources[name]].dtype)
        return _CODES.get(kind, kind)

    def layout(self, name: str) -> str | None:
        if name in self.transposed and len(self.shape(name)) == 2:
            return "conv1d"  # (in, out)
        return None

    def files(self) -> list[Path]:
        return [self.path]

    def _stored_in(self, name: str) -> Path | None:
        return self.path

    def where(self, name: str) -> str:
        return f"{self.path} (dataset {self.sources[name]!r})"

    def _raw(self, name: str) -> np.ndarray:
        try:
            return np.asarray(self._h5()[self.sources[name]][()])
        except (OSError, ValueError, KeyError) as exc:
            raise SpecboundError(
                f"cannot read {self.where(name)}: the HDF5 file is truncated or corrupt ({exc}); "
                f"re-download or re-save it"
            ) from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def open_h5(path: Path, config: dict[str, Any]) -> H5Checkpoint:
    """Index ``path``'s variables (their data is read on demand)."""
    h5py = _import_h5py()
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise SpecboundError(
            f"cannot read {path} as an HDF5 file: truncated or corrupt ({exc}); re-download it, "
            f"or re-save the model with save_pretrained"
        ) from None
    try:
        layers = _attribute_list(handle.attrs, "layer_names")
        if layers is None:
            raise SpecboundError(
                f"{path} is an HDF5 file but not Keras weights (no layer_names attribute); expected "
                f"the tf_model.h5 that TFPreTrainedModel.save_pretrained writes"
            )
        sources: dict[str, str] = {}
        transposed: set[str] = set()
        for layer in layers:
            if not isinstance(layer, str) or not layer.strip("/"):
                raise SpecboundError(
                    f"{path}: layer_names lists {layer!r}, not a layer group's name; the file is "
                    f"corrupt: re-download it"
                )
            group = handle[resolve(h5py, handle, layer, path)]
            if not isinstance(group, h5py.Group):
                raise SpecboundError(
                    f"{path}: layer {layer!r} listed in layer_names is a {type(group).__name__}, not a "
                    f"group; the file is truncated or corrupt: re-download it"
                )
            for weight in _attribute_list(group.attrs, "weight_names") or []:
                location = confined_dataset(h5py, handle, f"{group.name}/{weight}", path)
                name, flip = pt_name(weight)
                if name in sources:
                    raise SpecboundError(
                        f"{path}: two variables map to the parameter {name!r} ({sources[name]!r}, "
                        f"{layer}/{weight!r}); not a transformers TF checkpoint"
                    )
                sources[name] = location
                if flip:
                    transposed.add(name)
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise SpecboundError(
            f"cannot read {path}: the HDF5 file is truncated or corrupt ({exc}); re-download it"
        ) from None
    finally:
        handle.close()
    if not sources:
        raise SpecboundError(
            f"{path} holds no weights (its layers list no variables); expected a tf_model.h5 written by save_pretrained"
        )
    return H5Checkpoint(location=str(path), config=config, path=path, sources=sources, transposed=transposed)
