"""GGUF files written by the ``gguf`` package's own GGUFWriter, the way llama.cpp's
``convert_hf_to_gguf.py`` writes a LlamaForCausalLM: GGUF tensor names, the config in the metadata,
and the rows of Q and K permuted by ``LlamaModel.permute`` (copied from the converter into
tests/support/gguf_convert.py: the reader's inverse must undo exactly it).

Oracles: every role matrix of the GGUF file equals the Hugging Face checkpoint's (saved with
save_pretrained, read through safetensors) to 1e-9, and so does every number of the analysis; a
Q8_0 file analyses to the numbers of a safetensors checkpoint holding the weights dequantized by
hand (fp16 scale times int8, block by block).  The rotary QK quantities (the llama family's
``rotary`` pairing) depend on the order of Q's and K's rows: without the un-permutation the
Edelman-style bound of the float32 file differs from the Hugging Face one (32072 vs 31546 here), so
the number comparison checks the un-permutation as well as the matrices do.  Bad files (truncated, not GGUF, an
unknown or
undecodable quantization, another architecture) are one-line errors.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
from support.conformance import check_reader
from support.gguf_convert import permute
from support.same_numbers import assert_same_layer_weights, assert_same_numbers

import specbound
from specbound import SpecboundError
from specbound.io import open_checkpoint
from specbound.io.base import WEIGHTS_NOTE
from specbound.io.gguf_file import unpermute_rows
from specbound.pipeline import open_model


def assert_same_numbers_gguf(a, b, rel=1e-9):
    """Same numbers, the family's name aside (llama vs llama_gguf: the same blocks)."""
    assert_same_numbers(a, b, rel, family=False)


gguf = pytest.importorskip("gguf")

L, N, H, H_KV, D_FF, VOCAB = 2, 32, 4, 2, 64, 64


_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_PER_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf_name):
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    parts = hf_name.split(".")  # model.layers.<l>.<module>.weight
    return f"blk.{parts[2]}.{_PER_LAYER['.'.join(parts[3:-1])]}.{parts[-1]}"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """``(folder, state dict)`` of a tiny LlamaForCausalLM (grouped-query attention) saved with
    save_pretrained, its weights large enough that Q8_0 rounding shows."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=N,
        intermediate_size=D_FF,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=H_KV,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    folder = tmp_path_factory.mktemp("llama") / "hf"
    transformers.logging.set_verbosity_error()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder, {k: v.numpy().copy() for k, v in model.state_dict().items()}


def _new_writer(path, arch, split_max_tensors=0):
    """A GGUFWriter with the tiny model's dimensions in its metadata (block count, context, widths, heads)."""
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    writer.add_block_count(L)
    writer.add_context_length(64)
    writer.add_embedding_length(N)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(H)
    writer.add_head_count_kv(H_KV)
    return writer


def write_gguf(path, state, types=None, arch="llama", split_max_tensors=0):
    """Write ``state`` (Hugging Face names) as convert_hf_to_gguf.py does; ``types``: GGUF name ->
    GGMLQuantizationType for the tensors to store otherwise than float32; ``split_max_tensors``:
    split into ``<stem>-0000i-of-0000n.gguf`` parts of at most that many tensors (gguf-split)."""
    types = types or {}
    writer = _new_writer(path, arch, split_max_tensors)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(N // H)
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])  # a vocabulary: not part of the config
    for name, array in state.items():
        if name.endswith("q_proj.weight"):
            array = permute(array, H, H)
        elif name.endswith("k_proj.weight"):
            array = permute(array, H, H_KV)
        target = gguf_name(name)
        qtype = types.get(target)
        if qtype is None:
            writer.add_tensor(target, np.ascontiguousarray(array, dtype=np.float32))
        else:
            data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
            writer.add_tensor(target, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_same_matrices(folder_a, source_b):
    a, b = open_model(folder_a), open_model(source_b)
    assert (a.dims.L, a.dims.N, a.dims.H, a.dims.H_kv, a.dims.d_head, a.dims.d_ff, a.dims.activation) == (
        b.dims.L,
        b.dims.N,
        b.dims.H,
        b.dims.H_kv,
        b.dims.d_head,
        b.dims.d_ff,
        b.dims.activation,
    )
    assert_same_layer_weights(a, b, L, ordered=False)


def test_float32_gguf_equals_the_hugging_face_checkpoint(llama, tmp_path):
    folder, state = llama
    path = write_gguf(tmp_path / "tiny.gguf", state)
    ckpt = open_checkpoint(path)
    assert ckpt.config["model_type"] == "gguf-llama" and ckpt.config["block_count"] == L
    assert ckpt.config["attention.head_count_kv"] == H_KV and ckpt.config["rope.freq_base"] == 10000.0
    assert "tokenizer.ggml.tokens" not in ckpt.config and ckpt.facts.notes == {}
    # the file really holds permuted rows (else the un-permutation would go untested) ...
    stored = gguf.GGUFReader(str(path))
    raw_k = next(np.array(t.data) for t in stored.tensors if t.name == "blk.0.attn_k.weight")
    hf_k = state["model.layers.0.self_attn.k_proj.weight"]
    assert np.abs(raw_k - hf_k).max() > 0.01
    # ... and the reader puts them back: the HF tensor exactly
    np.testing.assert_array_equal(ckpt.read("blk.0.attn_k.weight"), hf_k.astype(np.float64))
    check_reader(path, folder, rel=1e-9, family=False)
    assert "blk.0.attn_q.weight" in json.loads(specbound.analyze(path, threads=1).to_json())["matrices"][0]["tensors"]


def test_unpermute_inverts_the_converters_permute():
    rng = np.random.default_rng(0)
    for heads, d_head in [(1, 2), (4, 8), (3, 6)]:
        w = rng.standard_normal((heads * d_head, 5))
        np.testing.assert_array_equal(unpermute_rows(permute(w, heads, heads), heads), w)
        bias = rng.standard_normal(heads * d_head)
        np.testing.assert_array_equal(unpermute_rows(permute(bias, heads, heads), heads), bias)


def dequantize_q8_0_by_hand(data, shape):
    """Q8_0: blocks of 32 values, each an fp16 scale followed by 32 int8, value = scale * int8."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(-1, 34)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float64)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)
    return (scale * q).reshape(shape)


def test_q8_0_gguf_analyses_the_dequantized_weights(llama, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    folder, state = llama
    Q = gguf.GGMLQuantizationType
    types = {gguf_name(n): Q.Q8_0 for n in state if n.endswith("_proj.weight") and "down_proj" not in n}
    types["blk.0.ffn_down.weight"] = Q.F16
    types["blk.1.ffn_down.weight"] = Q.BF16
    path = write_gguf(tmp_path / "q8.gguf", state, types)
    ckpt = open_checkpoint(path)
    note = ckpt.facts.notes[WEIGHTS_NOTE]
    assert "Q8_0" in note and "quantized model" in note
    assert ckpt.quantized["blk.0.attn_q.weight"] == "Q8_0" and "blk.0.ffn_down.weight" not in ckpt.quantized

    # the oracle: the stored bytes decoded by hand, rows put back by inverting ``permute`` as an index map
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    reference = {}
    for name, array in state.items():
        tensor = stored[gguf_name(name)]
        kind = tensor.tensor_type.name
        if kind == "Q8_0":
            values = dequantize_q8_0_by_hand(tensor.data, array.shape)
        elif kind == "BF16":
            words = np.asarray(tensor.data).copy().view("<u2").astype(np.uint32) << 16
            values = words.view(np.float32).astype(np.float64).reshape(array.shape)
        else:
            values = np.array(tensor.data, dtype=np.float64).reshape(array.shape)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = H_KV if "k_proj" in name else H
            order = permute(np.arange(array.shape[0]), H, heads)  # stored row i is HF row order[i]
            restored = np.empty_like(values)
            restored[order] = values
            values = restored
        reference[name] = values
    assert (
        np.abs(
            reference["model.layers.0.self_attn.q_proj.weight"] - state["model.layers.0.self_attn.q_proj.weight"]
        ).max()
        > 1e-5
    )  # really quantized
    config = transformers.LlamaConfig.from_pretrained(str(folder))
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in reference.items()})
    dequantized = tmp_path / "dequantized"
    model.save_pretrained(str(dequantized), safe_serialization=True)
    assert_same_matrices(dequantized, path)
    result = specbound.analyze(path, threads=1)
    # the analysis says it is of the quantized model (one assumption more than the float checkpoint's)
    noted = [a for a in result.assumptions if a["name"] == "quantized_weights"]
    assert len(noted) == 1 and "quantized model" in noted[0]["effect"] and "Q8_0" in noted[0]["effect"]
    assert "weights: quantized" in str(result)  # the text summary says so too
    result.assumptions.remove(noted[0])
    assert_same_numbers_gguf(specbound.analyze(dequantized, threads=1), result)


# --- bad files --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_file(llama, tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "good.gguf", llama[1])


def _one_line_error(source, *needles):
    with pytest.raises(SpecboundError) as info:
        specbound.analyze(source, threads=1)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_truncated_gguf(good_file, tmp_path):
    data = good_file.read_bytes()
    for cut in (len(data) - 100, 200, 10):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        _one_line_error(path, "truncated or corrupt", "re-download")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"NOPE" + bytes(100))
    _one_line_error(path, "cannot read", "GGUF")


def _patch_type(source, tmp_path, tensor, code):
    """A copy of ``source`` with ``tensor``'s ggml type field set to ``code``."""
    reader = gguf.GGUFReader(str(source))
    info = next(t for t in reader.tensors if t.name == tensor).field
    offset = info.offset + sum(int(p.nbytes) for p in info.parts[:4])  # name len, name, n_dims, dims
    data = bytearray(source.read_bytes())
    data[offset : offset + 4] = int(code).to_bytes(4, "little")
    path = tmp_path / f"type{code}.gguf"
    path.write_bytes(bytes(data))
    return path


def test_unknown_quantization_type(good_file, tmp_path):
    path = _patch_type(good_file, tmp_path, "blk.0.attn_q.weight", 250)
    _one_line_error(path, "quantization type", "upgrade gguf")


def test_quantization_without_a_dequantizer(llama, tmp_path):
    """Q8_1 is a known type that gguf cannot dequantize in numpy: refused when read, by name."""
    Q = gguf.GGMLQuantizationType
    block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    writer_state = dict(llama[1])
    path = tmp_path / "q8_1.gguf"
    writer = _new_writer(path, "llama")
    for name, array in writer_state.items():
        target = gguf_name(name)
        if target == "blk.0.attn_v.weight":
            raw = np.zeros((array.shape[0], array.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(target, raw, raw_dtype=Q.Q8_1)
        else:
            writer.add_tensor(target, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _one_line_error(path, "Q8_1", "no dequantization")


def test_unsupported_architecture(llama, tmp_path):
    path = write_gguf(tmp_path / "gpt2.gguf", llama[1], arch="gpt2")
    _one_line_error(path, "'gpt2' is not supported", "llama")


def test_ollama_blob_without_suffix(good_file, tmp_path):
    """Ollama stores models as ``blobs/sha256-<digest>``: recognised by the GGUF magic."""
    blob = tmp_path / "sha256-0123abcd"
    blob.write_bytes(good_file.read_bytes())
    assert open_checkpoint(blob).config["model_type"] == "gguf-llama"


def test_split_gguf_reads_every_part(llama, tmp_path):
    """A model split into parts (llama.cpp's gguf-split, GGUFWriter's split_max_tensors): any part
    names the whole model; a missing part is a one-line error."""
    folder, state = llama
    write_gguf(tmp_path / "tiny.gguf", state, split_max_tensors=7)
    parts = sorted(tmp_path.glob("tiny-*-of-*.gguf"))
    assert len(parts) == 3 and not (tmp_path / "tiny.gguf").exists()  # 21 tensors
    reference = specbound.analyze(folder, threads=1)
    for part in (parts[0], parts[2]):
        assert "split.count" not in open_checkpoint(part).config
        assert_same_numbers_gguf(reference, specbound.analyze(part, threads=1))
    parts[2].unlink()
    _one_line_error(parts[0], "tiny-00003-of-00003.gguf", "is missing", "download every part")
    renamed = tmp_path / "renamed.gguf"
    parts[1].rename(renamed)
    _one_line_error(renamed, "split into 3 files", "original names")


def test_gguf_analysis_needs_only_the_base_install(good_file):
    """The light install (make demo) analyses GGUF: no torch, onnx, transformers, h5py or msgpack."""

    code = (
        "import sys, specbound; specbound.analyze(sys.argv[1], threads=1); "
        "heavy = [m for m in ('torch', 'onnx', 'transformers', 'h5py', 'msgpack', 'dask', 'matplotlib') "
        "if m in sys.modules]; assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code, str(good_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
