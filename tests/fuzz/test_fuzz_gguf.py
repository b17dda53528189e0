"""Hostile GGUF files: every malformed header is one SpecboundError line within milliseconds (the
header is checked by io/gguf_header.py before a tensor byte is used), a realistic vocabulary costs
bounded time and memory, and a big-endian file is read to the little-endian file's numbers."""

import argparse
import builtins
import logging
import math
import os
import shutil
import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import EDITS, FUZZ, clean_outcome, mutate
from support.gguf_bytes import (
    ARR,
    BOOL,
    F32,
    F64,
    GGML_Q8_0,
    I32,
    LLAMA,
    STR,
    U8,
    U32,
    U64,
    gguf_file,
    llama_tensors,
    text,
)

import specbound
from specbound.errors import SpecboundError
from specbound.io.gguf_header import BIG_ENDIAN_FIELDS, read_header

gguf = pytest.importorskip("gguf")

DATA_START = gguf_file(data_start=True)


def _replace(metadata, key, kind, value):
    return [(k, kind, value) if k == key else (k, t, v) for k, t, v in metadata]


# name -> (file bytes, words the one-line error must hold)
HOSTILE = {
    # counts and lengths that the file cannot back: refused before any loop or allocation
    "u8_array_2e63": (
        gguf_file([*LLAMA, ("tokenizer.ggml.scores", ARR, (U8, [], 2**63))]),
        ["9,223,372,036,854,775,808 UINT8 elements", "truncated or corrupt"],
    ),
    "string_array_2e63": (gguf_file([*LLAMA, ("tokenizer.ggml.tokens", ARR, (STR, [], 2**63))]), ["STRING elements"]),
    "string_2e63": (
        gguf_file([*LLAMA, ("general.name", STR, b"x")]).replace(text("x"), struct.pack("<Q", 2**63) + b"x"),
        ["'general.name'", "9,223,372,036,854,775,808 bytes"],
    ),
    "tensor_count_2e62": (gguf_file(counts=(2**62, len(LLAMA))), ["4,611,686,018,427,387,904 tensors"]),
    "key_count_2e62": (gguf_file(counts=(7, 2**62)), ["metadata entries"]),
    "dims_2e32": (gguf_file(dims={"blk.0.attn_q.weight": (2**32,) * 4}), ["past the end"]),
    "five_dims": (gguf_file(dims={"blk.0.attn_q.weight": (1,) * 5}), ["5 dimensions"]),
    "nested_arrays": (
        gguf_file(extra_entries=text("general.x") + struct.pack("<I", ARR) + struct.pack("<IQ", ARR, 1) * 5000),
        ["nests arrays"],
    ),
    # strings that are not UTF-8, types that do not exist
    "key_not_utf8": (gguf_file([*LLAMA, (b"general.\xff", U32, 1)]), ["key of metadata entry 7 is not UTF-8"]),
    "value_not_utf8": (gguf_file([*LLAMA, ("general.name", STR, b"\xff\xfe")]), ["'general.name' is not UTF-8"]),
    "tensor_name_not_utf8": (
        gguf_file(tensors={**llama_tensors(), b"blk.0.\xff": np.zeros(4, np.float32)}),
        ["name of tensor 7 is not UTF-8"],
    ),
    "unknown_value_type": (
        gguf_file(extra_entries=text("general.x") + struct.pack("<I", 99) + bytes(8)),
        ["unknown value type 99"],
    ),
    "duplicate_key": (gguf_file([*LLAMA, LLAMA[1]]), ["'llama.block_count' appears twice"]),
    "duplicate_tensor": (gguf_file(tensors=llama_tensors()).replace(b"attn_k", b"attn_q"), ["appears twice"]),
    "unknown_ggml_type": (gguf_file(types={"blk.0.attn_q.weight": 250}), ["quantization type 250"]),
    # the keys the dimensions are read from, holding the wrong type or NaN
    "block_count_string": (
        gguf_file(_replace(LLAMA, "llama.block_count", STR, "1")),
        ["'llama.block_count' must hold a non-negative integer", "'1'"],
    ),
    "head_count_array": (
        gguf_file(_replace(LLAMA, "llama.attention.head_count", ARR, (U32, [2, 2]))),
        ["'llama.attention.head_count'", "an array of 2"],
    ),
    "head_count_bool": (gguf_file(_replace(LLAMA, "llama.attention.head_count", BOOL, True)), ["head_count"]),
    "block_count_nan": (gguf_file(_replace(LLAMA, "llama.block_count", F32, math.nan)), ["holds nan"]),
    "freq_base_string": (gguf_file([*LLAMA, ("llama.rope.freq_base", STR, "x")]), ["must hold a number"]),
    "freq_base_inf": (gguf_file([*LLAMA, ("llama.rope.freq_base", F64, math.inf)]), ["holds inf"]),
    "nan_in_a_short_array": (gguf_file([*LLAMA, ("general.x", ARR, (F32, [1.0, math.nan]))]), ["not a finite value"]),
    "split_count_string": (gguf_file([*LLAMA, ("split.count", STR, "3")]), ["'split.count'"]),
    # tensors outside the data section, wrapping around 2^64, overlapping or misaligned
    "offset_wraps_to_the_header": (
        gguf_file(offsets={"blk.0.attn_q.weight": 2**64 - DATA_START}),
        ["18,446,744,073,709,551,616", "past the end"],
    ),
    "offset_past_the_end": (gguf_file(offsets={"blk.0.attn_q.weight": 2**40}), ["past the end"]),
    "overlap": (gguf_file(offsets={"blk.0.attn_k.weight": 0}), ["'blk.0.attn_q.weight'", "overlap"]),
    "misaligned": (gguf_file(offsets={"blk.0.attn_k.weight": 260}), ["offset 260", "alignment 32"]),
    "alignment_3": (gguf_file([*LLAMA, ("general.alignment", U32, 3)]), ["power of two"]),
    "alignment_string": (gguf_file([*LLAMA, ("general.alignment", STR, "32")]), ["UINT32 power of two"]),
    "alignment_u64": (gguf_file([*LLAMA, ("general.alignment", U64, 32)]), ["(UINT64)"]),
    "quantized_rows_not_blocks": (
        gguf_file(
            tensors={**llama_tensors(), "blk.0.x": np.zeros(34, np.uint8)},
            types={"blk.0.x": GGML_Q8_0},
            dims={"blk.0.x": (31,)},
        ),
        ["not a multiple of its block size 32"],
    ),
    "version_7": (b"GGUF" + struct.pack("<I", 7) + gguf_file()[8:], ["version 7"]),
    "not_gguf": (b"GGUX" + gguf_file()[4:], ["magic"]),
    "too_short": (b"GGUF\x03\x00", ["6 bytes"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header_is_one_line(case, tmp_path):
    data, needles = HOSTILE[case]
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    started = time.perf_counter()
    outcome = clean_outcome(specbound.analyze, path, threads=1)
    assert time.perf_counter() - started < 5
    assert isinstance(outcome, SpecboundError), outcome
    for needle in needles:
        assert needle in str(outcome), (needle, str(outcome))


def test_the_builder_writes_a_file_the_tool_reads(tmp_path):
    """The hostile files differ from this one in one place each: it must analyse (else every case
    above could fail for another reason than its own)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf_file())
    result = specbound.analyze(path, threads=1)
    assert all(math.isfinite(v) for v in result.bounds.values())
    assert read_header(path).tensors["blk.0.attn_q.weight"].shape == (8, 8)


def test_a_fifo_is_not_opened(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(SpecboundError, match="not a regular file"):
        read_header(fifo)


def vocabulary_file(tokens=152_064, merges=151_387) -> bytes:
    """A file whose tokenizer metadata is as large as a real 150k-token vocabulary's (Qwen2's)."""
    vocab = [
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.tokens", ARR, (STR, [f"tok{i}\u0120x" for i in range(tokens)])),
        ("tokenizer.ggml.scores", ARR, (F32, [float(i) for i in range(tokens)])),
        ("tokenizer.ggml.token_type", ARR, (I32, [1] * tokens)),
        ("tokenizer.ggml.merges", ARR, (STR, [f"a{i} b{i}" for i in range(merges)])),
    ]
    return gguf_file([*LLAMA, *vocab])


def test_a_realistic_vocabulary_costs_bounded_time_and_memory(tmp_path):
    """The old reader built one numpy object per token (8 s and 770 MB for this file); the header
    reader steps over the arrays by their length prefixes (0.14 s and 1 MiB of Python objects
    measured).  Memory is the sharp test (tracemalloc sees every object the reader builds); the time
    limit only catches a return of the per-token work."""
    path = tmp_path / "model.gguf"
    path.write_bytes(vocabulary_file())
    started = time.perf_counter()
    ckpt = specbound.io.open_checkpoint(path)
    assert time.perf_counter() - started < 5
    tracemalloc.start()
    try:
        specbound.io.open_checkpoint(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, peak
    assert not any(k.startswith("tokenizer.") for k in ckpt.config)
    assert ckpt.config["block_count"] == 1


def _blocks(array, kind):
    """``array`` as blocks of ``kind``: quantized by gguf where it can, else (the K-quants) random
    blocks whose fp16 scales are set to 0.01 (finite, so that the weights are)."""
    try:
        return gguf.quants.quantize(array, kind)
    except (gguf.quants.QuantError, NotImplementedError):
        block, size = gguf.GGML_QUANT_SIZES[kind]
        rng = np.random.default_rng(1)
        blocks = rng.integers(0, 256, (array.size // block, size), dtype=np.uint8)
        for at in BIG_ENDIAN_FIELDS[kind.name]:
            blocks[:, at : at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        return blocks.reshape(array.shape[0], -1)


def _write_quantized(path, types, N=256, endianess=None):
    """A one-block llama (width ``N``) written by gguf's own GGUFWriter, ``types``: role -> ggml type."""
    Q = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess or gguf.GGUFEndian.LITTLE)
    for key, value in [
        ("block_count", 1),
        ("context_length", 64),
        ("embedding_length", N),
        ("feed_forward_length", N),
        ("attention.head_count", 2),
        ("attention.head_count_kv", 2),
    ]:
        writer.add_uint32(f"llama.{key}", value)
    for name, array in llama_tensors(N=N, d_ff=N, scale=0.05).items():
        kind = types.get(name.split(".")[2])
        if kind is None:
            writer.add_tensor(name, array)
        elif kind == Q.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, _blocks(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _to_big_endian(path, monkeypatch):
    """Convert ``path`` in place with gguf's own gguf_convert_endian.py (it asks for YES)."""
    from gguf.scripts.gguf_convert_endian import convert_byteorder

    monkeypatch.setattr(builtins, "input", lambda *args: "YES")
    logging.getLogger("gguf-convert-endian").disabled = True
    convert_byteorder(gguf.GGUFReader(str(path), "r+"), argparse.Namespace(order="big", dry_run=False))


def test_big_endian_files_give_the_little_endian_numbers(tmp_path, monkeypatch):
    """The old reader decoded a big-endian file's fp16 scales in the wrong byte order (a wrong bound,
    or NaN); the converter's file now analyses to the same numbers as the file it converted."""
    Q = gguf.GGMLQuantizationType
    types = {
        "attn_q": Q.Q8_0,
        "attn_k": Q.Q4_0,
        "attn_v": Q.F16,
        "attn_output": Q.BF16,
        "ffn_gate": Q.Q4_K,
        "ffn_up": Q.Q6_K,
    }
    little = _write_quantized(tmp_path / "little.gguf", types)
    big = shutil.copy(little, tmp_path / "big.gguf")
    _to_big_endian(big, monkeypatch)
    assert read_header(big).big_endian and big.read_bytes() != little.read_bytes()
    a, b = specbound.analyze(little, threads=1), specbound.analyze(big, threads=1)
    assert a.bounds == b.bounds
    ckpt_a, ckpt_b = specbound.io.open_checkpoint(little), specbound.io.open_checkpoint(big)
    for name in ckpt_a.names:
        np.testing.assert_array_equal(ckpt_a.read(name), ckpt_b.read(name), err_msg=name)


def test_big_endian_blocks_of_an_unknown_layout_are_refused(tmp_path):
    """Q5_0's blocks are not among the layouts gguf_convert_endian.py swaps: refused, not guessed."""
    Q = gguf.GGMLQuantizationType
    path = _write_quantized(tmp_path / "big.gguf", {"attn_q": Q.Q5_0}, N=32, endianess=gguf.GGUFEndian.BIG)
    assert read_header(path).big_endian
    outcome = clean_outcome(specbound.analyze, path, threads=1)
    assert isinstance(outcome, SpecboundError) and "big-endian" in str(outcome) and "Q5_0" in str(outcome)


@FUZZ
@given(edits=EDITS)
def test_mutated_gguf_header(tmp_path_factory, edits):
    """Byte edits aimed at the header of a valid file: a result with finite bounds or one line."""
    data = gguf_file()
    edits = [(k, p % DATA_START, v) for k, p, v in edits]
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    path.write_bytes(mutate(data, edits))
    result = clean_outcome(specbound.analyze, path, threads=1)
    if not isinstance(result, Exception):
        assert all(math.isfinite(v) and v >= 0 for v in result.bounds.values())


SCALARS = st.sampled_from([U8, U32, U64, I32, F32, F64, BOOL]).flatmap(
    lambda kind: st.tuples(
        st.just(kind),
        {
            U8: st.integers(0, 255),
            U32: st.integers(0, 2**32 - 1),
            U64: st.integers(0, 2**64 - 1),
            I32: st.integers(-(2**31), 2**31 - 1),
            F32: st.floats(width=32),
            F64: st.floats(),
            BOOL: st.booleans(),
        }[kind],
    )
)
VALUES = (
    SCALARS
    | st.tuples(st.just(STR), st.binary(max_size=12))
    | st.tuples(st.just(ARR), st.tuples(st.just(U32), st.lists(st.integers(0, 2**32 - 1), max_size=3)))
)


@FUZZ
@given(
    key=st.sampled_from(
        [
            "llama.block_count",
            "llama.embedding_length",
            "llama.attention.head_count",
            "llama.attention.head_count_kv",
            "llama.feed_forward_length",
            "llama.context_length",
            "llama.rope.freq_base",
            "llama.rope.dimension_count",
            "general.alignment",
            "split.count",
            "general.architecture",
        ]
    ),
    typed=VALUES,
)
def test_any_value_under_the_keys_the_config_reads(tmp_path_factory, key, typed):
    kind, value = typed
    metadata = [m for m in LLAMA if m[0] != key] + [(key, kind, value)]
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    path.write_bytes(gguf_file(metadata))
    result = clean_outcome(specbound.analyze, path, threads=1)
    if not isinstance(result, Exception):
        assert all(math.isfinite(v) and v >= 0 for v in result.bounds.values())
