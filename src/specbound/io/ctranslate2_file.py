"""CTranslate2 model folders (faster-whisper, OpenNMT, ``ct2-transformers-converter`` output):
``model.bin`` read with numpy from CTranslate2's published binary layout (never the ``ctranslate2``
package), its variables renamed to the Hugging Face tensors they were converted from, and a Hugging
Face config rebuilt from the spec, so that the shipped families read it.

The file (``ModelSpec._serialize`` of ``ctranslate2/specs/model_spec.py``, binary version 6): a
``uint32`` version, the spec's name and ``uint32`` revision, a ``uint32`` count of variables, each a
name, a ``uint8`` rank, ``uint32`` dimensions, a ``uint8`` dtype id (float32, int8, int16, int32,
float16, bfloat16) and a ``uint32`` byte count before its bytes; then a ``uint32`` count of aliases
(name -> variable).  Strings are a ``uint16`` length (with the closing NUL) and UTF-8 bytes.  Every
count, rank, length and byte count is checked against the file before it is used.

Quantized weights (``--quantization int8``, ``int8_float16``, ``int8_bfloat16``, ``int16``) are stored
as integers ``q = round(w * scale)`` with ``weight_scale`` (one per output row for int8, one per
tensor for int16); they are dequantized as CTranslate2 does on CPU, ``float32(q) * (1 / scale)`` in
float32 (:func:`dequantize`), and
its note ``quantized_weights`` names the quantization (the bounds are of the quantized
model).  A spec with pre-quantized AWQ weights (int32 ``weight``) is refused by name.

Specs read, and the Hugging Face family each becomes:

* ``WhisperSpec`` -> ``whisper``: ``self_attention/linear_0`` is ``[q | k | v]``, the decoder's
  cross-attention ``attention/linear_0`` is ``q`` and ``attention/linear_1`` is ``[k | v]``.
* ``TransformerDecoderSpec`` in the LLaMA style (RMS norm, gated ``linear_0``/``linear_0_noact``
  feed-forward, rotary attention, no position table) -> ``llama``; ``self_attention/linear_0`` is
  ``[q | k | v]`` with ``num_heads_kv`` key/value heads.  Another decoder (GPT-2, OPT, Gemma, ...) is
  refused by name.
* ``TransformerEncoderSpec`` (BERT, RoBERTa, XLM-R) -> ``bert``.
* ``TransformerSpec`` (BART, Marian, M2M100, NLLB, OpenNMT Transformers) -> ``bart``.

What the spec does not hold (a LLaMA's ``max_position_embeddings``) is left out of the config; pass
it with ``--set`` where an analysis needs it.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecboundError, os_errors
from .base import WEIGHTS_NOTE, Checkpoint, ReaderFacts, load_json

BINARY_VERSIONS = (6,)
# dtype id -> (numpy dtype, safetensors code), in the order of ctranslate2's DataType enum
_DTYPES = {
    0: ("<f4", "F32"),
    1: ("<i1", "I8"),
    2: ("<i2", "I16"),
    3: ("<i4", "I32"),
    4: ("<f2", "F16"),
    5: ("<u2", "BF16"),
}
MAX_VARIABLES = 1_000_000
MAX_RANK = 8
MAX_ALIASES = 1_000_000
# CTranslate2's Activation enum (ctranslate2/specs/common_spec.py) -> Hugging Face's name
_ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu", 4: "quick_gelu", 5: "tanh", 6: "sigmoid"}
SPECS = ("WhisperSpec", "TransformerDecoderSpec", "TransformerEncoderSpec", "TransformerSpec")


@dataclass(frozen=True)
class Variable:
    shape: tuple[int, ...]
    dtype: int
    start: int
    n_bytes: int


def _corrupt(path: Path, why: str) -> SpecboundError:
    return SpecboundError(
        f"cannot read {path} as a CTranslate2 model.bin: {why}; the file is truncated or corrupt, "
        f"re-convert the model with ct2-transformers-converter"
    )


def read_model_bin(path: Path) -> tuple[str, dict[str, Variable], dict[str, str]]:
    """``(spec name, variables, aliases)`` of a CTranslate2 ``model.bin``, every count and offset
    checked against the file's size before it is used (the values are not read)."""
    with os_errors(f"read the CTranslate2 model {path}"), open(path, "rb") as f:
        size = path.stat().st_size
        pos = 0

        def take(n: int) -> bytes:
            nonlocal pos
            if n < 0 or pos + n > size:
                raise _corrupt(path, f"it ends at byte {size:,}, before the {n:,} bytes declared at byte {pos:,}")
            data = f.read(n)
            if len(data) != n:
                raise _corrupt(path, "it shrank while it was read")
            pos += n
            return data

        def u(fmt: str) -> int:
            return struct.unpack("<" + fmt, take(struct.calcsize(fmt)))[0]

        def text() -> str:
            n = u("H")
            raw = take(n)
            if n == 0 or raw[-1:] != b"\0":
                raise _corrupt(path, f"a string at byte {pos - n:,} does not end with its NUL")
            try:
                return raw[:-1].decode("utf-8")
            except UnicodeDecodeError:
                raise _corrupt(path, f"a name at byte {pos - n:,} is not UTF-8") from None

        version = u("I")
        if version not in BINARY_VERSIONS:
            raise SpecboundError(
                f"{path} is a CTranslate2 model.bin of binary version {version}; specbound reads "
                f"version {', '.join(map(str, BINARY_VERSIONS))} (CTranslate2 >= 3): re-convert the "
                f"model with a current ct2-transformers-converter"
            )
        spec = text()
        u("I")  # the spec's revision
        count = u("I")
        if count > min(MAX_VARIABLES, size // 8):
            raise _corrupt(path, f"it declares {count:,} variables")
        variables: dict[str, Variable] = {}
        for _ in range(count):
            name = text()
            rank = u("B")
            if rank > MAX_RANK:
                raise _corrupt(path, f"variable {name!r} declares rank {rank}")
            shape = tuple(u("I") for _ in range(rank))
            dtype = u("B")
            if dtype not in _DTYPES:
                raise _corrupt(path, f"variable {name!r} has the unknown dtype id {dtype}")
            n_bytes = u("I")
            if n_bytes != math.prod(shape) * np.dtype(_DTYPES[dtype][0]).itemsize:
                raise _corrupt(
                    path,
                    f"variable {name!r} of shape {shape} as {_DTYPES[dtype][1]} spans {n_bytes:,} "
                    f"bytes, not {math.prod(shape) * np.dtype(_DTYPES[dtype][0]).itemsize:,}",
                )
            if pos + n_bytes > size:
                raise _corrupt(
                    path, f"variable {name!r} lies at bytes {pos:,}..{pos + n_bytes:,}, beyond its {size:,} bytes"
                )
            if name in variables:
                raise _corrupt(
                    path,
                    f"it holds the variable {name!r} twice (at bytes {variables[name].start:,} and "
                    f"{pos:,}), and a reader would take either",
                )
            variables[name] = Variable(shape, dtype, pos, n_bytes)
            f.seek(n_bytes, 1)
            pos += n_bytes
        n_alias = u("I")
        if n_alias > min(MAX_ALIASES, size // 4):
            raise _corrupt(path, f"it declares {n_alias:,} aliases")
        aliases = {}
        for _ in range(n_alias):
            alias, target = text(), text()
            if target not in variables:
                raise _corrupt(path, f"the alias {alias!r} names {target!r}, which it does not hold")
            if alias in aliases or alias in variables:
                raise _corrupt(
                    path,
                    f"the alias {alias!r} names {target!r} and is also "
                    f"{'an alias of ' + repr(aliases[alias]) if alias in aliases else 'a variable'}",
                )
            aliases[alias] = target
    return spec, variables, aliases


@dataclass
class CTranslate2Checkpoint(Checkpoint):
    """A CTranslate2 ``model.bin`` under Hugging Face names (module docstring).

    Attributes
    ----------
    path : Path
    spec : str
        The spec's name (``WhisperSpec``, ...).
    parts : dict[str, tuple[str, int, int]]
        Hugging Face tensor name -> (CTranslate2 variable, first row, end row): the rows of a fused
        ``[q | k | v]`` the tensor is.
    """

    location: str
    config: dict[str, Any]
    path: Path
    spec: str
    variables: dict[str, Variable] = field(repr=False)
    parts: dict[str, tuple[str, int, int]] = field(repr=False)
    _map: Any = field(default=None, repr=False)

    def __post_init__(self):
        # The config is rebuilt from the spec, not read from config.json (CTranslate2's own): no
        # config_path for a sweep to fingerprint and read again.
        self.facts = ReaderFacts(config_from_weights=True, notes=self._notes())

    @property
    def names(self) -> list[str]:
        return sorted(self.parts)

    @property
    def quantized(self) -> dict[str, str]:
        """Hugging Face tensor name -> stored integer type, for the quantized weights."""
        out = {}
        for name, (var, _, _) in self.parts.items():
            code = _DTYPES[self.variables[var].dtype][1]
            if code in ("I8", "I16"):
                out[name] = code
        return out

    def _notes(self) -> dict[str, str]:
        quantized = self.quantized
        if not quantized:
            return {}
        kinds = sorted({"int8" if c == "I8" else "int16" for c in quantized.values()})
        return {
            WEIGHTS_NOTE: (
                f"quantized CTranslate2 model ({', '.join(kinds)} weights with weight_scale; {len(quantized)} "
                "tensors): "
                f"the weights analysed are the dequantized values float32(q) * (1 / scale) CTranslate2 computes with "
                f"on CPU, so the bounds are of the quantized model"
            )
        }

    def shape(self, name: str) -> tuple[int, ...]:
        var, a, b = self.parts[name]
        shape = self.variables[var].shape
        return (b - a, *shape[1:]) if shape else shape

    def dtype(self, name: str) -> str:
        code = _DTYPES[self.variables[self.parts[name][0]].dtype][1]
        return "F32" if code in ("I8", "I16") else code

    def where(self, name: str) -> str:
        return f"{self.path} (CTranslate2 variable {self.parts[name][0]!r})"

    def files(self) -> list[Path]:
        return [self.path]

    def _stored_in(self, name: str) -> Path | None:
        return self.path

    def check_size(self, name: str) -> int:
        """The variable's bytes were checked against the file when it was opened; the float64 copy
        against the memory available."""
        count = math.prod(self.shape(name))
        return self.check_memory(name, count)

    def _values(self, var: str) -> np.ndarray:
        v = self.variables[var]
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        data = self._map[v.start : v.start + v.n_bytes]
        if data.size != v.n_bytes:
            raise SpecboundError(
                f"cannot read {self.path}: variable {var!r} lies beyond its end (truncated while "
                f"read); re-convert the model"
            )
        words = data.view(_DTYPES[v.dtype][0]).reshape(v.shape)
        if v.dtype == 5:
            return (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return words.astype(np.float64)

    def _raw(self, name: str) -> np.ndarray:
        var, a, b = self.parts[name]
        values = self._values(var)
        if self.variables[var].dtype in (1, 2):  # int8 / int16, dequantized as CTranslate2 does
            scale_name = var.rsplit("/", 1)[0] + "/weight_scale"
            scale = self._values(scale_name) if scale_name in self.variables else None
            rows = values.shape[0] if values.ndim else 1
            if scale is None or scale.size not in (1, rows) or not np.all(np.isfinite(scale)) or np.any(scale == 0):
                raise SpecboundError(
                    f"cannot dequantize {self.where(name)}: its weight_scale is missing, zero, "
                    f"non-finite or not one per row; re-convert the model"
                )
            with np.errstate(all="ignore"):  # a scale so small that 1 / scale overflows: refused below, unwarned
                values = dequantize(values, scale)
                finite = np.isfinite(values.sum())
            if not finite:
                raise SpecboundError(
                    f"cannot dequantize {self.where(name)}: its weight_scale holds a value so near 0 "
                    f"that 1 / scale overflows float32; the file is corrupt: re-convert the model"
                )
        return values[a:b] if values.ndim else values

    def close(self) -> None:
        self._map = None


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """CTranslate2's dequantization on CPU (``dequantize_kernel`` of src/ops/dequantize_cpu.cc):
    ``float32(q) * (1.f / scale)`` in float32, with one scale per row (int8) or per tensor (int16);
    float32 products and quotients are correctly rounded, so every CPU computes the same values."""
    scale = scale.astype(np.float32)
    reciprocal = np.float32(1) / (scale.reshape(-1, *([1] * (q.ndim - 1))) if scale.size > 1 else scale.reshape(()))
    return (q.astype(np.float32) * reciprocal).astype(np.float64)


def is_ctranslate2_folder(folder: Path) -> bool:
    return (folder / "model.bin").is_file() and _looks_like_ct2(folder / "model.bin")


def _looks_like_ct2(path: Path) -> bool:
    """A CTranslate2 model.bin starts with a small uint32 version and a spec name ending in Spec
    (a PyTorch pickle starts with a zip's PK or a pickle opcode)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    if len(head) < 8:
        return False
    version, n = struct.unpack_from("<IH", head)
    return 1 <= version <= 64 and 2 <= n <= 58 and head[6 : 6 + n - 1].decode("ascii", "replace").endswith("Spec")


def open_ctranslate2_folder(folder: Path, config: dict[str, Any] | None = None) -> CTranslate2Checkpoint:
    """A CTranslate2 folder's ``model.bin`` (``config``, the folder's CTranslate2 config.json, is re-read)."""
    return open_ctranslate2(folder / "model.bin")


def open_ctranslate2(path: Path, config: dict[str, Any] | None = None) -> CTranslate2Checkpoint:
    """A CTranslate2 ``model.bin`` (its folder's config.json, CTranslate2's own, read beside it;
    ``config``: keys that override the rebuilt Hugging Face config)."""
    if not _looks_like_ct2(path):
        raise SpecboundError(
            f"{path} is not a CTranslate2 model.bin (it does not start with a binary version and a "
            f"spec name); a PyTorch state dict is read from pytorch_model.bin in a folder, or when "
            f"named as a file: specbound analyze folder/weights.bin"
        )
    spec, variables, aliases = read_model_bin(path)
    ct2_config: dict[str, Any] = {}
    if (path.parent / "config.json").is_file():
        loaded = load_json(path.parent / "config.json", "CTranslate2 config", "re-convert the model")
        ct2_config = loaded if isinstance(loaded, dict) else {}
    resolve = {**{a: t for a, t in aliases.items()}, **{v: v for v in variables}}
    scalars = _Scalars(path, variables, resolve)
    if spec == "WhisperSpec":
        hf_config, parts = _whisper(scalars)
    elif spec == "TransformerDecoderSpec":
        hf_config, parts = _llama(scalars, ct2_config)
    elif spec == "TransformerEncoderSpec":
        hf_config, parts = _bert(scalars, ct2_config)
    elif spec == "TransformerSpec":
        hf_config, parts = _seq2seq(scalars, ct2_config)
    else:
        raise SpecboundError(
            f"{path} is a CTranslate2 {spec}; specbound reads {', '.join(SPECS)} (Whisper, LLaMA-style "
            f"decoders, BERT-style encoders, Transformer encoder-decoders): analyse the Hugging Face "
            f"model it was converted from"
        )
    for name, (var, a, b) in parts.items():
        v = variables[var]
        if v.dtype == 3:
            raise SpecboundError(
                f"{path}: CTranslate2 variable {var!r} is stored as int32 (pre-quantized AWQ weights "
                f"in CTranslate2), which specbound does not read; analyse the AWQ checkpoint itself or "
                f"convert the float model"
            )
        if not v.shape or not 0 <= a < b <= v.shape[0]:
            raise _corrupt(path, f"variable {var!r} of shape {v.shape} does not hold rows {a}..{b} of {name}")
    hf_config["ctranslate2_spec"] = spec
    if config:
        hf_config.update(config)
    return CTranslate2Checkpoint(str(path.parent), hf_config, path, spec, variables, parts)


class _Scalars:
    """The spec's variables by name (aliases resolved), scalars read."""

    def __init__(self, path: Path, variables: dict[str, Variable], resolve: dict[str, str]):
        self.path, self.variables, self.resolve = path, variables, resolve

    def has(self, name: str) -> bool:
        return name in self.resolve

    def var(self, name: str) -> str:
        if name not in self.resolve:
            raise SpecboundError(
                f"{self.path} holds no variable {name!r}, which every such CTranslate2 spec has; "
                f"the file is corrupt or of a spec specbound does not read: re-convert the model"
            )
        return self.resolve[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.variables[self.var(name)].shape

    def matrix(self, name: str) -> tuple[int, ...]:
        """The shape of ``name``, which must have at least two dimensions (a weight or table)."""
        shape = self.shape(name)
        if len(shape) < 2:
            raise _corrupt(self.path, f"{name!r} has the shape {shape}, where a matrix belongs")
        return shape

    def scalar(self, name: str, default: Any = None) -> Any:
        if name not in self.resolve:
            if default is not None:
                return default
            self.var(name)
        v = self.variables[self.resolve[name]]
        if v.shape not in ((), (1,)):
            raise _corrupt(self.path, f"the setting {name!r} is not a scalar (shape {v.shape})")
        with open(self.path, "rb") as f:
            f.seek(v.start)
            value = np.frombuffer(f.read(v.n_bytes), dtype=_DTYPES[v.dtype][0])[0]
        if v.dtype == 5:  # bfloat16: the upper half of a float32
            value = (np.uint32(value) << np.uint32(16)).view(np.float32)
        if not np.isfinite(value):
            raise _corrupt(self.path, f"the setting {name!r} is not finite")
        return value.item()

    def count(self, prefix: str) -> int:
        """Layers ``prefix/layer_N`` (0..count-1, all present)."""
        found = {int(m[1]) for n in self.resolve if (m := re.match(rf"^{re.escape(prefix)}/layer_(\d+)/", n))}
        if found != set(range(len(found))):
            raise _corrupt(self.path, f"its {prefix} layers are numbered {sorted(found)[:10]}, not 0..n-1")
        if not found:
            raise _corrupt(self.path, f"it holds no {prefix} layers")
        return len(found)

    def rows(self, name: str) -> int:
        return self.matrix(name)[0]

    def activation(self, name: str) -> str:
        code = int(self.scalar(name))
        if code not in _ACTIVATIONS:
            raise _corrupt(self.path, f"{name!r} is the unknown activation id {code}")
        return _ACTIVATIONS[code]


def _split(parts: dict, s: _Scalars, var: str, names: list[str], sizes: list[int]) -> None:
    """``names`` as consecutive row blocks of ``sizes`` rows of the variable ``var`` (all its rows)."""
    real = s.var(var)
    if sum(sizes) != s.rows(var):
        raise _corrupt(s.path, f"{var!r} has {s.rows(var)} rows, not the {sum(sizes)} of {' | '.join(names)}")
    at = 0
    for name, n in zip(names, sizes):
        parts[name] = (real, at, at + n)
        at += n


def _whole(parts: dict, s: _Scalars, var: str, name: str) -> None:
    if s.has(var):
        parts[name] = (s.var(var), 0, s.rows(var))


def _heads(s: _Scalars, name: str, width: int) -> int:
    heads = int(s.scalar(name))
    if heads <= 0 or width % heads:
        raise _corrupt(s.path, f"{name!r} = {heads} heads do not divide the width {width}")
    return heads


def _attention(parts, s, src, dst, d, names=("q_proj", "k_proj", "v_proj", "out_proj")):
    _split(parts, s, f"{src}/linear_0/weight", [f"{dst}.{n}.weight" for n in names[:3]], [d, d, d])
    _whole(parts, s, f"{src}/linear_1/weight", f"{dst}.{names[3]}.weight")


def _cross(parts, s, src, dst, d):
    _whole(parts, s, f"{src}/linear_0/weight", f"{dst}.q_proj.weight")
    _split(parts, s, f"{src}/linear_1/weight", [f"{dst}.k_proj.weight", f"{dst}.v_proj.weight"], [d, d])
    _whole(parts, s, f"{src}/linear_2/weight", f"{dst}.out_proj.weight")


def _stacks(s: _Scalars, parts: dict, prefix: str) -> dict[str, Any]:
    """The encoder and decoder of a BART-style spec (Whisper, TransformerSpec) under ``prefix``."""
    d = s.rows("encoder/layer_0/self_attention/linear_1/weight")
    cfg: dict[str, Any] = {"d_model": d}
    for stack in ("encoder", "decoder"):
        n = s.count(stack)
        cfg[f"{stack}_layers"] = n
        cfg[f"{stack}_attention_heads"] = _heads(s, f"{stack}/num_heads", d)
        cfg[f"{stack}_ffn_dim"] = s.rows(f"{stack}/layer_0/ffn/linear_0/weight")
        for i in range(n):
            src, dst = f"{stack}/layer_{i}", f"{prefix}{stack}.layers.{i}"
            _attention(parts, s, f"{src}/self_attention", f"{dst}.self_attn", d)
            if stack == "decoder":
                _cross(parts, s, f"{src}/attention", f"{dst}.encoder_attn", d)
            _whole(parts, s, f"{src}/ffn/linear_0/weight", f"{dst}.fc1.weight")
            _whole(parts, s, f"{src}/ffn/linear_1/weight", f"{dst}.fc2.weight")
    return cfg


def _whisper(s: _Scalars) -> tuple[dict[str, Any], dict]:
    parts: dict = {}
    cfg = _stacks(s, parts, "model.")
    conv1 = s.shape("encoder/conv1/weight")
    cfg.update(
        model_type="whisper",
        activation_function=s.activation("decoder/activation"),
        vocab_size=s.rows("decoder/embeddings/weight"),
        num_mel_bins=conv1[1] if len(conv1) == 3 else None,
        max_source_positions=s.rows("encoder/position_encodings/encodings"),
        max_target_positions=s.rows("decoder/position_encodings/encodings"),
    )
    for name in ("conv1", "conv2"):
        _whole(parts, s, f"encoder/{name}/weight", f"model.encoder.{name}.weight")
    _whole(parts, s, "decoder/embeddings/weight", "model.decoder.embed_tokens.weight")
    return cfg, parts


def _seq2seq(s: _Scalars, ct2: dict) -> tuple[dict[str, Any], dict]:
    parts: dict = {}
    cfg = _stacks(s, parts, "model.")
    pre_norm = bool(s.scalar("decoder/pre_norm", 0))
    cfg.update(
        model_type="bart",
        activation_function=s.activation("decoder/activation"),
        normalize_before=pre_norm,
        vocab_size=s.rows(_first_embedding(s, "decoder")),
    )
    _whole(parts, s, _first_embedding(s, "encoder"), "model.encoder.embed_tokens.weight")
    return cfg, parts


def _first_embedding(s: _Scalars, stack: str) -> str:
    """The token embedding of ``stack`` (``embeddings`` or, with several inputs, ``embeddings_0``)."""
    return next(
        (n for n in (f"{stack}/embeddings/weight", f"{stack}/embeddings_0/weight") if s.has(n)),
        f"{stack}/embeddings/weight",
    )


def _llama(s: _Scalars, ct2: dict) -> tuple[dict[str, Any], dict]:
    layer0 = "decoder/layer_0"
    gated = s.has(f"{layer0}/ffn/linear_0_noact/weight")
    rms = not s.has(f"{layer0}/self_attention/layer_norm/beta")
    rotary = s.has(f"{layer0}/self_attention/rotary_dim")
    extra = [
        n
        for n in ("q_norm", "k_norm", "pre_feedforward_layer_norm", "post_attention_layer_norm")
        if any(k.startswith(f"{layer0}/") and f"/{n}/" in k for k in s.resolve)
    ]
    if not (gated and rms and rotary) or s.has("decoder/position_encodings/encodings") or extra:
        style = (
            ", ".join(
                f
                for f, ok in (("a gated feed-forward", gated), ("RMS norms", rms), ("rotary attention", rotary))
                if not ok
            )
            or f"the extra {', '.join(extra) or 'position table'}"
        )
        raise SpecboundError(
            f"{s.path} is a CTranslate2 TransformerDecoderSpec without LLaMA's layout (it lacks "
            f"or has {style}): specbound reads LLaMA-style decoders (Llama, Mistral, Qwen2) from "
            f"CTranslate2; analyse the Hugging Face model it was converted from"
        )
    d = s.rows(f"{layer0}/self_attention/linear_1/weight")
    heads = _heads(s, "decoder/num_heads", d)
    kv = int(s.scalar(f"{layer0}/self_attention/num_heads_kv", heads))
    qkv = s.rows(f"{layer0}/self_attention/linear_0/weight")
    head_dim = (
        int(s.scalar(f"{layer0}/self_attention/head_dim", d // heads))
        if s.has(f"{layer0}/self_attention/head_dim")
        else s.matrix(f"{layer0}/self_attention/linear_1/weight")[1] // heads
    )
    if kv <= 0 or heads % kv or qkv != (heads + 2 * kv) * head_dim:
        raise _corrupt(
            s.path, f"its fused attention has {qkv} rows, not (heads {heads} + 2 x kv heads {kv}) x head_dim {head_dim}"
        )
    rotary_dim = int(s.scalar(f"{layer0}/self_attention/rotary_dim"))
    if rotary_dim not in (0, head_dim) or bool(s.scalar(f"{layer0}/self_attention/rotary_interleave", 0)):
        raise SpecboundError(
            f"{s.path}: the CTranslate2 decoder rotates {rotary_dim} of {head_dim} dimensions"
            f"{' interleaved' if s.scalar(f'{layer0}/self_attention/rotary_interleave', 0) else ''}; "
            f"specbound reads LLaMA's full rotate-half rotary from CTranslate2"
        )
    n = s.count("decoder")
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": d,
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": s.rows(f"{layer0}/ffn/linear_0/weight"),
        "hidden_act": s.activation("decoder/activation"),
        "vocab_size": s.rows("decoder/embeddings/weight"),
        "rope_theta": float(s.scalar(f"{layer0}/self_attention/rotary_base", 10000.0)),
    }
    if "layer_norm_epsilon" in ct2:
        cfg["rms_norm_eps"] = ct2["layer_norm_epsilon"]
    if s.has(f"{layer0}/self_attention/rotary_scaling_type"):
        kind = int(s.scalar(f"{layer0}/self_attention/rotary_scaling_type"))
        factor = float(s.scalar(f"{layer0}/self_attention/rotary_scaling_factor", 1.0))
        if kind != 0:
            raise SpecboundError(
                f"{s.path}: the CTranslate2 decoder's rotary scaling type {kind} (Su/LongRoPE or "
                f"Llama 3) keeps settings the spec does not store in full; specbound reads linear "
                f"scaling only from CTranslate2: analyse the Hugging Face model it was converted from"
            )
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    parts: dict = {}
    for i in range(n):
        src, dst = f"decoder/layer_{i}", f"model.layers.{i}"
        _split(
            parts,
            s,
            f"{src}/self_attention/linear_0/weight",
            [f"{dst}.self_attn.{p}_proj.weight" for p in "qkv"],
            [heads * head_dim, kv * head_dim, kv * head_dim],
        )
        _whole(parts, s, f"{src}/self_attention/linear_1/weight", f"{dst}.self_attn.o_proj.weight")
        _whole(parts, s, f"{src}/ffn/linear_0/weight", f"{dst}.mlp.gate_proj.weight")
        _whole(parts, s, f"{src}/ffn/linear_0_noact/weight", f"{dst}.mlp.up_proj.weight")
        _whole(parts, s, f"{src}/ffn/linear_1/weight", f"{dst}.mlp.down_proj.weight")
    _whole(parts, s, "decoder/embeddings/weight", "model.embed_tokens.weight")
    return cfg, parts


def _bert(s: _Scalars, ct2: dict) -> tuple[dict[str, Any], dict]:
    layer0 = "encoder/layer_0"
    d = s.rows(f"{layer0}/self_attention/linear_1/weight")
    n = s.count("encoder")
    emb = next((e for e in ("encoder/embeddings_0/weight", "encoder/embeddings/weight") if s.has(e)), None)
    cfg: dict[str, Any] = {
        "model_type": "bert",
        "hidden_size": d,
        "num_hidden_layers": n,
        "num_attention_heads": _heads(s, "encoder/num_heads", d),
        "intermediate_size": s.rows(f"{layer0}/ffn/linear_0/weight"),
        "hidden_act": s.activation("encoder/activation"),
        "vocab_size": s.rows(emb) if emb else None,
    }
    if s.has("encoder/position_encodings/encodings"):
        cfg["max_position_embeddings"] = s.rows("encoder/position_encodings/encodings")
    if s.has("encoder/embeddings_1/weight"):
        cfg["type_vocab_size"] = s.rows("encoder/embeddings_1/weight")
    if "layer_norm_epsilon" in ct2:
        cfg["layer_norm_eps"] = ct2["layer_norm_epsilon"]
    parts: dict = {}
    for i in range(n):
        src, dst = f"encoder/layer_{i}", f"encoder.layer.{i}"
        _split(
            parts,
            s,
            f"{src}/self_attention/linear_0/weight",
            [f"{dst}.attention.self.{p}.weight" for p in ("query", "key", "value")],
            [d, d, d],
        )
        _whole(parts, s, f"{src}/self_attention/linear_1/weight", f"{dst}.attention.output.dense.weight")
        _whole(parts, s, f"{src}/ffn/linear_0/weight", f"{dst}.intermediate.dense.weight")
        _whole(parts, s, f"{src}/ffn/linear_1/weight", f"{dst}.output.dense.weight")
    if emb:
        _whole(parts, s, emb, "embeddings.word_embeddings.weight")
    return cfg, parts
