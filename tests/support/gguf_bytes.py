"""GGUF files written byte by byte, so that a test can say exactly what a hostile header holds (a
2^63-element array, a tensor offset near 2^64, a string that is not UTF-8) where ``GGUFWriter``
would refuse to write it.  The layout is ggml's docs/gguf.md (version 3); ``byteorder='>'`` writes
a big-endian file (every header value and every float tensor byte-swapped)."""

from __future__ import annotations

import struct

import numpy as np

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FORMATS = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8


def text(value, order="<") -> bytes:
    raw = value if isinstance(value, bytes) else value.encode()
    return struct.pack(order + "Q", len(raw)) + raw


def value(kind: int, item, order="<") -> bytes:
    """A value of GGUF type ``kind``; an array is ``(element kind, items)`` or ``(element kind,
    items, declared count)``."""
    if kind == STR:
        return text(item, order)
    if kind == ARR:
        element, items, *declared = item
        count = declared[0] if declared else len(items)
        return struct.pack(order + "IQ", element, count) + b"".join(value(element, i, order) for i in items)
    return struct.pack(order + _FORMATS[kind], item)


def entry(key, kind: int, item, order="<") -> bytes:
    return text(key, order) + struct.pack(order + "I", kind) + value(kind, item, order)


LLAMA = [
    ("general.architecture", STR, "llama"),
    ("llama.block_count", U32, 1),
    ("llama.context_length", U32, 64),
    ("llama.embedding_length", U32, 8),
    ("llama.feed_forward_length", U32, 12),
    ("llama.attention.head_count", U32, 2),
    ("llama.attention.head_count_kv", U32, 2),
]
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def llama_tensors(seed=0, N=8, d_ff=12, scale=0.3) -> dict[str, np.ndarray]:
    """One llama block's role matrices (``(out, in)``, float32) under their GGUF names."""
    rng = np.random.default_rng(seed)
    shapes = {
        "attn_q": (N, N),
        "attn_k": (N, N),
        "attn_v": (N, N),
        "attn_output": (N, N),
        "ffn_gate": (d_ff, N),
        "ffn_up": (d_ff, N),
        "ffn_down": (N, d_ff),
    }
    return {f"blk.0.{r}.weight": (scale * rng.standard_normal(shapes[r])).astype(np.float32) for r in ROLES}


def gguf_file(
    metadata=LLAMA,
    tensors=None,
    *,
    order="<",
    alignment=32,
    offsets=None,
    types=None,
    extra_entries=b"",
    dims=None,
    counts=None,
    data_start=False,
) -> bytes | int:
    """A whole GGUF file.

    ``metadata``: ``(key, kind, value)`` triples; ``extra_entries``: raw entry bytes appended (and
    counted).  ``tensors``: name -> float32 array (default: :func:`llama_tensors`), stored F32 at
    aligned offsets in order unless ``offsets`` (name -> offset in the data section), ``types``
    (name -> ggml type code, the bytes then given as a uint8 array) or ``dims`` (name -> the
    declared dimensions, innermost first) say otherwise.  ``counts``: ``(tensor count, key
    count)`` to declare instead of the true ones."""
    tensors = llama_tensors() if tensors is None else tensors
    offsets, types, dims = offsets or {}, types or {}, dims or {}
    n_extra = 1 if extra_entries else 0
    kv = b"".join(entry(k, t, v, order) for k, t, v in metadata) + extra_entries
    infos, blobs, at = [], [], 0
    for name, array in tensors.items():
        code = types.get(name, GGML_F32)
        data = array.astype(order + "f4").tobytes() if code == GGML_F32 else np.asarray(array, np.uint8).tobytes()
        shape = dims.get(name, tuple(reversed(array.shape)))
        start = offsets.get(name, at)
        infos.append(
            text(name, order)
            + struct.pack(order + "I", len(shape))
            + b"".join(struct.pack(order + "Q", d) for d in shape)
            + struct.pack(order + "IQ", code, start)
        )
        blobs.append((start, data))
        if start < 2**40:  # a far offset (a hostile one) holds no bytes here
            at = -(-max(at, start + len(data)) // alignment) * alignment
    n_tensors, n_keys = counts or (len(tensors), len(metadata) + n_extra)
    head = b"GGUF" + struct.pack(order + "IQQ", 3, n_tensors, n_keys) + kv + b"".join(infos)
    head += bytes(-len(head) % alignment)
    if data_start:
        return len(head)
    section = bytearray(max([s + len(d) for s, d in blobs if s < 2**40] or [0]))
    for start, data in blobs:
        if start < 2**40:
            section[start : start + len(data)] = data
    return head + bytes(section)


# llama.cpp's multimodal projector file (mmproj-*.gguf) of a one-block SigLIP encoder (Gemma 3's projector)
MMPROJ = [
    ("general.architecture", STR, "clip"),
    ("clip.has_vision_encoder", BOOL, True),
    ("clip.projector_type", STR, "gemma3"),
    ("clip.vision.block_count", U32, 1),
    ("clip.vision.embedding_length", U32, 8),
    ("clip.vision.feed_forward_length", U32, 12),
    ("clip.vision.attention.head_count", U32, 2),
    ("clip.vision.attention.layer_norm_epsilon", F32, 1e-6),
    ("clip.vision.image_size", U32, 8),
    ("clip.vision.patch_size", U32, 4),
    ("clip.use_gelu", BOOL, True),
]


def mmproj_tensors(seed=0, N=8, d_ff=12, text_width=6, scale=0.3) -> dict[str, np.ndarray]:
    """One encoder block's matrices (``(out, in)``, float32) and Gemma 3's projector under their mmproj names."""
    rng = np.random.default_rng(seed)
    shapes = {
        "v.blk.0.attn_q.weight": (N, N),
        "v.blk.0.attn_k.weight": (N, N),
        "v.blk.0.attn_v.weight": (N, N),
        "v.blk.0.attn_out.weight": (N, N),
        "v.blk.0.ffn_up.weight": (d_ff, N),
        "v.blk.0.ffn_down.weight": (N, d_ff),
        "mm.input_projection.weight": (N, text_width),
    }
    return {name: (scale * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()}
