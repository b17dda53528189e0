"""CTranslate2 folders written by CTranslate2's own converter (``TransformersConverter``) from tiny
Hugging Face models: a float32 conversion analyses to the Hugging Face folder's numbers (Whisper,
BERT and BART exactly; LLaMA once its ``max_position_embeddings``, which the spec does not store, is
given); an int8 conversion's weights are CTranslate2's dequantization ``float32(q) * (1 / scale)``
of the float weights (its own encoder's output the oracle) and the analysis names them."""

import struct

import numpy as np
import pytest

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")

import copy
import shutil
import warnings

from support.ct2_models import convert, hf_model, rewrite_model_bin  # noqa: E402
from support.one_line import assert_one_line_error, run_cli
from support.same_numbers import assert_same_numbers  # noqa: E402

import specbound  # noqa: E402
from specbound import SpecboundError  # noqa: E402
from specbound.io import open_checkpoint  # noqa: E402
from specbound.io.ctranslate2_file import dequantize


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ct2")
    built = {}

    def get(kind, quantization=None):
        if kind not in built:
            built[kind] = (root / f"{kind}_hf", hf_model(kind, root / f"{kind}_hf"))
        key = (kind, quantization)
        if key not in built:
            built[key] = convert(built[kind][0], root / f"{kind}_ct2_{quantization}", quantization)
        return built[kind][0], built[key], built[kind][1]

    return get


EXTRA = {"llama": {"max_position_embeddings": 24}}


@pytest.mark.parametrize("kind", ["whisper", "llama", "bert", "bart"])
def test_float32_conversion_analyses_as_the_hugging_face_folder(folders, kind):
    hf, ct2, _ = folders(kind)
    ours = specbound.analyze(ct2, threads=1, config=EXTRA.get(kind))
    theirs = specbound.analyze(hf, threads=1)
    assert ours.model["family"] == theirs.model["family"] == kind
    assert not any(e["name"] == "quantized_weights" for e in ours.assumptions)
    assert_same_numbers(theirs, ours, rel=1e-12)


def test_whisper_reads_every_head_of_both_stacks(folders):
    hf, ct2, model = folders("whisper")
    ckpt = open_checkpoint(ct2)
    state = model.state_dict()
    for name in ckpt.names:  # the fused [q | k | v] and [k | v] split back into the model's own matrices
        np.testing.assert_array_equal(ckpt.read(name), state[name].double().numpy(), err_msg=name)
    assert {n for n in ckpt.names if "encoder_attn" in n} >= {
        f"model.decoder.layers.{i}.encoder_attn.{p}_proj.weight" for i in range(2) for p in ("q", "k", "v", "out")
    }


def _ct2_int8(w):
    """CTranslate2's own int8 quantization (ctranslate2/specs/model_spec.py) of one weight and its
    dequantization on CPU, ``float32(q) * (1.f / scale)`` in float32 (src/ops/dequantize_cpu.cc):
    correctly rounded float32 operations, the same on every CPU."""
    w = w.astype(np.float32).reshape(w.shape[0], -1)
    amax = np.abs(w).max(axis=1)
    amax[amax == 0] = 127.0
    scale = (127.0 / amax).astype(np.float32)
    q = np.rint(w * scale[:, None]).astype(np.int8)
    return (q.astype(np.float32) * (np.float32(1) / scale)[:, None]).astype(np.float64)


@pytest.mark.parametrize("kind, quantization", [("whisper", "int8"), ("llama", "int8_float16")])
def test_int8_conversion_is_dequantized_and_named(folders, kind, quantization):
    hf, ct2, model = folders(kind, quantization)
    ckpt = open_checkpoint(ct2)
    state = model.state_dict()
    q_name = "model.layers.0.self_attn.q_proj.weight" if kind == "llama" else "model.encoder.layers.0.fc1.weight"
    fused = (
        "model.layers.0.self_attn.k_proj.weight"
        if kind == "llama"
        else "model.decoder.layers.1.encoder_attn.v_proj.weight"
    )
    for name in (q_name, fused):
        w = state[name].numpy()
        if name == fused and kind == "llama":  # quantized as one fused [q | k | v]: its rows' own scales
            qkv = np.concatenate([state[f"model.layers.0.self_attn.{p}_proj.weight"].numpy() for p in "qkv"])
            expected = _ct2_int8(qkv)[32:48]
        else:
            expected = _ct2_int8(w)
        np.testing.assert_array_equal(ckpt.read(name), expected)
        assert np.abs(ckpt.read(name) - w).max() <= np.abs(w).max() / 127 * 0.5 + 1e-7
    assert ckpt.dtype(q_name) == "F32"
    ours = specbound.analyze(ct2, threads=1, config=EXTRA.get(kind))
    note = next(e for e in ours.assumptions if e["name"] == "quantized_weights")
    assert "CTranslate2" in note["effect"] and "int8" in note["effect"]
    theirs = specbound.analyze(hf, threads=1)
    for bound, value in theirs.log10_bounds.items():  # the quantized model's bound, near the float one
        if value is not None and np.isfinite(value):
            assert ours.log10_bounds[bound] == pytest.approx(value, abs=0.05), bound


def test_int8_dequantization_is_ctranslate2s_own(folders, tmp_path):
    """CTranslate2 itself as the oracle: its encoder run on the int8 conversion (weights dequantized as
    it loads them in float32) gives bit for bit the output of the same encoder converted in float32
    from the weights specbound reads, the token-type embeddings and pooler (int8 too, not analysed)
    dequantized by the reader's own function.  Both runs are CTranslate2's float32 code on the same
    CPU; the previous reading (q / scale in float64) differs in about a quarter of the weights."""

    import ctranslate2
    import torch

    hf, ct2, model = folders("bert", "int8")
    ckpt = open_checkpoint(ct2)
    ours = copy.deepcopy(model)
    state = ours.state_dict()
    extra = {
        "embeddings.token_type_embeddings.weight": "encoder/embeddings_1/weight",
        "pooler.dense.weight": "pooler_dense/weight",
    }
    with torch.no_grad():
        for name in ckpt.names:
            state[name].copy_(torch.from_numpy(ckpt.read(name)))
        for name, var in extra.items():
            values = dequantize(ckpt._values(var), ckpt._values(var.rsplit("/", 1)[0] + "/weight_scale"))
            state[name].copy_(torch.from_numpy(values))
    ours.save_pretrained(str(tmp_path / "ours"))
    for file in hf.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(file, tmp_path / "ours" / file.name)
    float_ct2 = convert(tmp_path / "ours", tmp_path / "ours_ct2")
    tokens = [["t1", "t5", "t9", "t3", "t2"], ["t7", "t2"]]
    outputs = [
        np.array(
            ctranslate2.Encoder(str(folder), device="cpu", compute_type="float32", intra_threads=1)
            .forward_batch(tokens)
            .last_hidden_state
        )
        for folder in (ct2, float_ct2)
    ]
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_model_bin_named_as_a_file_is_not_sent_to_torch_load(folders):
    _, ct2, _ = folders("whisper")
    ckpt = open_checkpoint(ct2 / "model.bin")
    assert ckpt.config["model_type"] == "whisper"


def _rewrite(src, dst, patch):
    data = bytearray((src / "model.bin").read_bytes())
    patch(data)
    dst.mkdir()
    (dst / "model.bin").write_bytes(bytes(data))
    (dst / "config.json").write_bytes((src / "config.json").read_bytes())
    return dst


def test_hostile_and_unsupported_files_are_one_line_errors(folders, tmp_path):
    _, ct2, _ = folders("whisper")
    cases = {
        "version": (lambda d: d.__setitem__(slice(0, 4), struct.pack("<I", 5)), "binary version 5"),
        "truncated": (lambda d: d.__delitem__(slice(len(d) // 2, None)), "truncated or corrupt"),
        "count": (lambda d: d.__setitem__(slice(20, 24), struct.pack("<I", 2**31)), "corrupt"),
        "spec": (lambda d: d.__setitem__(slice(6, 17), b"Wav2VecSpec"), "Wav2VecSpec"),
    }
    for name, (patch, words) in cases.items():
        folder = _rewrite(ct2, tmp_path / name, patch)
        with pytest.raises(SpecboundError, match=words) as info:
            specbound.analyze(folder, threads=1)
        assert "\n" not in str(info.value), name


def test_a_pickle_named_model_bin_is_not_taken_for_ctranslate2(tmp_path):
    torch = pytest.importorskip("torch")
    folder = tmp_path / "m"
    folder.mkdir()
    torch.save({"w": torch.zeros(2, 2)}, folder / "model.bin")
    (folder / "config.json").write_text("{}")
    with pytest.raises(SpecboundError, match="not a CTranslate2 model.bin"):
        open_checkpoint(folder)


@pytest.mark.parametrize("quantization", ["float16", "bfloat16", "int16", "int8_bfloat16"])
def test_other_conversions_read_as_ctranslate2_stores_them(folders, quantization):
    torch = pytest.importorskip("torch")
    _, ct2, model = folders("whisper", quantization)
    ckpt = open_checkpoint(ct2)
    name = "model.encoder.layers.1.fc2.weight"
    w = model.state_dict()[name]
    if quantization in ("float16", "bfloat16"):
        expected = w.to(getattr(torch, quantization)).double().numpy()
    elif quantization == "int16":  # one scale per tensor: 2^10 / max |w| (ctranslate2/specs/model_spec.py)
        w32 = w.numpy().astype(np.float32)
        scale = np.float32(2**10 / np.amax(np.absolute(w32)))
        q = np.clip(np.rint(w32 * scale), -32768, 32767).astype(np.int16)
        expected = (q.astype(np.float32) * (np.float32(1) / scale)).astype(np.float64)
    else:
        expected = _ct2_int8(w.numpy())
    np.testing.assert_array_equal(ckpt.read(name), expected)
    assert any(e["name"] == "quantized_weights" for e in specbound.analyze(ct2, threads=1).assumptions) == (
        quantization.startswith("int")
    )


def _refused_in_one_line(capsys, folder, needles):
    """The CLI's analysis of ``folder``: one error line holding ``needles``, no numpy warning first."""

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, out, err = run_cli(capsys, folder, "--threads", "1")
    assert_one_line_error(rc, out, err, needles)
    assert not [str(w.message) for w in caught]


def test_a_variable_or_alias_held_twice_is_refused_naming_it(folders, tmp_path, capsys):
    _, ct2, _ = folders("whisper")
    name = "encoder/layer_0/ffn/linear_1/weight"

    def twice(variables, aliases):
        variables.append(list(next(v for v in variables if v[0] == name)))

    _refused_in_one_line(capsys, rewrite_model_bin(ct2, tmp_path / "twice", twice), [repr(name), "twice"])

    def alias_twice(variables, aliases):
        aliases += [["a/weight", name], ["a/weight", "encoder/layer_0/ffn/linear_0/weight"]]

    _refused_in_one_line(capsys, rewrite_model_bin(ct2, tmp_path / "alias", alias_twice), ["'a/weight'", "also"])


@pytest.mark.parametrize(
    "kind, name",
    [
        ("whisper", "encoder/layer_0/self_attention/linear_1/weight"),
        ("whisper", "decoder/embeddings/weight"),
        ("bert", "encoder/layer_0/self_attention/linear_1/weight"),
        ("bert", "encoder/layer_0/ffn/linear_0/weight"),
        ("bart", "encoder/layer_0/self_attention/linear_1/weight"),
        ("bart", "decoder/layer_1/attention/linear_1/weight"),
        ("llama", "decoder/layer_0/self_attention/linear_1/weight"),
        ("llama", "decoder/layer_0/self_attention/linear_0/weight"),
    ],
)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_vector_or_scalar_where_a_matrix_belongs_is_one_line(folders, tmp_path, capsys, kind, name, rank):
    _, ct2, _ = folders(kind)

    def flatten(variables, aliases):
        row = next(v for v in variables if v[0] == name)
        row[1] = () if rank == 0 else (len(row[3]) // 4,)
        row[3] = row[3][:4] if rank == 0 else row[3]

    _refused_in_one_line(capsys, rewrite_model_bin(ct2, tmp_path / "flat", flatten), [repr(name), "a matrix belongs"])


def test_a_weight_scale_near_zero_is_one_line_without_warnings(folders, tmp_path, capsys):
    _, ct2, _ = folders("whisper", "int8")
    name = "encoder/layer_0/ffn/linear_1/weight_scale"

    def tiny(variables, aliases):
        row = next(v for v in variables if v[0] == name)
        row[3] = np.full(len(row[3]) // 4, 1e-45, dtype="<f4").tobytes()

    _refused_in_one_line(capsys, rewrite_model_bin(ct2, tmp_path / "tiny", tiny), ["weight_scale", "overflows"])
