"""GGUF files (llama.cpp, Ollama): the config from the file's metadata, the weights from its tensors,
read with the ``gguf`` package (a base dependency: numpy, pyyaml, requests, tqdm).

What the file holds and how it is exposed:

* **Config.** The metadata keys ``{arch}.block_count``, ``{arch}.embedding_length``,
  ``{arch}.attention.head_count``, ... are returned without the ``{arch}.`` prefix (``block_count``,
  ``attention.head_count``, ``rope.freq_base``, ``context_length``, ``expert_count``), with the
  ``general.*`` keys and ``model_type = "gguf-<arch>"`` (the family specs ``archs/data/*_gguf.json``
  read them).  The tokenizer's vocabulary and every other array longer than :data:`_MAX_LIST` are left
  out: they are not the model's dimensions.  llama.cpp stores no activation: ``hidden_act`` is what its
  graph for the architecture computes (:data:`ARCHS`: SiLU-gated for llama, qwen2, phi3 and the MoE
  architectures, the tanh GELU ``ggml_gelu`` for phi2, gptj, falcon and bloom); the rotary settings
  are also given under the Hugging Face keys (``rope_theta``, ``max_position_embeddings``,
  ``rotary_dim``, ``rope_scaling``) that the rotary analysis reads.
* **Tensors.** Under their GGUF names (``blk.0.attn_q.weight``), stored ``(out, in)`` row-major as
  ``nn.Linear`` stores them (GGUF lists the dimensions innermost first; ``gguf`` reverses them).
  F32 / F16 / BF16 / F64 are upcast exactly; a quantized tensor (Q8_0, Q4_K, ...) is dequantized by
  ``gguf.quants.dequantize`` to the float32 values llama.cpp multiplies with, so the analysis is of
  the quantized model (:attr:`GGUFCheckpoint.weights_note` says so).
* **The rotary permutation.** ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) reorders the rows of
  every head of ``q_proj`` and ``k_proj`` for llama.cpp's interleaved rotary layout: within each
  head, row ``2 i + j`` of the GGUF tensor is row ``j d_h/2 + i`` of the Hugging Face one.  For the
  ``llama`` architecture the rows are put back (:func:`unpermute_rows`), so every matrix equals the
  Hugging Face checkpoint's (the other architectures are converted without the permutation).
* **Expert banks.** llama.cpp stores the experts of a layer as one 3-D tensor per role
  (``blk.N.ffn_gate_exps.weight``, shape ``(E, d_ff, N)`` as ``(out, in)`` per expert); the reader exposes
  expert ``e`` as the 2-D tensor ``blk.N.ffn_gate_exps.weight[e]`` (a slice of the bank, read alone;
  a quantized bank dequantizes only that expert's rows), so a family spec names experts as it does
  for a Hugging Face checkpoint.
* **Fused layouts** are as llama.cpp's converter writes them: Falcon's and BLOOM's ``attn_qkv`` are
  rearranged to ``[q | k | v]``, Phi-3's ``ffn_up`` is its ``[gate | up]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .base import Checkpoint, available_memory

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFArch:
    """What llama.cpp does for one GGUF architecture that the metadata does not say: whether
    convert_hf_to_gguf.py permuted the rows of Q and K (``LlamaModel.permute``), the activation its
    graph computes, and whether its positions are rotary."""

    permuted: bool = False
    activation: str = "silu"
    rotary: bool = True


# Mistral, Mixtral and most Llama derivatives and fine-tunes are "llama".
ARCHS = {"llama": GGUFArch(permuted=True), "qwen2": GGUFArch(), "qwen2moe": GGUFArch(), "qwen3moe": GGUFArch(),
         "phi3": GGUFArch(),
         "phi2": GGUFArch(activation="gelu_pytorch_tanh"), "gptj": GGUFArch(activation="gelu_pytorch_tanh"),
         "falcon": GGUFArch(activation="gelu_pytorch_tanh"),
         "bloom": GGUFArch(activation="gelu_pytorch_tanh", rotary=False)}
# 3-D expert banks, exposed one expert at a time: ``blk.N.ffn_gate_exps.weight[e]``
_BANK = re.compile(r"^blk\.\d+\.ffn_(?:gate|up|down|gate_up)_exps\.weight$")
_EXACT = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64"}
_MAX_LIST = 64  # metadata arrays longer than this (vocabularies, merges) stay out of the config
INSTALL_HINT = "pip install -e . (gguf is a base dependency of specbound; or pip install gguf)"


def _import_gguf():
    try:
        import gguf
    except ImportError:
        raise SpecboundError(f"reading GGUF files needs the gguf package: {INSTALL_HINT}") from None
    return gguf


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file: the ``.gguf`` suffix, or the magic bytes (Ollama's blobs
    ``sha256-<digest>`` have no suffix)."""
    if path.suffix == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def unpermute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo ``convert_hf_to_gguf.py``'s ``LlamaModel.permute(w, n_head)``.

    ``permute`` is ``w.reshape(n_head, 2, d_h // 2, in).swapaxes(1, 2).reshape(w.shape)``; its inverse
    reshapes to ``(n_head, d_h // 2, 2, in)`` and swaps back.

    Parameters
    ----------
    weight : ndarray, shape (n_head * d_h, in) (a bias: (n_head * d_h,))
    n_head : int
        Heads of this projection (``head_count`` for Q, ``head_count_kv`` for K).
    """
    rows = weight.shape[0]
    return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


@dataclass
class GGUFCheckpoint(Checkpoint):
    """One GGUF file (module docstring).

    Attributes
    ----------
    path : Path
    arch : str
        ``general.architecture``.
    quantized : dict[str, str]
        Tensor name -> ggml quantization type (``"Q8_0"``), for the quantized tensors.
    """

    location: str
    config: dict[str, Any]
    path: Path
    arch: str
    _reader: Any = field(repr=False)
    _tensors: dict[str, Any] = field(repr=False)
    quantized: dict[str, str] = field(default_factory=dict)
    _files: dict[str, Path] = field(default_factory=dict, repr=False)  # tensor -> the part holding it
    _experts: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)  # slice -> (bank, e)

    @property
    def names(self) -> list[str]:
        banks = {bank for bank, _ in self._experts.values()}
        return sorted([n for n in self._tensors if n not in banks] + list(self._experts))

    def _tensor(self, name: str):
        """The stored tensor holding ``name`` (an expert's slice: its bank)."""
        return self._tensors[self._experts[name][0] if name in self._experts else name]

    @property
    def weights_note(self) -> str | None:  # type: ignore[override]
        if not self.quantized:
            return None
        kinds = sorted(set(self.quantized.values()))
        return (f"quantized GGUF ({', '.join(kinds)}; {len(self.quantized)} tensors): the weights analysed "
                f"are the dequantized values llama.cpp computes with, so the bounds are of the quantized model")

    def shape(self, name: str) -> tuple[int, ...]:
        dims = tuple(int(d) for d in reversed(self._tensor(name).shape.tolist()))
        return dims[1:] if name in self._experts else dims

    def dtype(self, name: str) -> str:
        """``F32``/``F16``/``BF16``/``F64`` as stored, ``F32`` for a quantized tensor (read
        dequantized to float32); another type (an integer tensor) keeps its ggml name."""
        kind = self._tensor(name).tensor_type.name
        stored = self._experts[name][0] if name in self._experts else name
        return _EXACT.get(kind) or ("F32" if stored in self.quantized else kind)

    def where(self, name: str) -> str:
        kind = self._tensor(name).tensor_type.name
        if name in self._experts:
            bank, e = self._experts[name]
            return f"{self._files.get(bank, self.path)} (expert {e} of GGUF tensor {bank!r}, {kind})"
        return f"{self._files.get(name, self.path)} (GGUF tensor {name!r}, {kind})"

    def files(self) -> list[Path]:
        return sorted(set(self._files.values()) or {self.path})

    def _stored_in(self, name: str) -> Path | None:
        return self._files.get(self._experts[name][0] if name in self._experts else name, self.path)

    def check_size(self, name: str) -> int:
        """A quantized tensor's stored bytes (``n_bytes``, not 4 bytes a value) must fit in its file;
        the rest as for every format (:meth:`Checkpoint.check_size`).  An expert's slice: its share
        of its bank."""
        stored = self._experts[name][0] if name in self._experts else name
        if stored not in self.quantized:
            return super().check_size(name)
        tensor = self._tensors[stored]
        held = self._stored_in(name).stat().st_size
        if int(tensor.n_bytes) > held:
            raise SpecboundError(f"tensor {stored!r} in {self.where(name)} declares {int(tensor.n_bytes):,} bytes but "
                                 f"its file holds {held:,}: the GGUF file is truncated or corrupt; re-download it")
        free = available_memory()
        count = int(tensor.n_elements) // (int(tensor.shape.tolist()[-1]) if name in self._experts else 1)
        if free is not None and 8 * count > free:
            raise SpecboundError(f"tensor {name!r} in {self.where(name)} has {count:,} values: its float64 copy needs "
                                 f"{8 * count / 2**30:.1f} GiB and {free / 2**30:.1f} GiB of memory is available; use "
                                 f"a machine with more memory")
        return count

    def _raw(self, name: str) -> np.ndarray:
        gguf = _import_gguf()
        tensor = self._tensor(name)
        kind = tensor.tensor_type.name
        data = tensor.data if name not in self._experts else tensor.data[self._experts[name][1]]
        try:
            if kind in ("F32", "F16", "F64"):
                array = np.array(data)  # a copy: the memory map stays read-only and small
            else:  # BF16 and the quantized types: bytes, decoded by gguf's own dequantize
                array = gguf.quants.dequantize(np.asarray(data), tensor.tensor_type)
            array = array.reshape(self.shape(name))
        except NotImplementedError:
            raise SpecboundError(
                f"cannot dequantize {self.where(name)}: the gguf package has no dequantization for {kind}; "
                f"re-quantize the model with llama-quantize to a supported type (Q8_0, Q4_K, ...) or "
                f"upgrade gguf (pip install -U gguf)") from None
        except (ValueError, OSError) as exc:
            raise SpecboundError(f"cannot read {self.where(name)}: the GGUF file is truncated or corrupt "
                                 f"({exc}); re-download or re-convert it") from None
        if self.arch in ARCHS and ARCHS[self.arch].permuted:
            heads = _permuted_heads(name, self.config)
            if heads:
                array = unpermute_rows(array, heads)
        return array


def _permuted_heads(name: str, config: dict[str, Any]) -> int | None:
    """The head count ``LlamaModel.permute`` used for ``name`` (Q: ``head_count``; K:
    ``head_count_kv``, defaulting to ``head_count``), or None when ``name`` was not permuted."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in ("attn_q", "attn_k"):
        return None
    heads = config.get("attention.head_count")
    if parts[2] == "attn_k":
        heads = config.get("attention.head_count_kv") or heads
    return heads if isinstance(heads, int) else None


def _field_value(field) -> Any:
    value = field.contents()
    if isinstance(value, (np.generic,)):
        value = value.item()
    return value


def read_metadata(reader, path: Path) -> tuple[str, dict[str, Any]]:
    """``(architecture, config)`` from a reader's metadata (module docstring)."""
    arch_field = reader.fields.get("general.architecture")
    arch = _field_value(arch_field) if arch_field is not None else None
    if not isinstance(arch, str):
        raise SpecboundError(f"{path} has no general.architecture metadata: it is not a model GGUF file "
                             f"(a LoRA adapter or vocabulary-only file?); convert the model with "
                             f"llama.cpp's convert_hf_to_gguf.py")
    config: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith(("GGUF.", "tokenizer.", "split.")):
            continue
        if len(fld.data) > _MAX_LIST:
            continue
        value = _field_value(fld)
        config[key[len(arch) + 1:] if key.startswith(arch + ".") else key] = value
    config["model_type"] = f"gguf-{arch}"
    if arch in ARCHS:
        config.setdefault("hidden_act", ARCHS[arch].activation)  # what llama.cpp's graph computes
        if ARCHS[arch].rotary:
            config.update(_rotary_keys(config))
    if arch == "llama" and isinstance(config.get("expert_count"), int) and config["expert_count"] > 0:
        config["model_type"] = "gguf-llama-moe"  # Mixtral: the llama graph with expert banks
    return arch, config


def _rotary_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings under the Hugging Face config keys ``compute.rotary`` reads: ``rope_theta``
    (``rope.freq_base``; llama.cpp's default 10000), ``max_position_embeddings``
    (``context_length``), ``rotary_dim`` (``rope.dimension_count``, when given) and ``rope_scaling``
    (``rope.scaling.type`` and ``.factor``, recorded)."""
    keys: dict[str, Any] = {"rope_theta": float(config.get("rope.freq_base", 10000.0))}
    if isinstance(config.get("context_length"), int):
        keys["max_position_embeddings"] = config["context_length"]
    if isinstance(config.get("rope.dimension_count"), int):
        keys["rotary_dim"] = config["rope.dimension_count"]
    scaling = config.get("rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ("none", ""):
        keys["rope_scaling"] = {"rope_type": scaling, "factor": config.get("rope.scaling.factor")}
    return keys


def _longrope_keys(config: dict[str, Any], tensors: dict[str, Any], path: Path) -> dict[str, Any]:
    """LongRoPE (Phi-3's ``longrope``, formerly ``su``) as the Hugging Face keys the rotary analysis reads:
    convert_hf_to_gguf.py stores its two factor sets as the tensors ``rope_factors_long`` and
    ``rope_factors_short`` and the pretraining context as ``rope.scaling.original_context_length``;
    the attention factor it writes (``rope.scaling.attn_factor``) is transformers' default formula,
    which the rotary analysis evaluates itself from the two context lengths."""
    names = ("rope_factors_long.weight", "rope_factors_short.weight")
    present = [n for n in names if n in tensors]
    if not present:
        return {}
    if len(present) == 1:
        raise SpecboundError(f"{path} holds {present[0]} but not {[n for n in names if n not in present][0]}: "
                             f"LongRoPE needs both factor sets; re-convert the model")
    original = config.get("rope.scaling.original_context_length")
    factors = {key: [float(v) for v in np.asarray(tensors[name].data, dtype=np.float64).ravel()]
               for key, name in zip(("long_factor", "short_factor"), names)}
    keys: dict[str, Any] = {"rope_scaling": {"rope_type": "longrope", **factors}}
    if isinstance(original, int):
        keys["original_max_position_embeddings"] = original
    return keys


_SHARD = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _reader(gguf, path: Path):
    """``gguf.GGUFReader(path)``, its failures as one-line errors."""
    try:
        return gguf.GGUFReader(str(path))
    except ValueError as exc:
        text = str(exc)
        if "is not a valid GGMLQuantizationType" in text:
            raise SpecboundError(
                f"{path} stores a tensor in a quantization type this gguf package does not know ({text}); "
                f"upgrade gguf (pip install -U gguf) or re-quantize the model with llama-quantize") from None
        raise SpecboundError(f"cannot read {path} as a GGUF file: truncated or corrupt ({text}); "
                             f"re-download or re-convert it") from None
    except (OSError, IndexError, KeyError, UnicodeDecodeError) as exc:
        raise SpecboundError(f"cannot read {path} as a GGUF file: truncated or corrupt "
                             f"({type(exc).__name__}: {exc}); re-download or re-convert it") from None


def _split_count(reader) -> int:
    fld = reader.fields.get("split.count")
    return int(_field_value(fld)) if fld is not None else 1


def _shards(gguf, path: Path, reader) -> list:
    """The readers of every part of a split GGUF model (``name-00001-of-00003.gguf``, the metadata in
    the first part), or ``[reader]`` for a single file.  A missing part is an error."""
    count = _split_count(reader)
    if count <= 1:
        return [reader]
    match = _SHARD.match(path.name)
    if match is None or int(match["count"]) != count:
        raise SpecboundError(f"{path} is part of a GGUF model split into {count} files, but its name does not say "
                             f"which (expected <name>-NNNNN-of-{count:05d}.gguf); keep the parts' original names")
    parts = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise SpecboundError(f"{path} is part 1..{count} of a split GGUF model, but {', '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} missing from {path.parent}: download every part")
    return [reader if p == path else _reader(gguf, p) for p in parts]


def _part_paths(path: Path, readers: list) -> list[Path]:
    """The file of each reader (the named file for a single-file model)."""
    if len(readers) == 1:
        return [path]
    return [Path(r.data.filename) for r in readers]


def open_gguf(path: Path) -> GGUFCheckpoint:
    """Read ``path``'s metadata and tensor index (the weights stay on disk, memory-mapped); a split
    model (``-00001-of-0000N.gguf``) is read from all its parts, whichever part is named."""
    gguf = _import_gguf()
    readers = _shards(gguf, path, _reader(gguf, path))
    arch, config = read_metadata(readers[0], path if len(readers) == 1 else Path(readers[0].data.filename))
    if arch not in ARCHS:
        raise SpecboundError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHS)}); "
            f"analyse the model's Hugging Face safetensors weights instead")
    tensors: dict[str, Any] = {}
    files: dict[str, Path] = {}
    for reader, part in zip(readers, _part_paths(path, readers)):
        for t in reader.tensors:
            files[t.name] = part
            if t.name in tensors:
                raise SpecboundError(f"{path}: tensor {t.name!r} is stored in two parts of the split model; "
                                     f"the parts belong to different models: re-download them")
            tensors[t.name] = t
    exact = set(_EXACT) | {"I8", "I16", "I32", "I64"}
    quantized = {n: t.tensor_type.name for n, t in tensors.items() if t.tensor_type.name not in exact}
    experts = {f"{n}[{e}]": (n, e) for n, t in tensors.items() if _BANK.match(n) and len(t.shape) == 3
               for e in range(int(t.shape.tolist()[-1]))}
    config.update(_longrope_keys(config, tensors, path))
    return GGUFCheckpoint(location=str(path), config=config, path=path, arch=arch, _reader=readers,
                          _tensors=tensors, quantized=quantized, _files=files, _experts=experts)
