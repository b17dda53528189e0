"""bitsandbytes saves decoded from their published layout, independently of specbound's reader and of
bitsandbytes' own (CPU-dependent) kernels, and the format's error bound against the float weights.

The layout (bitsandbytes' ``QuantState.as_dict(packed=True)`` as transformers saves it): a 4-bit
``<m>.weight`` holds the codes two a byte, the first value in the high nibble, the bytes in whatever
words ``bnb_4bit_quant_storage`` names (the bytes are what counts); ``<m>.weight.absmax`` one scale per
``blocksize`` values of the row-major flattened matrix, float32, or with nested statistics
(``bnb_4bit_use_double_quant``) an 8-bit index into ``nested_quant_map`` (the 8-bit dynamic map),
scaled by ``nested_absmax`` per ``nested_blocksize`` scales, plus ``nested_offset`` (the mean of the
absmax that was subtracted before quantizing them); ``quant_map`` the 16-value code book (NF4 of
QLoRA, or bitsandbytes' FP4 E2M1 in bit-pattern order); the packed ``quant_state`` JSON gives
dtype, shape and block sizes.  A value is ``code[nibble] * absmax`` in float32, rounded to the
state's dtype.  LLM.int8: int8 ``weight`` and float32 ``SCB`` (the row's absmax), ``q * SCB / 127``.

Every decode here is integer unpacking, table lookups and single float32 products and sums, each
correctly rounded by IEEE 754, so it is bit-exact on any CPU.  Run as a script, this module is the
reproduction of bitsandbytes' CPU ``dequantize_4bit`` disagreeing with its own round trip (see
docs/development.md, "CPU-independent tests"):

    python tests/support/bnb_layout.py
"""

import json
import math
import platform
import struct
from pathlib import Path

import numpy as np

# QLoRA's NormalFloat4 (Dettmers et al. 2023, appendix E), the float32 values bitsandbytes ships.
NF4 = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)
# FP4 E2M1 without infinities or NaN (sign, 2 exponent bits with bias 2, 1 mantissa bit), nibbles 0-7
# positive and 8-15 their negatives, normalized by the largest magnitude (12).
FP4 = (
    np.array([0, 0.0625, 8, 12, 4, 6, 2, 3], dtype=np.float32)[np.arange(16) % 8]
    * np.where(np.arange(16) < 8, 1, -1).astype(np.float32)
) / np.float32(12)
CODE_BOOKS = {"nf4": NF4, "fp4": FP4}
ROUNDING = 2.0**-20  # slack for a quantizer's float32 normalization (a few ulps of 2^-24, times 16)


def safetensors_bytes(path: Path) -> dict:
    """name -> (dtype string, shape, raw little-endian bytes) of every tensor in a safetensors file,
    read from its header (8-byte length, JSON) and byte buffer without any tensor library."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = data[8 + length :]
    return {
        name: (entry["dtype"], tuple(entry["shape"]), body[entry["data_offsets"][0] : entry["data_offsets"][1]])
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _f32(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def dynamic_map() -> np.ndarray:
    """bitsandbytes' signed 8-bit dynamic map (Dettmers 2016, "8-bit approximations", its
    ``create_dynamic_map(signed=True)``): for exponent ``e = 0..6`` the midpoints of ``2^e + 1``
    evenly spaced points on [0.1, 1], times ``10^(e - 6)``, with both signs; then 0 and 1, sorted."""
    values = [0.0, 1.0]
    for e in range(7):
        edges = np.linspace(0.1, 1.0, 2**e + 1)
        means = (edges[:-1] + edges[1:]) / 2 * 10.0 ** (e - 6)
        values += list(means) + list(-means)
    return np.sort(np.array(values, dtype=np.float32))


def max_half_gap(code: np.ndarray) -> float:
    """The largest distance from a point of [-1, 1] to its nearest value of ``code`` (float64)."""
    c = np.sort(code.astype(np.float64))
    return float(max(np.max(np.diff(c)) / 2, c[0] + 1, 1 - c[-1]))


def _round_to_dtype(values32: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``values32`` rounded to nearest-even in ``dtype`` (float16, bfloat16, float32), as float64."""
    if dtype == "float16":
        return values32.astype(np.float16).astype(np.float64)
    if dtype == "float32":
        return values32.astype(np.float64)
    if dtype == "bfloat16":
        bits = values32.view(np.uint32).astype(np.uint64)
        lsb = (bits >> np.uint64(16)) & np.uint64(1)
        kept = ((bits + np.uint64(0x7FFF) + lsb) >> np.uint64(16)) << np.uint64(16)
        return kept.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"quant_state dtype {dtype!r}")


class Decoded:
    """One 4-bit weight decoded: ``values`` (float64, the matrix), ``absmax`` (float32 per block, as
    decoded), ``absmax_error`` (float64 per block: how far the nested statistics may move a block's
    absmax from the true one; 0 without nesting), and the state (``quant_type``, ``blocksize``, ...)."""

    def __init__(self, tensors: dict, name: str):
        quant = next(k for k in tensors if k.startswith(f"{name}.quant_state.bitsandbytes__"))
        self.state = json.loads(tensors[quant][2])
        self.quant_type = quant.rsplit("__", 1)[1]
        self.blocksize = self.state["blocksize"]
        shape = tuple(self.state["shape"])
        n = math.prod(shape)
        packed = np.frombuffer(tensors[name][2], dtype=np.uint8)
        high, low = np.divmod(packed.astype(np.int64), 16)
        self.codes = np.column_stack([high, low]).reshape(-1)[:n]
        self.stored_code_book = _f32(tensors[f"{name}.quant_map"][2])
        blocks = -(-n // self.blocksize)
        if f"{name}.nested_absmax" in tensors:
            nb = self.state["nested_blocksize"]
            self.nested_map = _f32(tensors[f"{name}.nested_quant_map"][2])
            self.nested_absmax = _f32(tensors[f"{name}.nested_absmax"][2])
            self.offset = np.float32(self.state["nested_offset"])
            index = np.frombuffer(tensors[f"{name}.absmax"][2], dtype=np.uint8).astype(np.int64)
            scale2 = self.nested_absmax[np.arange(blocks) // nb]
            self.absmax = (self.nested_map[index] * scale2) + self.offset  # two float32 roundings
            # bitsandbytes' 8-bit quantizer (a binary search) picks one of the two codes around a value, not
            # always the nearer (0.184383 went to 0.177344, not 0.191406, in a test save): one full gap
            self.absmax_error = scale2.astype(np.float64) * (
                2 * max_half_gap(self.nested_map) + ROUNDING
            ) + 2.0**-22 * (np.abs(self.absmax) + abs(float(self.offset)))
        else:
            self.nested_map = None
            self.absmax = _f32(tensors[f"{name}.absmax"][2])
            self.absmax_error = np.zeros(blocks)
        code = CODE_BOOKS[self.quant_type]
        per_value = self.absmax[np.arange(n) // self.blocksize]
        self.values = _round_to_dtype(code[self.codes] * per_value, self.state["dtype"]).reshape(shape)


def decode_int8(tensors: dict, prefix: str) -> np.ndarray:
    """LLM.int8 ``<prefix>.weight`` (int8, (out, in)) times its row's ``SCB`` over 127, in bitsandbytes'
    float32 order: ``(q * SCB) * float32(1/127)``."""
    dtype, shape, raw = tensors[f"{prefix}.weight"]
    q = np.frombuffer(raw, dtype=np.int8).reshape(shape).astype(np.float32)
    scb = _f32(tensors[f"{prefix}.SCB"][2])
    return ((q * scb[:, None]) * np.float32(1 / 127)).astype(np.float64)


def four_bit_bound(weights: np.ndarray, decoded: Decoded) -> np.ndarray:
    """Per value, how far the 4-bit dequantization of ``weights`` (the float32 matrix before it was cast
    to the state's dtype and quantized) may lie from them: with ``A_b`` the largest ``|w|`` of the block
    (after the cast) and ``h`` the code book's largest half-gap, the nearest code is within ``h A_b``;
    the block's decoded absmax is ``A_b`` up to ``absmax_error``; each cast or float32 product adds a
    relative ``2^-11`` at most (float16; bfloat16 ``2^-8``), bounded here by twice that."""
    n = weights.size
    true_absmax = block_absmax(weights, decoded)
    h = max_half_gap(CODE_BOOKS[decoded.quant_type])
    unit = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}[decoded.state["dtype"]]
    per_block = true_absmax * (h + ROUNDING) + decoded.absmax_error
    out = decoded.values.reshape(-1)
    bound = per_block[np.arange(n) // decoded.blocksize] + 2 * unit * (np.abs(weights.reshape(-1)) + np.abs(out))
    return (bound + 2.0**-24).reshape(weights.shape)


def block_absmax(weights: np.ndarray, decoded: Decoded) -> np.ndarray:
    """The largest ``|w|`` of each block of ``weights`` cast to the state's dtype (float64)."""
    cast = _round_to_dtype(weights.astype(np.float32).reshape(-1), decoded.state["dtype"])
    blocks = -(-cast.size // decoded.blocksize)
    padded = np.zeros(blocks * decoded.blocksize)
    padded[: cast.size] = np.abs(cast)
    return padded.reshape(blocks, decoded.blocksize).max(axis=1)


def int8_bound(weights: np.ndarray, tensors: dict, prefix: str) -> np.ndarray:
    """Per value, how far LLM.int8's ``round(w * 127 / SCB) * SCB / 127`` may lie from the float32
    ``weights`` (cast to float16 first): half a step ``SCB / 254``, plus the casts and float32 products."""
    scb = _f32(tensors[f"{prefix}.SCB"][2]).astype(np.float64)
    out = decode_int8(tensors, prefix)
    return scb[:, None] * (1 / 254 + ROUNDING) + 2 * 2.0**-11 * (np.abs(weights) + np.abs(out)) + 2.0**-24


# --------------------------------------------------------------------------------------------------
# bitsandbytes' own kernels, checked against their round trip


def bnb_round_trip(shape, quant_type: str, nested: bool, blocksize: int = 64, seed: int = 0, kernel=None) -> dict:
    """bitsandbytes' ``quantize_4bit`` then ``dequantize_4bit`` of a float16 normal matrix of ``shape``
    on this CPU (or ``kernel(decoded)`` in place of ``dequantize_4bit``): the largest ratio of
    ``|w - dequantized|`` to :func:`four_bit_bound` (at most 1 when the kernels are right), the relative
    Frobenius error, and whether the dequantization equals the independent decode of the same bytes."""
    import bitsandbytes as bnb
    import torch

    w = torch.from_numpy(np.random.default_rng(seed).normal(0, 0.3, shape).astype(np.float32))
    packed, qs = bnb.functional.quantize_4bit(
        w.half(), blocksize=blocksize, quant_type=quant_type, compress_statistics=nested
    )
    tensors = {
        f"w.{k}": ("", tuple(v.shape), v.contiguous().view(torch.uint8).numpy().tobytes())
        for k, v in qs.as_dict(packed=True).items()
    }
    tensors["w"] = ("U8", tuple(packed.shape), packed.contiguous().numpy().tobytes())
    ours = Decoded(tensors, "w")
    theirs = kernel(ours) if kernel else bnb.functional.dequantize_4bit(packed, qs).double().numpy()
    weights = w.double().numpy()
    return {
        "ratio": float(np.max(np.abs(weights - theirs) / four_bit_bound(weights, ours))),
        "relative_error": float(np.linalg.norm(weights - theirs) / np.linalg.norm(weights)),
        "equals_decode": bool(np.array_equal(theirs, ours.values)),
    }


def row_block_kernel(decoded: Decoded) -> np.ndarray:
    """What bitsandbytes 0.50's AVX-512 ``dequantize_4bit`` computes (csrc/cpu_ops.cpp, the branch taken on
    an AVX-512F CPU when the row length ``n`` is a multiple of 16 and ``16 <= blocksize < 2048``): the
    scale of row ``r``, column ``c`` read as ``absmax[r * (n // blocksize) + c // blocksize]``, as if every
    row began a block.  Blocks run over the flattened matrix, so that is right only when ``blocksize``
    divides ``n``; on a (64, 96) matrix, block size 64, row 1 takes block 1's scale for columns that lie
    in blocks 1 and 2, and so on."""
    m, n = decoded.state["shape"]
    if n % 16 or not 16 <= decoded.blocksize < 2048:  # the scalar loop, which is right
        return decoded.values
    rows, cols = np.divmod(np.arange(m * n), n)
    scales = decoded.absmax[rows * (n // decoded.blocksize) + cols // decoded.blocksize]
    values = CODE_BOOKS[decoded.quant_type][decoded.codes] * scales
    return _round_to_dtype(values, decoded.state["dtype"]).reshape(m, n)


SHAPES = ((64, 64), (64, 96), (96, 64), (64, 32), (32, 48), (128, 80), (16, 16), (7, 9))


def main():
    import bitsandbytes as bnb
    import torch

    print(
        f"bitsandbytes {bnb.__version__}, torch {torch.__version__} (CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}), {platform.processor() or platform.machine()}"
    )
    print("shape      type  nested  max |w - deq| / bound  rel. Frobenius error  equals the layout decode")
    for shape in SHAPES:
        for quant_type in ("nf4", "fp4"):
            for nested in (False, True):
                r = bnb_round_trip(shape, quant_type, nested)
                flag = "" if r["ratio"] <= 1 and r["equals_decode"] else "   <- wrong"
                print(
                    f"{str(shape):10} {quant_type}   {str(nested):6}  {r['ratio']:21.3f}  {r['relative_error']:20.4f}"
                    f"  {r['equals_decode']}{flag}"
                )
    print("On an AVX-512 CPU the shapes whose row length is a multiple of 16 but not of the block size (64)")
    print("come out wrong: the AVX-512 kernel reads row r's scales from absmax[r * (n // 64) + c // 64].")
    print("That indexing, computed here without the kernel, gives these relative errors:")
    for shape in SHAPES:
        for quant_type in ("nf4", "fp4"):
            r = bnb_round_trip(shape, quant_type, False, kernel=row_block_kernel)
            print(f"{str(shape):10} {quant_type}   {r['relative_error']:.4f}")


if __name__ == "__main__":
    main()
