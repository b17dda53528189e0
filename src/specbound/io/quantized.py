"""Quantized safetensors checkpoints (GPTQ, AWQ, compressed-tensors, fine-grained FP8, bitsandbytes, MLX) read
as the float matrices of the model the quantization defines.

Reads: a safetensors checkpoint (local or streamed) whose config.json says how its Linear weights are stored
(``quantization_config``, or MLX's ``quantization``); :func:`maybe_quantized` wraps it in a
:class:`QuantizedCheckpoint` and returns any other checkpoint as it is.

Guarantees:

* each quantized module's stored parts (``qweight``/``qzeros``/``scales``/``g_idx``,
  ``weight_packed``/``weight_scale``, ...) are hidden and its ``<module>.weight`` is exposed in their place,
  dequantized when read as its own library dequantizes it (the layout and formula of each method: the
  docstring of its ``_dequantize_*`` function); every other tensor is the stored checkpoint's own;
* every stored part's shape and dtype are checked against its module's before anything is unpacked, and the
  scales it multiplies by are finite;
* its note ``quantized_weights`` names the quantization, so every number says it is a number of
  the quantized model (as for GGUF).

Refuses, in one line naming it: every other variant (``quant_method``, ``checkpoint_format``, AWQ
``version``, compressed-tensors ``format``, bitsandbytes ``quant_type``, MLX ``mode``), a stored part of the
wrong shape or dtype, and a config whose quantization settings are out of range.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import SpecboundError
from .base import WEIGHTS_NOTE, Checkpoint, decode_json, load_json
from .patterns import bounded_search, compile_pattern

_FLOAT = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


# ---------------------------------------------------------------------------------------------
# numeric helpers


def unpack_bits(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` unsigned ``bits``-bit values of each row of ``words`` (unsigned 32-bit
    words, the last axis read as one little-endian bit stream: value ``k`` is bits ``k * bits`` ..
    ``(k + 1) * bits - 1``, crossing word boundaries when 32 is not a multiple of ``bits``)."""
    words = np.ascontiguousarray(words).astype("<u4", copy=False)
    if count * bits > words.shape[-1] * 32:
        raise ValueError(f"{words.shape[-1]} words hold {words.shape[-1] * 32 // bits} {bits}-bit values, not {count}")
    if 32 % bits == 0:  # word by word
        per = 32 // bits
        shifts = np.arange(per, dtype=np.uint32) * bits
        values = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
        return values.reshape(*words.shape[:-1], -1)[..., :count].astype(np.int64)
    stream = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")[..., : count * bits]
    stream = stream.reshape(*words.shape[:-1], count, bits).astype(np.int64)
    return (stream << np.arange(bits, dtype=np.int64)).sum(axis=-1)


def round_to(values: np.ndarray, code: str) -> np.ndarray:
    """``values`` (float64 or float32) rounded to the float type ``code`` (F32, F16, BF16, F64) as
    float64: the one rounding a library computing in that type makes of an exact result."""
    if code == "BF16":
        f32 = np.asarray(values, dtype=np.float32)
        bits = f32.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # round to nearest, ties to even
        out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(np.isnan(f32), np.nan, out)
    return np.asarray(values).astype(_FLOAT[code]).astype(np.float64)


def stored_floats(values: np.ndarray, code: str) -> np.ndarray:
    """Stored scale / bias words of dtype ``code`` as float64 (exact)."""
    if code == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if code == "F8_E4M3":
        return E4M3[values.astype(np.int64)]
    if code == "F8_E5M2":
        return E5M2[values.astype(np.int64)]
    if code in _FLOAT:
        return values.astype(np.float64)
    raise ValueError(f"a scale stored as {code}")


def _fp8_table(exponent_bits: int, mantissa_bits: int, fn: bool) -> np.ndarray:
    """The 256 values of an 8-bit float (E4M3FN: no infinities, S.1111.111 is NaN; E5M2: IEEE-like)."""
    bias = (1 << (exponent_bits - 1)) - 1
    table = np.empty(256)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        e = (byte >> mantissa_bits) & ((1 << exponent_bits) - 1)
        m = byte & ((1 << mantissa_bits) - 1)
        if fn and e == (1 << exponent_bits) - 1 and m == (1 << mantissa_bits) - 1:
            table[byte] = np.nan
        elif not fn and e == (1 << exponent_bits) - 1:
            table[byte] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            table[byte] = sign * m * 2.0 ** (1 - bias - mantissa_bits)
        else:
            table[byte] = sign * (1 + m / (1 << mantissa_bits)) * 2.0 ** (e - bias)
    return table


E4M3 = _fp8_table(4, 3, True)
E5M2 = _fp8_table(5, 2, False)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


# ---------------------------------------------------------------------------------------------
# the checkpoint


@dataclass
class Module:
    """One quantized Linear: its stored tensors (role -> stored name), the weight's shape
    ``(out, in)``, the float type its library produces, and how to dequantize it."""

    weight: str
    parts: dict[str, str]
    shape: tuple[int, int]
    out_dtype: str
    dequantize: Callable[["QuantizedCheckpoint", "Module"], np.ndarray]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class QuantizedCheckpoint(Checkpoint):
    """A safetensors checkpoint whose quantized modules read as dequantized ``.weight`` tensors.

    Attributes
    ----------
    stored_ckpt : Checkpoint
        The safetensors checkpoint (local or streamed) as stored: packed parts and float tensors.
    method : str
        ``gptq``, ``awq``, ``compressed-tensors``, ``bitsandbytes`` or ``mlx``.
    description : str
        The quantization, in words (for its note ``quantized_weights``).
    modules : dict[str, Module]
        Exposed weight name -> its quantized module.
    """

    stored_ckpt: Checkpoint
    method: str
    description: str
    modules: dict[str, Module]
    location: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    # Activation and KV-cache quantization scales (``input_scale``, ``k_scale``, ...): not weights,
    # set aside (the weights note says how many).
    set_aside: frozenset[str] = frozenset()

    def __post_init__(self):
        self.location, self.config = self.stored_ckpt.location, self.stored_ckpt.config
        # the stored checkpoint's facts (a streamed hub model's ORG/NAME@commit), with the quantization noted first
        self.forward_facts(self.stored_ckpt, notes={WEIGHTS_NOTE: self._note(), **self.stored_ckpt.facts.notes})
        self._hidden = {p for m in self.modules.values() for p in m.parts.values()} | set(self.set_aside)

    @property
    def _read_lock(self):  # type: ignore[override]
        return self.stored_ckpt._read_lock

    @property
    def names(self) -> list[str]:
        return sorted({n for n in self.stored_ckpt.names if n not in self._hidden} | set(self.modules))

    def _note(self) -> str:
        aside = (
            f"; {len(self.set_aside)} activation / KV-cache quantization scales set aside (the bounds are of the "
            f"weights)"
            if self.set_aside
            else ""
        )
        return (
            f"quantized checkpoint ({self.description}; {len(self.modules)} tensors{aside}): the weights analysed "
            f"are the dequantized values its library computes with, so the bounds are of the quantized model"
        )

    def shape(self, name: str) -> tuple[int, ...]:
        return self.modules[name].shape if name in self.modules else self.stored_ckpt.shape(name)

    def dtype(self, name: str) -> str:
        return self.modules[name].out_dtype if name in self.modules else self.stored_ckpt.dtype(name)

    def where(self, name: str) -> str:
        if name in self.modules:
            first = next(iter(self.modules[name].parts.values()))
            return f"{self.stored_ckpt.where(first)} ({self.method} module {name.rsplit('.', 1)[0]!r})"
        return self.stored_ckpt.where(name)

    def files(self):
        return self.stored_ckpt.files()

    def _stored_in(self, name: str):
        return None if name in self.modules else self.stored_ckpt._stored_in(name)

    def check_size(self, name: str) -> int:
        """Each stored part fits in its file (the stored checkpoint's check); the float64 copy in memory."""
        if name not in self.modules:
            return self.stored_ckpt.check_size(name)
        for part in self.modules[name].parts.values():
            self.stored_ckpt.check_size(part)
        count = math.prod(self.modules[name].shape)
        return self.check_memory(name, count)

    reads_stored = True

    def stored(self, name: str) -> np.ndarray:
        return self.stored_ckpt.stored(name)

    def part(self, module: Module, role: str) -> np.ndarray:
        """A stored tensor of ``module`` in its own dtype."""
        return self.stored(module.parts[role])

    def floats(self, module: Module, role: str) -> np.ndarray:
        """A stored scale / bias of ``module`` as float64 (exactly its stored values)."""
        name = module.parts[role]
        return stored_floats(self.stored(name), self.stored_ckpt.dtype(name))

    def _raw(self, name: str) -> np.ndarray:
        if name not in self.modules:
            return self.stored_ckpt._raw(name)
        module = self.modules[name]
        try:
            with np.errstate(all="ignore"):  # an overflow is refused below, without numpy's warnings first
                out = module.dequantize(self, module)
        except ValueError as exc:
            raise SpecboundError(
                f"cannot dequantize {self.where(name)}: {exc}; the checkpoint is corrupt or "
                f"not what its quantization_config says: re-download or re-quantize it"
            ) from None
        if out.shape != module.shape:
            raise SpecboundError(
                f"cannot dequantize {self.where(name)}: it dequantizes to {out.shape}, not {module.shape}"
            )
        with np.errstate(all="ignore"):
            bad = int(np.count_nonzero(~np.isfinite(out))) if not np.isfinite(out.sum()) else 0
        if bad:
            raise SpecboundError(
                f"cannot dequantize {self.where(name)}: {bad} of its dequantized values are NaN/Inf "
                f"(a NaN stored value, or its scales times its integers overflowing "
                f"{module.out_dtype}); the checkpoint is corrupt: re-download or re-quantize it"
            )
        return out

    def _raw_part(self, name: str, index: int) -> np.ndarray | None:
        """An expert of a stored float bank read alone, as the stored checkpoint reads it; a quantized module whole."""
        return None if name in self.modules else self.stored_ckpt._raw_part(name, index)

    def close(self) -> None:
        self.stored_ckpt.close()


def _finite(q: QuantizedCheckpoint, m: Module, role: str, positive: bool = False) -> np.ndarray:
    """``q.floats(m, role)``, checked before anything is computed with it: every value finite (and
    positive when ``positive``), else a ValueError naming the tensor."""
    values = q.floats(m, role)
    with np.errstate(all="ignore"):
        bad = values.size == 0 or not np.isfinite(values.sum()) or (positive and not np.all(values > 0))
    if bad:
        found = (
            "no value"
            if values.size == 0
            else f"{int(np.count_nonzero(~np.isfinite(values)))} NaN/Inf and "
            f"{int(np.count_nonzero(values <= 0))} non-positive of {values.size} values"
        )
        raise ValueError(
            f"its {role} {m.parts[role]!r} holds {found}, expected finite{' positive' if positive else ''} numbers"
        )
    return values


def _refuse(where: str, what: str, reads: str) -> SpecboundError:
    return SpecboundError(
        f"{where}: {what} is not read by specbound (it reads {reads}); dequantize the model "
        f"and save it in float16/bfloat16/float32, or analyse the float model it came from"
    )


def maybe_quantized(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` itself, or wrapped in a :class:`QuantizedCheckpoint` when its config says its
    weights are quantized (module docstring)."""
    config = ckpt.config if isinstance(ckpt.config, dict) else {}
    qc = config.get("quantization_config")
    mlx = config.get("quantization")
    if qc is None and isinstance(mlx, dict) and "bits" in mlx:
        qc = {**mlx, "quant_method": "mlx"}
    if qc is None:
        return ckpt
    where = f"{ckpt.location} (config.json quantization_config)"
    if not isinstance(qc, dict):
        raise SpecboundError(f"{where} is a {type(qc).__name__}, not a JSON object; re-save the model")
    method = str(qc.get("quant_method", "")).lower()
    if method == "mlx" or (isinstance(mlx, dict) and "bits" in mlx and method in ("", "mlx")):
        qc = {**(mlx if isinstance(mlx, dict) else qc), "quant_method": "mlx"}
        method = "mlx"
    if method not in METHODS:
        raise _refuse(where, f"quant_method {qc.get('quant_method')!r}", ", ".join(METHODS))
    if not ckpt.reads_stored:
        raise SpecboundError(
            f"{where}: a {method} checkpoint is read from safetensors files; this one is "
            f"{type(ckpt).__name__}: save it with save_pretrained (safetensors)"
        )
    try:
        description, modules = METHODS[method].build(ckpt, qc, where)
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # a shape or setting of the wrong kind
        raise SpecboundError(
            f"{where}: its {method} tensors do not have the shapes and types its quantization "
            f"config implies ({type(exc).__name__}: {str(exc)[:200]}); the checkpoint is corrupt "
            f"or not what its quantization_config says"
        ) from None
    if not modules:  # a dequantized save that kept its quantization_config: float weights as stored
        return ckpt
    names = set(ckpt.names)
    for name, module in modules.items():  # a float weight and a quantized one for the same matrix
        if name in names and name not in module.parts.values():
            raise SpecboundError(
                f"{where}: {name!r} is stored twice, as the {ckpt.dtype(name)} tensor {name!r} and as "
                f"the {method} tensors {', '.join(repr(p) for p in module.parts.values())}; one of "
                f"them is left over from another save: keep one and re-save the model"
            )
    aside = frozenset(n for n in ckpt.names if _ACTIVATION_SCALE.search(n))
    return QuantizedCheckpoint(
        stored_ckpt=ckpt, method=method, description=description, modules=modules, set_aside=aside
    )


# Scales of activations and of the KV cache that quantized checkpoints store beside the weights
# (compressed-tensors W8A8, FP8 KV cache): read by an inference engine, not weights.
_ACTIVATION_SCALE = re.compile(
    r"\.(input_scale|input_zero_point|input_global_scale|output_scale|output_zero_point|"
    r"k_scale|v_scale|q_scale|kv_scale|activation_scale)$"
)


def _int(qc: dict, key: str, where: str, default: Any = None, allowed: tuple = ()) -> Any:
    value = qc.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int) or (allowed and value not in allowed):
        raise SpecboundError(
            f"{where}: {key} = {value!r}, expected "
            f"{'one of ' + ', '.join(map(str, allowed)) if allowed else 'an integer'}"
        )
    return value


def _modules_with(ckpt: Checkpoint, suffix: str) -> list[str]:
    return sorted(n[: -len(suffix)] for n in ckpt.names if n.endswith(suffix))


def _matrix(ckpt: Checkpoint, name: str, where: str) -> tuple[int, int]:
    shape = tuple(ckpt.shape(name))
    if len(shape) != 2:
        raise SpecboundError(
            f"{where}: tensor {name!r} has the shape {shape}, not a matrix; the checkpoint is "
            f"corrupt or not what its quantization_config says"
        )
    return shape


def _expect(ckpt: Checkpoint, name: str, shape: tuple[int, ...], dtypes: tuple[str, ...], where: str) -> None:
    found, dtype = tuple(ckpt.shape(name)), ckpt.dtype(name)
    if found != tuple(shape) or dtype not in dtypes:
        raise SpecboundError(
            f"{where}: tensor {name!r} is {dtype} {found}, expected {'/'.join(dtypes)} "
            f"{tuple(shape)}; the checkpoint is corrupt or not what its quantization_config says"
        )


_SCALES = ("F16", "BF16", "F32")


# ---------------------------------------------------------------------------------------------
# GPTQ


def _gptq(ckpt: Checkpoint, qc: dict, where: str):
    bits = _int(qc, "bits", where, allowed=(2, 3, 4, 8))
    group = _int(qc, "group_size", where, -1)
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse(where, f"GPTQ checkpoint_format {fmt!r}", "gptq and gptq_v2")
    writer = _gptq_writer(ckpt, qc)
    act_order = bool(qc.get("desc_act")) and group > 0
    v1 = None if fmt == "gptq_v2" else V1Zeros.of(writer or "AutoGPTQ", bits, act_order)
    names = set(ckpt.names)
    modules = {}
    for prefix in _modules_with(ckpt, ".qweight"):
        parts = {r: f"{prefix}.{r}" for r in ("qweight", "qzeros", "scales", "g_idx") if f"{prefix}.{r}" in names}
        if not {"qweight", "qzeros", "scales"} <= set(parts):
            raise SpecboundError(f"{where}: module {prefix!r} has a qweight but not its qzeros and scales")
        rows, out = _matrix(ckpt, parts["qweight"], where)
        _expect(ckpt, parts["qweight"], (rows, out), ("I32", "U32"), where)
        if rows * 32 % bits or out * bits % 32:
            raise SpecboundError(
                f"{where}: {parts['qweight']!r} has the shape {(rows, out)}: its {rows} rows are "
                f"not a whole number of {bits}-bit values or its {out} columns do not pack into "
                f"32-bit qzeros words"
            )
        n_in = rows * 32 // bits
        if "g_idx" in parts:
            _gptq_check_inputs(ckpt, parts, n_in, bits, group, where)
        groups = math.ceil(n_in / group) if group > 0 else 1
        _expect(ckpt, parts["scales"], (groups, out), _SCALES, where)  # before qzeros: a short scales is named
        _expect(ckpt, parts["qzeros"], (groups, out * bits // 32), ("I32", "U32"), where)
        modules[f"{prefix}.weight"] = Module(
            f"{prefix}.weight",
            parts,
            (out, n_in),
            ckpt.dtype(parts["scales"]),
            _dequantize_gptq,
            {"bits": bits, "group": group, "v1": v1},
        )
    act = " act-order" if qc.get("desc_act") else ""
    sym = "symmetric" if qc.get("sym", True) else "asymmetric"
    text = f"GPTQ {bits}-bit, group size {group}{act}, {sym}, {fmt}"
    if v1 is not None and qc.get("sym", True) is False:  # symmetric zero points are never 0: read alike
        text += f" (zero points read as {v1.words})"
        if writer is None and modules:
            text += _gptq_v1_ambiguity(ckpt, modules.values(), v1)
    return text, modules


def _gptq_check_inputs(ckpt: Checkpoint, parts: dict, n_in: int, bits: int, group: int, where: str) -> None:
    """``g_idx`` names one group per input; when its length fits the group count the scales imply
    but not the ``qweight``'s rows, the rows are what is wrong."""
    found = tuple(ckpt.shape(parts["g_idx"]))
    if len(found) == 1 and found[0] != n_in:
        scales = tuple(ckpt.shape(parts["scales"]))
        if group > 0 and len(scales) == 2 and math.ceil(found[0] / group) == scales[0]:
            raise SpecboundError(
                f"{where}: {parts['qweight']!r} has {n_in * bits // 32} rows, {n_in} {bits}-bit "
                f"inputs, where its g_idx and scales say {found[0]} inputs "
                f"({found[0] * bits // 32} rows); the checkpoint is corrupt"
            )
    _expect(ckpt, parts["g_idx"], (n_in,), ("I32", "I64"), where)


@dataclass(frozen=True)
class V1Zeros:
    """How a GPTQ v1 file's zero points are read back.  v1 stores ``z - 1`` and the two writers
    differ where ``z`` is 0:

    * AutoGPTQ's ``QuantLinear.pack`` (qlinear_cuda_old.py) casts ``z - 1 = -1`` to uint32 and ORs it
      in, so that field and every later one of its word become all ones; its dequantization adds 1
      to each field and masks it to ``bits`` (``qlinear_cuda_old`` at 2, 4 and 8 bits: 0), or does
      not mask (``qlinear_cuda``, the kernel of act-order models with groups, and both at 3 bits:
      ``2^bits``).
    * GPTQModel (``convert_gptq_v2_to_v1_format_module``, utils/model.py) subtracts ``0x11111111``
      (at 4 bits; ``0x55555555``, ``0x01010101`` at 2 and 8) from each packed word, borrowing across
      fields, and its loader adds it back with carries: the word sum gives every zero point exactly.
      At 3 bits it shifts each field by 1 modulo 8 (``_correct_gptq_v1_qzeros``).
    """

    writer: str
    bits: int
    words: str  # in words, for the weights note
    word_offset: int = 0  # added to each packed word (GPTQModel at 2, 4, 8 bits)
    masked: bool = True  # (field + 1) mod 2^bits, or field + 1

    @staticmethod
    def of(writer: str, bits: int, act_order: bool) -> "V1Zeros":
        if writer == "GPTQModel" and bits != 3:
            offset = sum(1 << (bits * k) for k in range(32 // bits))
            return V1Zeros(writer, bits, f"GPTQModel reads them: each packed word plus {offset:#010x}", offset)
        if writer == "GPTQModel":
            return V1Zeros(writer, bits, "GPTQModel reads them: each field plus 1 modulo 8")
        kernel = "qlinear_cuda" if act_order else "qlinear_cuda_old"
        masked = bits != 3 and not act_order
        return V1Zeros(
            writer,
            bits,
            f"AutoGPTQ's {kernel} reads them: each field plus 1{' modulo 2^bits' if masked else ''}",
            masked=masked,
        )

    def read(self, words: np.ndarray, count: int) -> np.ndarray:
        if self.word_offset:
            words = (np.asarray(words).astype("<u4").astype(np.uint64) + self.word_offset) & 0xFFFFFFFF
            return unpack_bits(words.astype(np.uint32), self.bits, count)
        zeros = unpack_bits(words, self.bits, count) + 1
        return zeros & ((1 << self.bits) - 1) if self.masked else zeros


def _gptq_writer(ckpt: Checkpoint, qc: dict) -> str | None:
    """``GPTQModel`` when the quantization config (config.json's, or quantize_config.json beside it)
    records GPTQModel as its quantizer (``meta.quantizer``, e.g. ``["gptqmodel:4.0.0"]``), else None:
    AutoGPTQ, optimum with AutoGPTQ, or a writer the config does not name."""
    configs = [qc]
    folder = Path(str(ckpt.location))  # a local folder (a streamed model's location is no local path)
    beside = (folder.parent if folder.is_file() else folder) / "quantize_config.json"
    if beside.is_file():
        configs.append(load_json(beside, "GPTQ quantize_config", "re-save the model"))
    for config in configs:
        meta = config.get("meta") if isinstance(config, dict) else None
        quantizer = meta.get("quantizer") if isinstance(meta, dict) else None
        for entry in quantizer if isinstance(quantizer, list) else [quantizer]:
            if isinstance(entry, str) and entry.strip().lower().startswith("gptqmodel"):
                return "GPTQModel"
    return None


def _gptq_v1_ambiguity(ckpt: Checkpoint, modules, v1: V1Zeros) -> str:
    """Words for the weights note when a v1 file whose writer the config does not name stores zero
    points of all ones (a zero point of 0, which the writers store, and their loaders read, apart)."""
    full = (1 << v1.bits) - 1
    count = total = 0
    for m in modules:
        fields = unpack_bits(ckpt.stored(m.parts["qzeros"]), v1.bits, m.shape[0])
        count += int(np.count_nonzero(fields == full))
        total += fields.size
    if not count:
        return ""
    read = 0 if v1.masked else 1 << v1.bits
    return (
        f"; {count} of its {total} zero points are stored as all ones (a zero point of 0 or {1 << v1.bits}) and "
        f"its config does not name the library that wrote it (no meta.quantizer): read as {read}, as AutoGPTQ "
        f"computes; a file written by GPTQModel stores a zero point of 0 with a borrow from the next field, and "
        f"its own loader would read those fields and their neighbours differently"
    )


def _dequantize_gptq(q: QuantizedCheckpoint, m: Module) -> np.ndarray:
    """GPTQ (``quant_method: gptq``; AutoGPTQ / GPTQModel / optimum, ``checkpoint_format`` ``gptq``
    or ``gptq_v2``): ``qweight`` int32 ``(in * bits / 32, out)`` and ``qzeros`` int32
    ``(groups, out * bits / 32)`` are little-endian bit streams along the packed axis (2, 4 and 8 bits
    word by word; 3 bits across word boundaries, 32 values in 3 words: AutoGPTQ's ``pack``);
    ``W[:, i] = scales[g_idx[i]] * (q[i] - z[g_idx[i]])``, rounded to the dtype of ``scales`` as
    AutoGPTQ computes it in that dtype; ``gptq_v2`` stores ``z``, ``gptq`` (v1) stores ``z - 1``, read
    back as its writer reads it (:class:`V1Zeros`: GPTQModel when the config's ``meta.quantizer``
    names it, else AutoGPTQ; the two differ where ``z`` is 0).  Without ``g_idx``, ``g_idx[i] = i //
    group_size``; with act-order (``desc_act``) ``g_idx`` is the stored permutation of groups.
    ``sym`` changes only the stored zeros."""
    bits, (out, n_in) = m.params["bits"], m.shape
    scales = _finite(q, m, "scales")  # (groups, out)
    weight = unpack_bits(q.part(m, "qweight").T, bits, n_in)  # (out, in)
    v1 = m.params["v1"]
    words = q.part(m, "qzeros")
    zeros = v1.read(words, out) if v1 else unpack_bits(words, bits, out)  # (groups, out)
    groups = scales.shape[0]
    if "g_idx" in m.parts:
        g_idx = q.part(m, "g_idx").astype(np.int64)
    else:
        group = m.params["group"]
        g_idx = np.arange(n_in) // group if group > 0 else np.zeros(n_in, dtype=np.int64)
    if g_idx.size and (g_idx.min() < 0 or g_idx.max() >= groups):
        raise ValueError(f"g_idx names groups {g_idx.min()}..{g_idx.max()} of {groups}")
    return round_to(scales[g_idx].T * (weight - zeros[g_idx].T), m.out_dtype)


# ---------------------------------------------------------------------------------------------
# AWQ

AWQ_REVERSE_ORDER = np.array([0, 4, 1, 5, 2, 6, 3, 7])


def _awq(ckpt: Checkpoint, qc: dict, where: str):
    bits = _int(qc, "bits", where, qc.get("w_bit"), allowed=(4,))
    group = _int(qc, "group_size", where, qc.get("q_group_size"))
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse(where, f"AWQ version {version!r}", "the GEMM packing, version 'gemm'")
    if qc.get("zero_point", True) is False:
        raise _refuse(where, "AWQ without zero points (zero_point: false)", "AWQ with zero points")
    names = set(ckpt.names)
    modules = {}
    for prefix in _modules_with(ckpt, ".qweight"):
        parts = {r: f"{prefix}.{r}" for r in ("qweight", "qzeros", "scales") if f"{prefix}.{r}" in names}
        if len(parts) != 3:
            raise SpecboundError(f"{where}: module {prefix!r} has a qweight but not its qzeros and scales")
        n_in, packed = _matrix(ckpt, parts["qweight"], where)
        out = packed * 32 // bits
        if group <= 0 or n_in % group:
            raise SpecboundError(f"{where}: {n_in} input rows of {prefix!r} are not whole groups of {group}")
        _expect(ckpt, parts["qweight"], (n_in, packed), ("I32", "U32"), where)
        _expect(ckpt, parts["qzeros"], (n_in // group, packed), ("I32", "U32"), where)
        _expect(ckpt, parts["scales"], (n_in // group, out), _SCALES, where)
        modules[f"{prefix}.weight"] = Module(
            f"{prefix}.weight",
            parts,
            (out, n_in),
            ckpt.dtype(parts["scales"]),
            _dequantize_awq,
            {"bits": bits, "group": group},
        )
    return f"AWQ {bits}-bit GEMM, group size {group}", modules


def _awq_unpack(words: np.ndarray, bits: int) -> np.ndarray:
    values = unpack_bits(words, bits, words.shape[-1] * 32 // bits)
    per = 32 // bits
    order = (np.arange(values.shape[-1]).reshape(-1, per)[:, AWQ_REVERSE_ORDER]).reshape(-1)
    return values[:, order]


def _dequantize_awq(q: QuantizedCheckpoint, m: Module) -> np.ndarray:
    """AWQ (``quant_method: awq``, ``version: gemm``; AutoAWQ): ``qweight`` int32 ``(in, out / 8)``,
    ``qzeros`` int32 ``(groups, out / 8)``, each word holding 8 columns in AutoAWQ's order
    ``[0, 2, 4, 6, 1, 3, 5, 7]``; ``W = (q - z) * scales``, groups of ``group_size`` input rows,
    rounded to the dtype of ``scales`` (``awq.utils.packing_utils.dequantize_gemm``)."""
    bits, group = m.params["bits"], m.params["group"]
    weight = _awq_unpack(q.part(m, "qweight"), bits)  # (in, out)
    zeros = np.repeat(_awq_unpack(q.part(m, "qzeros"), bits), group, axis=0)
    scales = np.repeat(_finite(q, m, "scales"), group, axis=0)
    return round_to((weight - zeros) * scales, m.out_dtype).T


# ---------------------------------------------------------------------------------------------
# compressed-tensors

CT_FORMATS = ("float-quantized", "int-quantized", "naive-quantized", "pack-quantized", "nvfp4-pack-quantized")
CT_STRATEGIES = ("tensor", "channel", "group", "tensor_group", "block")


def _ct_scheme(qc: dict, module: str, where: str) -> dict:
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise SpecboundError(
            f"{where}: config_groups is a {type(groups).__name__}, expected a JSON object of named "
            f"groups (each with targets and weights); re-save the model with llm-compressor"
        )
    for name, group in groups.items():
        if not isinstance(group, dict):
            continue
        targets = group.get("targets") or []
        for target in targets if isinstance(targets, list) else [targets]:
            if not isinstance(target, str):
                raise SpecboundError(
                    f"{where}: config group {name!r} has the target {target!r}, expected a module "
                    f"name, a class name (Linear) or 're:<pattern>'"
                )
            if (
                target == "Linear"
                or target == module
                or (target.startswith("re:") and _ct_match(target[3:], module, name, where))
            ):
                weights = group.get("weights")
                if not isinstance(weights, dict):
                    raise SpecboundError(
                        f"{where}: config group {name!r} quantizes no weights but {module!r} is stored quantized"
                    )
                return {**weights, "_format": group.get("format")}
    raise SpecboundError(
        f"{where}: no config group's targets name the quantized module {module!r} (targets of "
        f"module classes other than Linear are not resolved); the config and weights disagree"
    )


def _ct_match(pattern: str, module: str, group: str, where: str) -> bool:
    """compressed-tensors' ``re:`` target (``re.match``), by the bounded matcher (io/patterns.py)."""
    try:
        return bounded_search(compile_pattern(pattern), module, anchored=True)
    except ValueError as exc:
        raise SpecboundError(f"{where}: config group {group!r}'s target 're:' {exc}") from None


def _compressed(ckpt: Checkpoint, qc: dict, where: str):
    fmt_all = str(qc.get("format", "dense"))
    if fmt_all not in (*CT_FORMATS, "dense", "mixed-precision"):
        raise _refuse(where, f"compressed-tensors format {fmt_all!r}", ", ".join(CT_FORMATS))
    names = set(ckpt.names)
    prefixes = sorted(set(_modules_with(ckpt, ".weight_scale")))
    modules = {}
    kinds = set()
    for prefix in prefixes:
        scheme = _ct_scheme(qc, prefix, where)
        fmt = str(scheme.pop("_format") or fmt_all)
        if fmt == "dense":
            continue
        if fmt not in CT_FORMATS:
            raise _refuse(where, f"compressed-tensors format {fmt!r}", ", ".join(CT_FORMATS))
        strategy = str(scheme.get("strategy", "tensor"))
        if strategy not in CT_STRATEGIES:
            raise _refuse(where, f"compressed-tensors weight strategy {strategy!r}", ", ".join(CT_STRATEGIES))
        bits = _int(scheme, "num_bits", where)
        kind = str(scheme.get("type", "int"))
        parts = {
            r: f"{prefix}.{r}"
            for r in (
                "weight",
                "weight_packed",
                "weight_shape",
                "weight_scale",
                "weight_zero_point",
                "weight_global_scale",
                "weight_g_idx",
            )
            if f"{prefix}.{r}" in names
        }
        if fmt in ("pack-quantized", "nvfp4-pack-quantized"):
            parts.pop("weight", None)  # the packed weight is the matrix: a "weight" beside it is refused as a second
        scale_code = ckpt.dtype(parts["weight_scale"])
        if fmt == "pack-quantized":
            if "weight_packed" not in parts or "weight_shape" not in parts or kind != "int" or not 1 <= bits <= 8:
                raise SpecboundError(
                    f"{where}: pack-quantized module {prefix!r} needs weight_packed, weight_shape and "
                    f"int 1-8 bit weights"
                )
            shape_values = ckpt.stored(parts["weight_shape"]).reshape(-1)
            if shape_values.size != 2 or shape_values.min() < 0 or shape_values.max() > 2**40:
                raise SpecboundError(f"{where}: {parts['weight_shape']!r} holds {shape_values[:4]}, not (out, in)")
            shape = (int(shape_values[0]), int(shape_values[1]))
            _expect(ckpt, parts["weight_packed"], (shape[0], math.ceil(shape[1] * bits / 32)), ("I32",), where)
            out_code = scale_code
        elif fmt == "nvfp4-pack-quantized":
            if "weight_packed" not in parts or kind != "float" or bits != 4:
                raise SpecboundError(f"{where}: nvfp4 module {prefix!r} needs a uint8 weight_packed of FP4 values")
            rows, half = _matrix(ckpt, parts["weight_packed"], where)
            shape = (rows, 2 * half)
            _expect(ckpt, parts["weight_packed"], (rows, half), ("U8",), where)
            out_code = "BF16"
        else:
            if "weight" not in parts:
                raise SpecboundError(f"{where}: {fmt} module {prefix!r} has a weight_scale but no weight")
            shape = tuple(ckpt.shape(parts["weight"]))
            want = ("F8_E4M3",) if kind == "float" and bits == 8 else ("I8",) if kind == "int" and bits <= 8 else ()
            if not want:
                raise _refuse(
                    where,
                    f"compressed-tensors {kind} {bits}-bit weights in format {fmt!r}",
                    "FP8 E4M3 float-quantized and int8 int-quantized weights",
                )
            if len(shape) != 2:
                raise SpecboundError(f"{where}: {parts['weight']!r} has the shape {shape}, not (out, in)")
            _expect(ckpt, parts["weight"], shape, want, where)
            out_code = scale_code
        if scale_code not in (*_SCALES, "F8_E4M3"):
            raise SpecboundError(f"{where}: {parts['weight_scale']!r} is stored as {scale_code}")
        params = {
            "bits": bits,
            "strategy": strategy,
            "group": scheme.get("group_size"),
            "block": scheme.get("block_structure"),
            "symmetric": scheme.get("symmetric", True),
            "fmt": fmt,
            "scale_code": scale_code,
        }
        _ct_check_scale(ckpt, parts, shape, params, where)
        modules[f"{prefix}.weight"] = Module(f"{prefix}.weight", parts, shape, out_code, _dequantize_ct, params)
        kinds.add(f"{fmt} {kind}{bits} {strategy}")
    return f"compressed-tensors {', '.join(sorted(kinds))}", modules


def _ct_scale_shape(shape: tuple[int, int], p: dict, where: str) -> tuple[int, ...]:
    out, n_in = shape
    if p["strategy"] == "tensor":
        return (1,)
    if p["strategy"] == "channel":
        return (out, 1)
    if p["strategy"] in ("group", "tensor_group"):
        group = p["group"]
        if not isinstance(group, int) or group <= 0 or n_in % group:
            raise SpecboundError(f"{where}: group_size {group!r} does not divide the {n_in} input columns")
        return (out, n_in // group)
    block = p["block"]
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise SpecboundError(f"{where}: block_structure {block!r} is not [rows, columns]")
    return (math.ceil(out / block[0]), math.ceil(n_in / block[1]))


def _ct_check_scale(ckpt: Checkpoint, parts: dict, shape: tuple, p: dict, where: str) -> None:
    want = _ct_scale_shape(shape, p, where)
    found = tuple(ckpt.shape(parts["weight_scale"]))
    if math.prod(found) != math.prod(want) or (len(want) > 1 and found not in (want, want[:1])):
        raise SpecboundError(
            f"{where}: {parts['weight_scale']!r} has the shape {found}, not the {want} of "
            f"{p['strategy']} scales for a {shape} weight"
        )
    if "weight_zero_point" in parts and not p["symmetric"]:
        zp = tuple(ckpt.shape(parts["weight_zero_point"]))
        if p["fmt"] == "pack-quantized" and p["strategy"] in ("group", "channel"):
            rows = math.ceil(shape[0] * p["bits"] / 32)
            if zp != (rows, want[1]):
                raise SpecboundError(
                    f"{where}: {parts['weight_zero_point']!r} has the shape {zp}, not {(rows, want[1])}"
                )
        elif math.prod(zp) != math.prod(want):
            raise SpecboundError(f"{where}: {parts['weight_zero_point']!r} has the shape {zp}, not {want}")


def _expand(values: np.ndarray, shape: tuple[int, int], p: dict, g_idx: np.ndarray | None = None) -> np.ndarray:
    """Per-tensor / channel / group / block values broadcast to the weight's ``(out, in)``; with
    activation ordering (``weight_g_idx``, compressed-tensors before 0.10) column ``j`` takes group
    ``g_idx[j]``, as its ``_process_quantization`` permutes the columns into groups and back."""
    out, n_in = shape
    want = _ct_scale_shape(shape, p, "")
    values = values.reshape(want)
    if p["strategy"] == "tensor":
        return np.broadcast_to(values.reshape(()), shape)
    if p["strategy"] == "channel":
        return np.broadcast_to(values, shape)
    if p["strategy"] in ("group", "tensor_group"):
        if g_idx is not None:
            if g_idx.shape != (n_in,) or g_idx.min(initial=0) < 0 or g_idx.max(initial=0) >= values.shape[1]:
                raise ValueError(
                    f"weight_g_idx of shape {g_idx.shape} does not name one of the {values.shape[1]} "
                    f"groups for each of the {n_in} columns"
                )
            return values[:, g_idx]
        return np.repeat(values, p["group"], axis=1)
    rows, cols = p["block"]
    return np.repeat(np.repeat(values, rows, axis=0), cols, axis=1)[:out, :n_in]


def _dequantize_ct(q: QuantizedCheckpoint, m: Module) -> np.ndarray:
    """compressed-tensors (``quant_method: compressed-tensors``): ``float-quantized`` (FP8 E4M3
    ``weight``), ``int-quantized`` / ``naive-quantized`` (int8 ``weight``), ``pack-quantized`` (int32
    ``weight_packed``, 1-8 bits stored as ``q + 2^(bits-1)`` in a dense bit stream per row, and a
    packed ``weight_zero_point`` when asymmetric) and ``nvfp4-pack-quantized`` (two FP4 E2M1 values a
    byte, the low nibble first, FP8 ``weight_scale`` per 16 values divided by ``weight_global_scale``);
    strategies ``tensor``, ``channel``, ``group``, ``tensor_group`` and ``block``; the library's
    ``(q - zero_point) * scale`` in the dtype of the scale (``dequantize``).  The config group
    applying to a module is the first whose ``targets`` match it (``Linear``, a name, or ``re:``)."""
    p, shape = m.params, m.shape
    if p["fmt"] == "nvfp4-pack-quantized":
        packed = q.part(m, "weight_packed").astype(np.int64)
        codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(shape)
        values = E2M1[codes].astype(np.float32)
        scale = _finite(q, m, "weight_scale").astype(np.float32)  # FP8 -> bfloat16 exactly
        if "weight_global_scale" in m.parts:
            global_scale = _finite(q, m, "weight_global_scale", positive=True).astype(np.float32).reshape(-1)
            if global_scale.size != 1:
                raise ValueError(f"its weight_global_scale holds {global_scale.size} values, expected one")
            scale = scale / global_scale[0]
        return round_to(values * _expand(scale, shape, p), "BF16")
    if p["fmt"] == "pack-quantized":
        offset = 1 << (p["bits"] - 1)
        x = unpack_bits(q.part(m, "weight_packed"), p["bits"], shape[1]) - offset
    elif q.stored_ckpt.dtype(m.parts["weight"]) == "F8_E4M3":
        x = E4M3[q.part(m, "weight").astype(np.int64)]
    else:
        x = q.part(m, "weight").astype(np.int64)
    g_idx = (
        q.part(m, "weight_g_idx").astype(np.int64) if "weight_g_idx" in m.parts and p["strategy"] == "group" else None
    )
    scale = _finite(q, m, "weight_scale")
    if p["scale_code"] == "F8_E4M3":
        scale = round_to(scale, "BF16")
    zero = 0
    if "weight_zero_point" in m.parts and not p["symmetric"]:
        zp = q.part(m, "weight_zero_point")
        if p["fmt"] == "pack-quantized" and p["strategy"] in ("group", "channel"):
            want = _ct_scale_shape(shape, p, "")
            zp = unpack_bits(zp.T, p["bits"], shape[0]).T - (1 << (p["bits"] - 1))
            zp = zp.reshape(shape[0], want[1])
        zero = _expand(zp.astype(np.float64), shape, p, g_idx)
    out = (x - zero) * _expand(scale, shape, p, g_idx)
    return round_to(out, m.out_dtype if m.out_dtype != "F8_E4M3" else "BF16")


# ---------------------------------------------------------------------------------------------
# transformers' fine-grained FP8 (DeepSeek-V3, Qwen3-FP8)


def _fp8(ckpt: Checkpoint, qc: dict, where: str):
    block = qc.get("weight_block_size")
    if block is not None and not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise SpecboundError(f"{where}: weight_block_size = {block!r}, expected [rows, columns] or null")
    modules = {}
    for prefix in _modules_with(ckpt, ".weight_scale_inv"):
        parts = {"weight": f"{prefix}.weight", "scale": f"{prefix}.weight_scale_inv"}
        if parts["weight"] not in set(ckpt.names):
            raise SpecboundError(f"{where}: {parts['scale']!r} has no weight beside it")
        if ckpt.dtype(parts["weight"]) != "F8_E4M3":
            raise _refuse(
                where,
                f"fine-grained FP8 weights stored as {ckpt.dtype(parts['weight'])} ({prefix!r}: MXFP4 experts)",
                "FP8 E4M3 weights",
            )
        out, n_in = _matrix(ckpt, parts["weight"], where)
        rows, cols = (math.ceil(out / block[0]), math.ceil(n_in / block[1])) if block else (1, 1)
        found = tuple(ckpt.shape(parts["scale"]))
        if math.prod(found) != rows * cols or ckpt.dtype(parts["scale"]) not in ("F32", "BF16", "F16", "U8", "F8_E8M0"):
            raise SpecboundError(
                f"{where}: {parts['scale']!r} is {ckpt.dtype(parts['scale'])} {found}, not the "
                f"{(rows, cols)} float scales of {block or 'one tensor'} blocks"
            )
        modules[f"{prefix}.weight"] = Module(
            f"{prefix}.weight", parts, (out, n_in), "F32", _dequantize_fp8, {"grid": (rows, cols)}
        )
    return f"fine-grained FP8 E4M3, blocks {block or 'per tensor'}", modules


def _dequantize_fp8(q: QuantizedCheckpoint, m: Module) -> np.ndarray:
    """Fine-grained FP8 (``quant_method: fp8``; transformers' layout of DeepSeek-V3, Qwen3-FP8): E4M3
    ``weight`` times its ``weight_block_size`` block's ``weight_scale_inv`` (one per tensor without
    blocks; an E8M0 byte scale is ``2^(b - 127)``), in float32 (``Fp8Dequantize``)."""
    out, n_in = m.shape
    rows, cols = m.params["grid"]
    code = q.stored_ckpt.dtype(m.parts["scale"])
    stored = q.part(m, "scale")
    scale = (np.exp2(stored.astype(np.float64) - 127) if code in ("U8", "F8_E8M0") else _finite(q, m, "scale")).reshape(
        rows, cols
    )
    block_r, block_c = math.ceil(out / rows), math.ceil(n_in / cols)
    expanded = np.repeat(np.repeat(scale, block_r, axis=0), block_c, axis=1)[:out, :n_in]
    return round_to(E4M3[q.part(m, "weight").astype(np.int64)] * expanded, "F32")


# ---------------------------------------------------------------------------------------------
# bitsandbytes


def _bnb(ckpt: Checkpoint, qc: dict, where: str):
    names = set(ckpt.names)
    modules = {}
    kinds = set()
    for state in sorted(n for n in names if ".weight.quant_state.bitsandbytes__" in n):
        prefix, quant = state.split(".weight.quant_state.bitsandbytes__")
        if quant not in ("nf4", "fp4"):
            raise _refuse(where, f"bitsandbytes quant_type {quant!r}", "nf4 and fp4")
        raw = ckpt.stored(state)
        if raw.dtype != np.uint8 or raw.size > 1 << 16:
            raise SpecboundError(f"{where}: {state!r} is not the packed quant_state (uint8 JSON bytes)")
        info = decode_json(
            raw.tobytes(),
            f"the bitsandbytes quant_state {state!r} of {ckpt.location}",
            "re-save the model with save_pretrained",
        )
        if not isinstance(info, dict):
            raise SpecboundError(f"{where}: {state!r} holds no JSON object")
        shape = info.get("shape")
        block = info.get("blocksize")
        dtype = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}.get(str(info.get("dtype")))
        if not (
            isinstance(shape, list)
            and len(shape) == 2
            and all(isinstance(d, int) and d > 0 for d in shape)
            and isinstance(block, int)
            and block > 0
            and dtype
        ):
            raise SpecboundError(
                f"{where}: {state!r} says shape {shape!r}, blocksize {block!r}, dtype "
                f"{info.get('dtype')!r}: expected (out, in), a positive block size and a float type"
            )
        n = math.prod(shape)
        parts = {
            "weight": f"{prefix}.weight",
            "absmax": f"{prefix}.weight.absmax",
            "quant_map": f"{prefix}.weight.quant_map",
            "state": state,
        }
        nested = f"{prefix}.weight.nested_absmax" in names
        if nested:
            parts.update(
                nested_absmax=f"{prefix}.weight.nested_absmax", nested_quant_map=f"{prefix}.weight.nested_quant_map"
            )
        if not all(v in names for v in parts.values()):
            raise SpecboundError(
                f"{where}: the 4-bit module {prefix!r} lacks {[v for v in parts.values() if v not in names]}"
            )
        storage = ckpt.dtype(parts["weight"])  # bnb_4bit_quant_storage: the packed bytes in words of another type
        size = {"U8": 1, "I8": 1, "F16": 2, "BF16": 2, "F32": 4}.get(storage)
        if size is None:
            raise _refuse(
                where,
                f"4-bit weights stored as {storage} ({parts['weight']!r})",
                "bnb_4bit_quant_storage uint8, int8, float16, bfloat16 or float32",
            )
        _expect(ckpt, parts["weight"], (math.ceil(math.ceil(n / 2) / size), 1), (storage,), where)
        blocks = math.ceil(n / block)
        _expect(ckpt, parts["quant_map"], (16,), ("F32",), where)
        if nested:
            nb = info.get("nested_blocksize")
            offset = info.get("nested_offset")
            if not isinstance(nb, int) or nb <= 0 or not isinstance(offset, (int, float)) or not abs(offset) < 3.4e38:
                raise SpecboundError(
                    f"{where}: {state!r} has no nested_blocksize / nested_offset (a float32 number): "
                    f"{nb!r:.40} / {offset!r:.40}"
                )
            _expect(ckpt, parts["absmax"], (blocks,), ("U8",), where)
            _expect(ckpt, parts["nested_absmax"], (math.ceil(blocks / nb),), ("F32",), where)
            _expect(ckpt, parts["nested_quant_map"], (256,), ("F32",), where)
        else:
            _expect(ckpt, parts["absmax"], (blocks,), ("F32",), where)
        modules[f"{prefix}.weight"] = Module(
            f"{prefix}.weight",
            parts,
            tuple(shape),
            dtype,
            _dequantize_bnb4,
            {"block": block, "nested": nested, "info": info},
        )
        kinds.add(f"{quant.upper()}{' nested' if nested else ''} blocksize {block}")
    for scb in sorted(n for n in names if n.endswith(".SCB")):
        prefix = scb[:-4]
        if f"{prefix}.weight" not in names or ckpt.dtype(f"{prefix}.weight") != "I8":
            continue
        shape = tuple(ckpt.shape(f"{prefix}.weight"))
        if len(shape) != 2:
            raise SpecboundError(f"{where}: {prefix}.weight has the shape {shape}, not (out, in)")
        _expect(ckpt, scb, (shape[0],), ("F32",), where)
        parts = {"weight": f"{prefix}.weight", "SCB": scb}
        if f"{prefix}.weight_format" in names:
            parts["weight_format"] = f"{prefix}.weight_format"
        modules[f"{prefix}.weight"] = Module(f"{prefix}.weight", parts, shape, "F32", _dequantize_int8)
        kinds.add("LLM.int8")
    return f"bitsandbytes {', '.join(sorted(kinds))}", modules


def _dequantize_bnb4(q: QuantizedCheckpoint, m: Module) -> np.ndarray:
    """bitsandbytes (``quant_method: bitsandbytes``): 4-bit NF4/FP4 ``weight`` (uint8, two codes a
    byte, the high nibble first; with ``bnb_4bit_quant_storage`` another type holds the same bytes) with
    ``absmax`` per ``blocksize`` values, the code table
    ``quant_map`` and the packed ``quant_state`` (its JSON: dtype, shape, blocksize); with nested
    quantization ``absmax`` is itself 8-bit, ``nested_quant_map[absmax] * nested_absmax +
    nested_offset``; ``quant_map[code] * absmax`` in float32, cast to the state's dtype
    (``dequantize_4bit``)."""
    block, n = m.params["block"], math.prod(m.shape)
    stored = np.ascontiguousarray(q.part(m, "weight"))
    packed = stored.astype(stored.dtype.newbyteorder("<")).view(np.uint8).reshape(-1).astype(np.int64)
    codes = np.stack([packed >> 4, packed & 0xF], axis=-1).reshape(-1)[:n]
    table = _finite(q, m, "quant_map").astype(np.float32)
    if m.params["nested"]:
        info = m.params["info"]
        nb = info["nested_blocksize"]
        inner = _finite(q, m, "nested_quant_map").astype(np.float32)[q.part(m, "absmax").astype(np.int64)]
        scale2 = np.repeat(_finite(q, m, "nested_absmax").astype(np.float32), nb)[: inner.size]
        absmax = inner * scale2 + np.float32(info["nested_offset"])
    else:
        absmax = _finite(q, m, "absmax").astype(np.float32)
    values = table[codes] * np.repeat(absmax, block)[:n]
    return round_to(values, m.out_dtype).reshape(m.shape)


def _dequantize_int8(q: QuantizedCheckpoint, m: Module) -> np.ndarray:
    """bitsandbytes' LLM.int8: int8 ``weight`` and ``SCB``, ``weight * SCB / 127`` in float32
    (``int8_vectorwise_dequant``)."""
    if "weight_format" in m.parts:
        fmt = q.part(m, "weight_format").reshape(-1)
        if fmt.size and int(fmt[0]) != 0:
            raise ValueError(f"LLM.int8 weight_format {int(fmt[0])} (only 0, row-major, is read)")
    weight = q.part(m, "weight").astype(np.float32)
    scb = _finite(q, m, "SCB").astype(np.float32)
    return ((weight * scb[:, None]) * np.float32(7.874015718698502e-3)).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# MLX


MLX_BITS = (1, 2, 3, 4, 5, 6, 8)  # mx.quantize's widths (mlx 0.32)


def _mlx(ckpt: Checkpoint, qc: dict, where: str):
    default_bits, default_group = qc.get("bits"), qc.get("group_size")
    mode = str(qc.get("mode", "affine"))
    if mode != "affine":
        raise _refuse(where, f"MLX quantization mode {mode!r}", "affine")
    names = set(ckpt.names)
    modules = {}
    kinds = set()
    for prefix in _modules_with(ckpt, ".scales"):
        if f"{prefix}.weight" not in names or ckpt.dtype(f"{prefix}.weight") != "U32":
            continue
        override = qc.get(prefix)
        if override is False:
            continue
        local = {
            **({"bits": default_bits, "group_size": default_group}),
            **(override if isinstance(override, dict) else {}),
        }
        if str(local.get("mode", "affine")) != "affine":
            raise _refuse(where, f"MLX quantization mode {local.get('mode')!r} of {prefix!r}", "affine")
        bits = _int(local, "bits", where, allowed=MLX_BITS)
        group = _int(local, "group_size", where)
        if group <= 0:
            raise SpecboundError(
                f"{where}: group_size = {group} (for {prefix!r}), expected a positive number of "
                f"values per scale (mlx-lm writes 32, 64 or 128)"
            )
        parts = {"weight": f"{prefix}.weight", "scales": f"{prefix}.scales", "biases": f"{prefix}.biases"}
        if parts["biases"] not in names:
            raise SpecboundError(f"{where}: MLX module {prefix!r} has scales but no biases")
        shape = tuple(ckpt.shape(parts["weight"]))
        if len(shape) != 2:
            raise SpecboundError(f"{where}: MLX weight {prefix}.weight has the shape {shape}, not (out, packed in)")
        n_in = shape[1] * 32 // bits
        if n_in % group:
            raise SpecboundError(f"{where}: {n_in} inputs of {prefix!r} are not whole groups of {group}")
        _expect(ckpt, parts["scales"], (shape[0], n_in // group), _SCALES, where)
        _expect(ckpt, parts["biases"], (shape[0], n_in // group), (ckpt.dtype(parts["scales"]),), where)
        modules[f"{prefix}.weight"] = Module(
            f"{prefix}.weight",
            parts,
            (shape[0], n_in),
            ckpt.dtype(parts["scales"]),
            _dequantize_mlx,
            {"bits": bits, "group": group},
        )
        kinds.add(f"{bits}-bit group {group}")
    return f"MLX affine {', '.join(sorted(kinds))}", modules


def _dequantize_mlx(q: QuantizedCheckpoint, m: Module) -> np.ndarray:
    """MLX (``quantization: {group_size, bits}`` of mlx-lm, with per-module overrides): ``weight``
    uint32 ``(out, in * bits / 32)``, a little-endian bit stream per row, ``scales`` and ``biases``
    per ``group_size`` values (1-8 bits but 7): ``scales * q + biases`` in the dtype of ``scales``
    (the product rounded, then the sum: ``mx.dequantize``).
    MLX's tensor names are the Hugging Face ones for the models mlx-lm converts."""
    bits, group = m.params["bits"], m.params["group"]
    values = unpack_bits(q.part(m, "weight"), bits, m.shape[1])
    scales = np.repeat(_finite(q, m, "scales"), group, axis=1)
    biases = np.repeat(_finite(q, m, "biases"), group, axis=1)
    # mx.dequantize computes in the dtype of the scales: the product rounded, then the sum
    return round_to(round_to(scales * values, m.out_dtype) + biases, m.out_dtype)


# ---------------------------------------------------------------------------------------------
# the methods read: one row each (``quant_method`` -> how its modules are found and dequantized)


@dataclass(frozen=True)
class QuantMethod:
    name: str
    build: Callable[[Checkpoint, dict, str], tuple[str, dict[str, Module]]]


METHODS = {
    m.name: m
    for m in (
        QuantMethod("gptq", _gptq),
        QuantMethod("awq", _awq),
        QuantMethod("compressed-tensors", _compressed),
        QuantMethod("fp8", _fp8),
        QuantMethod("bitsandbytes", _bnb),
        QuantMethod("mlx", _mlx),
    )
}
QUANT_METHODS = tuple(METHODS)
