"""GGUF files (llama.cpp, Ollama): the config from the file's metadata, the weights from its tensors, as the
family specs (``archs/data/*_gguf.json``) read them.

Reads: one GGUF file or every part of a split one, its header read and checked by :mod:`.gguf_header`
(bounded work, every offset inside the file); quantized blocks are decoded by the ``gguf`` package (a base
dependency: numpy, pyyaml, requests, tqdm).

Guarantees (how the file is exposed):

* **Config.** The metadata keys ``{arch}.block_count``, ``{arch}.embedding_length``,
  ``{arch}.attention.head_count``, ... are returned without the ``{arch}.`` prefix (``block_count``,
  ``attention.head_count``, ``rope.freq_base``, ``context_length``), with the ``general.*`` keys and
  ``model_type = "gguf-<arch>"`` (the family spec ``archs/data/llama_gguf.json`` reads them).  The
  tokenizer's vocabulary and every other array longer than :data:`~.gguf_header.MAX_LIST` are left
  out (stepped over unread): they are not the model's dimensions.  llama.cpp's graph for the supported
  architectures is a gated feed-forward whose activation it stores nowhere, so ``hidden_act`` is its
  graph's (SiLU; GELU for the Gemmas); the rotary settings are also given under the Hugging Face keys
  (``rope_theta``, ``max_position_embeddings``, ``rotary_dim``, ``rope_scaling``; Gemma 3's
  ``layer_types`` and per-type ``rope_parameters``; ``rope_freq_factors`` from a ``rope_freqs``
  tensor) that the rotary analysis reads.
* **Norm weights.** llama.cpp's converter adds 1 to every Gemma norm weight (Gemma's RMSNorm
  multiplies by ``1 + w``), so a Gemma 3 file's ``attn_q_norm``/``attn_k_norm`` hold the gain itself:
  the GGUF family specs (``archs/data/*_gguf.json``) read them as ``weight``, the Hugging Face ones as
  ``one_plus_weight``: the same gains either way.
* **Tensors.** Under their GGUF names (``blk.0.attn_q.weight``), stored ``(out, in)`` row-major as
  ``nn.Linear`` stores them (GGUF lists the dimensions innermost first; the header reader reverses them).
  F32 / F16 / BF16 / F64 are upcast exactly; a quantized tensor (Q8_0, Q4_K, ...) is dequantized by
  ``gguf.quants.dequantize`` to the float32 values llama.cpp multiplies with, so the analysis is of
  the quantized model (its note ``quantized_weights`` says so).  A big-endian file's values
  are read in its byte order (a quantized type's fp16 scales too, for the types whose layout is
  known); see :mod:`.gguf_header`.
* **The rotary permutation.** ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) reorders the rows of
  every head of ``q_proj`` and ``k_proj`` for llama.cpp's interleaved rotary layout: within each
  head, row ``2 i + j`` of the GGUF tensor is row ``j d_h/2 + i`` of the Hugging Face one.  For the
  architectures whose row is ``permuted`` (``llama`` and the ``LlamaModel`` conversions) the rows are put
  back (:func:`unpermute_rows`), so every matrix equals the Hugging Face checkpoint's (the other
  architectures are converted without the permutation).
* **Fused layouts** as the converter writes them: Falcon's and BLOOM's ``attn_qkv`` rearranged to
  ``[q | k | v]``, Phi-3's ``attn_qkv`` (``[q | k | v]``) and ``ffn_up`` (its ``[gate | up]``) as stored.
* **Expert banks.** llama.cpp stores a mixture of experts' weights of one role as one 3-D tensor
  (``blk.N.ffn_gate_exps.weight``, ``(E, d_ff, N)`` outermost first, each expert ``(out, in)``); the
  reader exposes expert ``e`` as the 2-D tensor ``blk.N.ffn_gate_exps.weight[e]``, the bank's ``e``-th
  contiguous slice (a quantized bank's rows are whole blocks, so a slice dequantizes on its own), and
  not the bank itself: a family spec names experts as it does for a Hugging Face checkpoint.  A
  ``llama`` file with ``expert_count > 0`` (Mixtral) has ``model_type = "gguf-llama-moe"``.
* **LongRoPE** (Phi-3): the converter stores its two factor sets as the tensors ``rope_factors_long``
  and ``rope_factors_short``; the reader puts them in ``rope_scaling`` (``rope_type: longrope``) with
  ``rope.scaling.original_context_length`` as ``original_max_position_embeddings``; the attention
  factor the converter writes is transformers' default formula, which the rotary reader evaluates
  from the two context lengths.
* **Each architecture's own facts** (the permutation, llama.cpp's activation and fixed constants, the
  per-layer types, its config keys and the conventions they assume, tensor renames and joins) are its row
  of :data:`.gguf_archs.ARCHS`, applied here by one loop.

Refuses, in one line naming what it found:

* a metadata key the dimensions are read from that does not hold its type (a count an integer,
  ``rope.freq_base`` a number), and any NaN or infinite value;
* a file of an architecture without a row in :data:`.gguf_archs.ARCHS` (the message names the supported ones);
* a file whose layers hold llama.cpp's tensors of a linear-attention, state-space or short-convolution block
  (``blk.N.ssm_*``, ``blk.N.shortconv.*``, ``blk.N.time_mix_*``: qwen3next, kimi-linear, nemotron_h,
  granitehybrid, falcon-h1, jamba, lfm2, mamba, rwkv): the message names those layers, as for its Hugging Face
  checkpoint (docs/families.md);
* a big-endian file's quantized tensor of a type whose layout is not known (:mod:`.gguf_header`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError, index_ranges, os_errors
from ..options import MAX_COUNT, MAX_SCALE
from .base import WEIGHTS_NOTE, Checkpoint, ReaderFacts
from .gguf_archs import ARCHS, BLOCK
from .gguf_header import BIG_ENDIAN_FIELDS, GGUF_MAGIC, GGUFHeader, SkippedArray, TensorInfo, import_gguf, read_header

# 3-D expert banks, exposed one expert at a time as ``blk.N.ffn_gate_exps.weight[e]``
_BANK = re.compile(r"^blk\.\d+\.ffn_(?:gate|up|down|gate_up)_exps\.weight$")
_LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")
_EXACT = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64"}
_NUMPY = {"F32": "f4", "F16": "f2", "F64": "f8"}
_INTEGER = ("I8", "I16", "I32", "I64")
# The metadata keys the config is read from (without the ``{arch}.`` prefix), by the type they must
# hold: a count stored as a string, an array or a float is refused by name instead of failing later.
_COUNT_KEYS = (
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "rope.scaling.original_context_length",
    "attention.sliding_window",
    "nextn_predict_layers",
    "leading_dense_block_count",
    "interleave_moe_layer_step",
    "expert_shared_count",
    "expert_gating_func",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
    "attention.key_length_mla",
    "attention.value_length_mla",
)
_NUMBER_KEYS = (
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.factor",
    "rope.scaling.yarn_log_multiplier",
    "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_ext_factor",
    "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow",
    "attention.layer_norm_rms_eps",
    "attention.layer_norm_epsilon",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "expert_weights_scale",
)
_TEXT_KEYS = ("rope.scaling.type",)


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file: the ``.gguf`` suffix, or the magic bytes (Ollama's blobs
    ``sha256-<digest>`` have no suffix).  Only a regular file is opened (a FIFO would block)."""
    if path.suffix == ".gguf":
        return True
    try:
        if not path.is_file():
            return False
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
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_facts(quantized: dict[str, str], conventions: dict[str, str]) -> ReaderFacts:
    """A GGUF file's notes: its quantization (``quantized``: tensor name -> ggml type), when any tensor is
    quantized, and ``conventions`` (name -> sentence: what the reader assumed where the metadata leaves a value
    of the Hugging Face config unstated)."""
    notes = dict(conventions)
    if quantized:
        kinds = sorted(set(quantized.values()))
        notes[WEIGHTS_NOTE] = (
            f"quantized GGUF ({', '.join(kinds)}; {len(quantized)} tensors): the weights analysed "
            f"are the dequantized values llama.cpp computes with, so the bounds are of the "
            f"quantized model"
        )
    return ReaderFacts(notes=notes)


@dataclass
class GGUFCheckpoint(Checkpoint):
    """One GGUF file, or the parts of a split one (module docstring).

    Attributes
    ----------
    path : Path
    arch : str
        ``general.architecture``.
    quantized : dict[str, str]
        Tensor name -> ggml quantization type (``"Q8_0"``), for the quantized tensors.
    facts : ReaderFacts
        Its notes (:func:`gguf_facts`): the quantization, and each value the reader assumed (DeepSeek's YaRN
        ``mscale``, llama.cpp's fixed Llama 4 constants).
    """

    location: str
    config: dict[str, Any]
    path: Path
    arch: str
    _headers: dict[Path, GGUFHeader] = field(repr=False)
    _tensors: dict[str, TensorInfo] = field(repr=False)
    quantized: dict[str, str] = field(default_factory=dict)
    _files: dict[str, Path] = field(default_factory=dict, repr=False)  # tensor -> the part holding it
    _maps: dict[Path, np.ndarray] = field(default_factory=dict, repr=False)
    # deepseek2: blk.N.attn_kv_b.weight joined from the converter's attn_k_b and attn_v_b (the row's joined)
    _joined: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    facts: ReaderFacts = field(default_factory=ReaderFacts)

    @property
    def names(self) -> list[str]:
        return sorted([*self._tensors, *self._joined])

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._joined:
            (heads, rank, nope), (_, dv, _) = (self._tensors[n].shape for n in self._joined[name])
            return (heads * (nope + dv), rank)
        return self._tensors[name].shape

    def dtype(self, name: str) -> str:
        """``F32``/``F16``/``BF16``/``F64`` as stored, ``F32`` for a quantized tensor (read
        dequantized to float32); another type (an integer tensor) keeps its ggml name."""
        if name in self._joined:
            kinds = {self.dtype(n) for n in self._joined[name]}
            return kinds.pop() if len(kinds) == 1 else "F32"
        kind = self._tensors[name].kind
        return _EXACT.get(kind) or ("F32" if name in self.quantized else kind)

    def where(self, name: str) -> str:
        if name in self._joined:
            k_b, v_b = self._joined[name]
            return f"{self.path} (GGUF tensors {k_b!r} and {v_b!r}, joined as kv_b_proj)"
        bank = re.match(r"^(?P<bank>.+)\[(?P<e>\d+)\]$", name)
        what = f"expert {bank['e']} of GGUF tensor {bank['bank']!r}" if bank else f"GGUF tensor {name!r}"
        return f"{self._files.get(name, self.path)} ({what}, {self._tensors[name].kind})"

    def files(self) -> list[Path]:
        return sorted(set(self._files.values()) or {self.path})

    def _stored_in(self, name: str) -> Path | None:
        return self._files.get(name, self.path)

    def check_size(self, name: str) -> int:
        """A quantized tensor's stored bytes (``n_bytes``, not 4 bytes a value) must fit in its file;
        the rest as for every format (:meth:`Checkpoint.check_size`)."""
        if name in self._joined:
            return sum(self.check_size(n) for n in self._joined[name])
        if name not in self.quantized:
            return super().check_size(name)
        tensor = self._tensors[name]
        with os_errors(f"check the size of {self.where(name)}"):
            held = self._stored_in(name).stat().st_size
        if tensor.start + tensor.n_bytes > held:
            raise SpecboundError(
                f"tensor {name!r} in {self.where(name)} lies at bytes {tensor.start:,}.."
                f"{tensor.start + tensor.n_bytes:,} but its file holds {held:,}: the GGUF file is "
                f"truncated or corrupt; re-download it"
            )
        return self.check_memory(name, tensor.n_elements)

    def _bytes(self, name: str) -> np.ndarray:
        """The stored bytes of ``name`` (uint8, a view of the file's read-only memory map)."""
        part = self._stored_in(name)
        if part not in self._maps:
            self._maps[part] = np.memmap(part, dtype=np.uint8, mode="r")
        tensor = self._tensors[name]
        data = self._maps[part][tensor.start : tensor.start + tensor.n_bytes]
        if data.size != tensor.n_bytes:
            raise ValueError(f"{data.size:,} of its {tensor.n_bytes:,} bytes are in the file")
        return data

    def _raw(self, name: str) -> np.ndarray:
        if name in self._joined:  # Hugging Face's kv_b_proj: per head the key rows (k_b transposed), then v_b's
            k_b, v_b = (self._raw(n) for n in self._joined[name])
            return np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(self.shape(name))
        gguf = import_gguf()
        tensor = self._tensors[name]
        order = self._headers[self._stored_in(name)].byteorder
        kind = tensor.kind
        try:
            data = self._bytes(name)
            if kind in _NUMPY:  # a copy: the memory map stays read-only and small
                array = data.view(order + _NUMPY[kind]).astype(np.dtype(_NUMPY[kind]))
            elif kind == "BF16":  # the top half of a float32: exact
                array = (data.view(order + "u2").astype(np.uint32) << 16).view(np.float32)
            else:  # the quantized types: decoded by gguf's own dequantize, block by block
                qtype = gguf.GGMLQuantizationType[kind]
                if order == ">":
                    data = _native_blocks(data, kind, gguf.GGML_QUANT_SIZES[qtype][1])
                rows = gguf.quants.quant_shape_to_byte_shape(tensor.shape, qtype)
                array = gguf.quants.dequantize(np.asarray(data).reshape(rows), qtype)
            array = array.reshape(tensor.shape)
        except NotImplementedError:
            raise SpecboundError(
                f"cannot dequantize {self.where(name)}: the gguf package has no dequantization for {kind}; "
                f"re-quantize the model with llama-quantize to a supported type (Q8_0, Q4_K, ...) or "
                f"upgrade gguf (pip install -U gguf)"
            ) from None
        except (ValueError, OSError) as exc:
            raise SpecboundError(
                f"cannot read {self.where(name)}: the GGUF file is truncated or corrupt "
                f"({exc}); re-download or re-convert it"
            ) from None
        row = ARCHS.get(self.arch)  # none for an mmproj file (arch 'clip': gguf_mmproj.py), whose rows are as stored
        if row is not None and row.permuted:
            heads = _permuted_heads(name, self.config)
            if heads:
                array = unpermute_rows(array, heads)
        return array

    def close(self) -> None:
        self._maps.clear()


def _native_blocks(data: np.ndarray, kind: str, block_bytes: int) -> np.ndarray:
    """The blocks of a big-endian file's quantized tensor with their fp16 fields in little-endian
    order, as ``gguf.quants`` decodes them (the inverse of gguf_convert_endian.py's swap)."""
    blocks = np.array(data).reshape(-1, block_bytes)
    for at in BIG_ENDIAN_FIELDS[kind]:
        blocks[:, [at, at + 1]] = blocks[:, [at + 1, at]]
    return blocks.reshape(-1)


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


def read_metadata(header: GGUFHeader, tensor_names: Any = None) -> tuple[str, dict[str, Any]]:
    """``(architecture, config)`` from a header's metadata (module docstring), each key the config
    is read from checked to hold the type it must (a count an integer, a base a finite number), and
    ``block_count`` against the blocks ``tensor_names`` (default: the header's tensors; of a split
    model, every part's) hold."""
    path = header.path
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise SpecboundError(
            f"{path} has no general.architecture metadata: it is not a model GGUF file "
            f"(a LoRA adapter or vocabulary-only file?); convert the model with "
            f"llama.cpp's convert_hf_to_gguf.py"
        )
    config: dict[str, Any] = {}
    for key, value in header.metadata.items():
        if key.startswith(("tokenizer.", "split.")) or isinstance(value, SkippedArray):
            continue
        if not _finite(value):
            raise SpecboundError(
                f"{path}: the metadata key {key!r} holds {value!r}, not a finite value; the file "
                f"is corrupt: re-convert the model"
            )
        config[key[len(arch) + 1 :] if key.startswith(arch + ".") else key] = value
    for key in (*_COUNT_KEYS, *_NUMBER_KEYS, *_TEXT_KEYS):
        if key in config:
            _check_type(path, f"{arch}.{key}", config[key], key in _COUNT_KEYS, key in _NUMBER_KEYS)
    row = ARCHS.get(arch)
    config["model_type"] = row.model_type(config) if row else f"gguf-{arch}"
    if row:
        config.setdefault("hidden_act", row.activation)  # llama.cpp's graph for the arch
        config.update(_rotary_keys(config, path))
        for key, value in row.fixed.items():
            config.setdefault(key, value)
    # before anything is sized by it (Gemma 3's per-layer types here, the layers bound later)
    _check_block_count(header.path, header.tensors if tensor_names is None else tensor_names, arch, config)
    if row and row.layers:
        config.update(row.layers(config))
    return arch, config


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return all(_finite(v) for v in value) if isinstance(value, list) else True


def _check_type(path: Path, key: str, value: Any, count: bool, number: bool) -> None:
    """The vocabulary of checked numbers (:mod:`specbound.options`) for GGUF metadata: a count is a
    non-negative integer of at most 2^53, a number a finite one of magnitude at most 1e300."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if count and not (is_int and 0 <= value <= MAX_COUNT):
        expected = "a non-negative integer (at most 2^53)"
    elif number and not ((is_int or isinstance(value, float)) and abs(value) <= MAX_SCALE):
        expected = "a number (finite, of magnitude at most 1e300)"
    elif not count and not number and not isinstance(value, str):
        expected = "a string"
    else:
        return
    shown = repr(value) if not isinstance(value, list) else f"an array of {len(value)}"
    raise SpecboundError(
        f"{path}: the metadata key {key!r} must hold {expected}, found {shown[:80]} "
        f"({type(value).__name__}); the file is corrupt or hand-edited: re-convert the model"
    )


def _check_block_count(path: Path, tensor_names: Any, arch: str, config: dict[str, Any]) -> None:
    """``block_count`` checked against the blocks the file holds tensors of (``blk.N.*``), before
    anything is sized by it (Gemma 3's per-layer types, the layers analysed): a file declaring 4e9
    blocks with tensors of two is refused in one line, not looped over."""
    declared = config.get("block_count")
    if not isinstance(declared, int):
        return
    held = {int(m.group(1)) for name in tensor_names if (m := BLOCK.match(name))}
    if declared > (max(held) + 1 if held else 0):
        raise SpecboundError(
            f"{path}: the metadata key '{arch}.block_count' declares {declared:,} blocks "
            f"but the file holds tensors of {len(held):,} (blk.0 to blk.{max(held, default=-1)}); "
            f"the file is corrupt or hand-edited: re-convert the model"
        )


def _rotary_keys(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The rotary settings under the Hugging Face config keys ``archs.rotary`` reads: ``rope_theta``
    (``rope.freq_base``; llama.cpp's default 10000), ``max_position_embeddings``
    (``context_length``), ``rotary_dim`` (``rope.dimension_count``, when given) and ``rope_scaling``
    from ``rope.scaling.type``: ``linear`` (``.factor``) and ``yarn`` (``.factor``,
    ``.original_context_length``; llama.cpp's attention factor ``1 + 0.1 ln(factor)`` is
    transformers' default, so a file whose ``.attn_factor`` changes it is refused).  Another type is
    passed on under its own name, for the rotary reader to refuse; llama.cpp's ``rope_freqs`` factors
    (Llama 3.1) are read with the tensors (:func:`open_gguf`)."""
    keys: dict[str, Any] = {"rope_theta": float(config.get("rope.freq_base", 10000.0))}
    if isinstance(config.get("context_length"), int):
        keys["max_position_embeddings"] = config["context_length"]
    if isinstance(config.get("rope.dimension_count"), int):
        keys["rotary_dim"] = config["rope.dimension_count"]
    scaling = config.get("rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ("none", ""):
        rope = {"rope_type": scaling, "factor": config.get("rope.scaling.factor")}
        if scaling == "yarn":
            attn = config.get("rope.scaling.attn_factor", 1.0)
            if attn not in (None, 1.0):
                raise SpecboundError(
                    f"{path}: YaRN with rope.scaling.attn_factor = {attn!r}: llama.cpp's attention "
                    f"factor then differs from transformers' and is not modelled; analyse the model's "
                    f"Hugging Face safetensors weights instead"
                )
            rope["original_max_position_embeddings"] = config.get("rope.scaling.original_context_length")
            for ours, theirs in (
                ("beta_fast", "rope.scaling.yarn_beta_fast"),
                ("beta_slow", "rope.scaling.yarn_beta_slow"),
            ):
                if config.get(theirs) is not None:
                    rope[ours] = config[theirs]
        keys["rope_scaling"] = rope
    return keys


_SHARD = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _split_count(header: GGUFHeader) -> int:
    count = header.metadata.get("split.count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise SpecboundError(
            f"{header.path}: the metadata key 'split.count' must hold a positive integer, found "
            f"{count!r}; the file is corrupt: re-download it"
        )
    return count


def _shards(path: Path, header: GGUFHeader) -> list[GGUFHeader]:
    """The headers of every part of a split GGUF model (``name-00001-of-00003.gguf``, the metadata in
    the first part), or ``[header]`` for a single file.  A missing part is an error."""
    count = _split_count(header)
    if count <= 1:
        return [header]
    match = _SHARD.match(path.name)
    if match is None or int(match["count"]) != count:
        raise SpecboundError(
            f"{path} is part of a GGUF model split into {count} files, but its name does not say "
            f"which (expected <name>-NNNNN-of-{count:05d}.gguf); keep the parts' original names"
        )
    parts = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise SpecboundError(
            f"{path} is part 1..{count} of a split GGUF model, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing from {path.parent}: download every part"
        )
    return [header if p == path else read_header(p) for p in parts]


def open_gguf(path: Path, config: dict[str, Any] | None = None, header: GGUFHeader | None = None) -> GGUFCheckpoint:
    """Read and check ``path``'s header (the weights stay on disk, memory-mapped when read); a split
    model (``-00001-of-0000N.gguf``) is read from all its parts, whichever part is named.  The config
    is the file's metadata (``config`` is not read: the caller's keys are merged by
    :func:`~specbound.io.open_checkpoint`); ``header``: the file's header when the caller has read it
    (:func:`~.gguf_mmproj.open_gguf_file`, which opens an mmproj file itself)."""
    header = read_header(path) if header is None else header
    headers = _shards(path, header)
    arch, config = read_metadata(headers[0], [name for h in headers for name in h.tensors])
    row = ARCHS.get(arch)
    if row is None:
        _refuse_recurrent(path, arch, config, [n for h in headers for n in h.tensors])
        raise SpecboundError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHS)}); "
            f"analyse the model's Hugging Face safetensors weights instead"
        )
    tensors: dict[str, TensorInfo] = {}
    files: dict[str, Path] = {}
    for header in headers:
        for name, tensor in header.tensors.items():
            if name in tensors:
                raise SpecboundError(
                    f"{path}: tensor {name!r} is stored in two parts of the split model; "
                    f"the parts belong to different models: re-download them"
                )
            tensors[name], files[name] = tensor, header.path
    if row.blocks:
        tensors, files = row.blocks(path, config, tensors, files)
    conventions: dict[str, str] = {}
    if row.keys:
        keys, conventions = row.keys(path, config)
        config.update(keys)
    tensors, files = _expert_slices(tensors, files)
    quantized = {n: t.kind for n, t in tensors.items() if t.kind not in _EXACT and t.kind not in _INTEGER}
    _refuse_big_endian_blocks(headers, files, quantized)
    ckpt = GGUFCheckpoint(
        location=str(path),
        config=config,
        path=path,
        arch=arch,
        _headers={h.path: h for h in headers},
        _tensors=tensors,
        quantized=quantized,
        _files=files,
        _joined=row.joined(path, tensors) if row.joined else {},
        facts=gguf_facts(quantized, conventions),
    )
    if "rope_freqs.weight" in tensors:  # Llama 3.1's rope scaling, as llama.cpp's frequency divisors
        ckpt.config["rope_freq_factors"] = [float(x) for x in ckpt.read("rope_freqs.weight").ravel()]
    ckpt.config.update(_longrope_keys(ckpt))
    return ckpt


# llama.cpp's tensors of the blocks that are not softmax attention (qwen3next, kimi-linear, mamba,
# mamba2, jamba, nemotron_h, granitehybrid, falcon-h1, lfm2, rwkv*): what each is, and its names
_RECURRENT = (
    ("ssm_", "state-space or linear-attention", "blk.N.ssm_*"),
    ("shortconv.", "gated short-convolution", "blk.N.shortconv.*"),
    ("time_mix_", "RWKV time-mixing", "blk.N.time_mix_*"),
)


def _refuse_recurrent(path: Path, arch: str, config: dict[str, Any], names: list[str]) -> None:
    """A hybrid's (or a state-space model's) file, refused in one line naming the layers whose
    tensors are of a linear-attention, state-space or convolution block (docs/families.md)."""
    for prefix, kind, pattern in _RECURRENT:
        layers = sorted({int(m[1]) for n in names if (m := re.match(rf"^blk\.(\d+)\.{re.escape(prefix)}", n))})
        if layers:
            count = config.get("block_count")
            of = f" of {count}" if isinstance(count, int) and not isinstance(count, bool) else ""
            noun = "layer" if len(layers) == 1 else "layers"
            raise SpecboundError(
                f"{path}: GGUF architecture {arch!r} is refused as a whole: {noun} {index_ranges(layers)}{of} are "
                f"{kind} layers ({pattern}); their state carries every earlier token through input-dependent "
                f"decays and gates, and specbound derives neither their matrices as terms of the bound nor a "
                f"Lipschitz factor over sequences for them (docs/families.md), and a bound over the softmax "
                f"attention alone would leave them out silently"
            )


def _expert_slices(
    tensors: dict[str, TensorInfo], files: dict[str, Path]
) -> tuple[dict[str, TensorInfo], dict[str, Path]]:
    """Every 3-D expert bank replaced by its experts' slices ``name[e]`` (module docstring): expert
    ``e``'s bytes are the ``e``-th of ``E`` equal contiguous parts of the bank's."""
    out, where = {}, {}
    for name, t in tensors.items():
        if not (_BANK.match(name) and len(t.shape) == 3 and t.shape[0] > 0 and t.n_bytes % t.shape[0] == 0):
            out[name], where[name] = t, files[name]
            continue
        experts = t.shape[0]
        size, count = t.n_bytes // experts, t.n_elements // experts
        for e in range(experts):
            part = f"{name}[{e}]"
            out[part] = TensorInfo(part, t.kind, t.shape[1:], t.start + e * size, size, count)
            where[part] = files[name]
    return out, where


def _longrope_keys(ckpt: GGUFCheckpoint) -> dict[str, Any]:
    """LongRoPE's factor tensors as the Hugging Face ``rope_scaling`` (module docstring)."""
    present = [n for n in _LONGROPE if n in ckpt.names]
    if not present:
        return {}
    if len(present) == 1:
        missing = next(n for n in _LONGROPE if n not in present)
        raise SpecboundError(
            f"{ckpt.path} holds {present[0]} but not {missing}: LongRoPE needs both factor sets; re-convert the model"
        )
    long_factor, short_factor = ([float(x) for x in ckpt.read(n).ravel()] for n in _LONGROPE)
    keys: dict[str, Any] = {
        "rope_scaling": {"rope_type": "longrope", "long_factor": long_factor, "short_factor": short_factor}
    }
    original = ckpt.config.get("rope.scaling.original_context_length")
    if isinstance(original, int) and not isinstance(original, bool):
        keys["original_max_position_embeddings"] = original
    return keys


def _refuse_big_endian_blocks(headers: list[GGUFHeader], files: dict[str, Path], quantized: dict[str, str]) -> None:
    """A big-endian file's quantized blocks are read only for the types whose byte-swapped fields
    are known (:data:`~.gguf_header.BIG_ENDIAN_FIELDS`); any other would decode to wrong scales."""
    big = {h.path for h in headers if h.big_endian}
    unknown = sorted(
        (kind, name) for name, kind in quantized.items() if files[name] in big and kind not in BIG_ENDIAN_FIELDS
    )
    if unknown:
        kind, name = unknown[0]
        raise SpecboundError(
            f"{files[name]} is a big-endian GGUF file holding {kind} tensors (e.g. {name!r}), whose block layout "
            f"this reader cannot byte-swap (it reads {', '.join(BIG_ENDIAN_FIELDS)} big-endian); convert it "
            f"with gguf_convert_endian.py FILE little, or re-convert the model"
        )
