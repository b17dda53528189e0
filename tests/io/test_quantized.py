"""Quantized safetensors checkpoints of a tiny LLaMA: every quantized weight reads as its library's
dequantization (compressed-tensors: the library's own ``decompress``; GPTQ, AWQ, MLX: packers
transcribed from AutoGPTQ / AutoAWQ / mlx's layout, see tests/support/quant_writers.py), exactly;
the analysis names the quantization, and its bounds are the float model's to the quantization's
error.  Where the reference is a library's own kernel (compressed-tensors, mx.dequantize, transformers'
Fp8Dequantize), it is also checked against the float weights within the format's error
(support.quant_writers.assert_within_format_error)."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import shutil

from safetensors.numpy import load_file, save_file
from support import quant_writers as qw  # noqa: E402

import specbound  # noqa: E402
import specbound.io.base
from specbound import SpecboundError  # noqa: E402
from specbound.io import open_checkpoint  # noqa: E402
from specbound.io.base import WEIGHTS_NOTE  # noqa: E402
from specbound.io.quantized import (
    METHODS,
    QUANT_METHODS,
    unpack_bits,  # noqa: E402
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    model = qw.tiny_llama(root / "hf")
    return root, model, specbound.analyze(root / "hf", threads=1)


def _check(folder, expected, hf_analysis, words, tolerance):
    """Every weight equal to ``expected``, the note naming ``words``, each log10 bound within
    ``tolerance`` of the float model's (None: not compared)."""
    ckpt = open_checkpoint(folder)
    assert set(expected) <= set(ckpt.names)
    assert not any(n.endswith((".qweight", ".weight_packed", ".scales")) for n in ckpt.names)
    for name, want in expected.items():
        np.testing.assert_array_equal(ckpt.read(name), want, err_msg=name)
    ours = specbound.analyze(folder, threads=1)
    note = next(e for e in ours.assumptions if e["name"] == "quantized_weights")
    for word in words:
        assert word in note["effect"]
    for bound, value in hf_analysis.log10_bounds.items() if tolerance is not None else ():
        if value is not None and np.isfinite(value):
            assert ours.log10_bounds[bound] == pytest.approx(value, abs=tolerance), bound
    return ours


CT = {
    "fp8-tensor": ("float-quantized", dict(num_bits=8, type="float", strategy="tensor", symmetric=True)),
    "fp8-channel": ("float-quantized", dict(num_bits=8, type="float", strategy="channel", symmetric=True)),
    "fp8-block": (
        "float-quantized",
        dict(num_bits=8, type="float", strategy="block", block_structure=[16, 32], symmetric=True),
    ),
    "int8-channel": ("int-quantized", dict(num_bits=8, type="int", strategy="channel", symmetric=True)),
    "w4a16-group": ("pack-quantized", dict(num_bits=4, type="int", strategy="group", group_size=32, symmetric=True)),
    "w4-asym-group": ("pack-quantized", dict(num_bits=4, type="int", strategy="group", group_size=16, symmetric=False)),
    "w3-channel": ("pack-quantized", dict(num_bits=3, type="int", strategy="channel", symmetric=True)),
    "nvfp4": (
        "nvfp4-pack-quantized",
        dict(num_bits=4, type="float", strategy="tensor_group", group_size=16, symmetric=True),
    ),
}


@pytest.mark.parametrize("variant", sorted(CT))
def test_compressed_tensors_reads_as_the_librarys_decompression(base, variant):
    pytest.importorskip("compressed_tensors")
    root, model, hf = base
    fmt, args = CT[variant]
    folder = root / f"ct-{variant}"
    expected = qw.write_compressed(model, folder, args, fmt)
    _check(folder, expected, hf, ["compressed-tensors", fmt], 0.6 if "4" in variant or "3" in variant else 0.2)
    kind = {"float-quantized": "fp8", "nvfp4-pack-quantized": "fp4"}.get(fmt, "int")
    qw.assert_within_format_error(
        model, expected, kind, args["strategy"], args.get("group_size"), args.get("block_structure"), args["num_bits"]
    )


@pytest.mark.parametrize(
    "bits, group, sym, act_order, v2",
    [
        (4, 32, True, False, False),
        (4, 16, False, True, False),
        (3, 32, False, True, False),
        (2, 32, True, False, False),
        (8, 32, False, True, True),
    ],
)
def test_gptq_reads_as_autogptqs_dequantization(base, bits, group, sym, act_order, v2):
    root, model, hf = base
    folder = root / f"gptq-{bits}-{group}-{sym}-{act_order}-{v2}"
    expected = qw.write_gptq(model, folder, bits, group, sym, act_order, v2)
    _check(folder, expected, hf, ["GPTQ", f"{bits}-bit"], 1.5 if bits < 4 else 0.6)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("writer, act_order", [("autogptq", False), ("autogptq", True), ("gptqmodel", False)])
def test_gptq_v1_zero_points_of_zero_read_as_their_writer_reads_them(base, bits, writer, act_order):
    """Asymmetric v1 saves holding zero points of 0 (every 5th): AutoGPTQ's pack turns each into all
    ones (and the rest of its word), its qlinear_cuda_old reads 0 at 2/4/8 bits, qlinear_cuda
    (act-order) and 3 bits read 2^bits; GPTQModel's v2-to-v1 word subtraction borrows from the
    neighbour field and its loader's word addition gives every zero point back (transcriptions
    checked against both libraries' own code, tests/support/quant_writers.py)."""
    root, model, _ = base
    folder = root / f"gptq-zero-{writer}-{bits}-{act_order}"
    expected = qw.write_gptq(model, folder, bits, 32, False, act_order, writer=writer, zero_every=5)
    ckpt = open_checkpoint(folder)
    for name, want in expected.items():
        np.testing.assert_array_equal(ckpt.read(name), want, err_msg=name)
    assert ("GPTQModel reads them" if writer == "gptqmodel" else "AutoGPTQ's") in ckpt.facts.notes[WEIGHTS_NOTE]
    # the writer is named by the config (GPTQModel's meta.quantizer) or not: the ambiguity is said when not
    assert ("config does not name the library" in ckpt.facts.notes[WEIGHTS_NOTE]) == (writer == "autogptq")


def test_gptq_v1_writer_named_by_quantize_config_json(base):
    """GPTQModel's meta.quantizer in quantize_config.json beside config.json names the writer; without
    either the words say that zero points of 0 are read as AutoGPTQ reads them, GPTQModel's differing."""
    root, model, _ = base
    folder = root / "gptq-zero-untold"
    expected = qw.write_gptq(model, folder, 4, 32, False, False, writer="gptqmodel", zero_every=5, meta=False)
    ckpt = open_checkpoint(folder)
    assert "config does not name the library that wrote it" in ckpt.facts.notes[WEIGHTS_NOTE]
    assert "read as 0, as AutoGPTQ computes" in ckpt.facts.notes[WEIGHTS_NOTE]
    (folder / "quantize_config.json").write_text(json.dumps({"bits": 4, "meta": {"quantizer": ["gptqmodel:4.2.5"]}}))
    ckpt = open_checkpoint(folder)
    assert "config does not name" not in ckpt.facts.notes[WEIGHTS_NOTE]
    for name, want in expected.items():
        np.testing.assert_array_equal(ckpt.read(name), want, err_msg=name)


def test_awq_reads_as_autoawqs_dequantization(base):
    root, model, hf = base
    folder = root / "awq"
    expected = qw.write_awq(model, folder, 32)
    _check(folder, expected, hf, ["AWQ", "GEMM"], 0.6)


@pytest.mark.parametrize("bits", [4, 3, 8])
def test_mlx_reads_as_mlxs_dequantization(base, bits):
    root, model, hf = base
    folder = root / f"mlx-{bits}"
    expected = qw.write_mlx(model, folder, bits, 32)
    _check(folder, expected, hf, ["MLX", f"{bits}-bit"], 1.0 if bits < 4 else 0.6)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
def test_mlx_reads_as_mx_dequantize(base, bits):
    """Quantized by mlx itself (mx.quantize), compared with mx.dequantize."""
    pytest.importorskip("mlx.core")
    root, model, hf = base
    folder = root / f"mlx-native-{bits}"
    expected = qw.write_mlx_native(model, folder, bits, 32)
    # 1 bit a weight is not near the float model (its bounds differ by 4 in log10): the weights are checked alone
    _check(folder, expected, hf, ["MLX", f"{bits}-bit"], {1: None, 2: 2.0, 3: 2.0}.get(bits, 0.6))
    qw.assert_within_format_error(model, expected, "affine", "group", 32, bits=bits)


@pytest.mark.parametrize("block", [(16, 32), None])
def test_finegrained_fp8_reads_as_transformers_dequantizes(base, block):
    """transformers' own Fp8Dequantize is the reference (DeepSeek-V3-style 2-D blocks, and per tensor)."""
    root, model, hf = base
    folder = root / f"fp8-{block}"
    expected = qw.write_finegrained_fp8(model, folder, block)
    _check(folder, expected, hf, ["fine-grained FP8"], 0.2)
    qw.assert_within_format_error(model, expected, "fp8", "block" if block else "tensor", block=block)


def test_gptq_3bit_packing_is_a_bit_stream():
    """AutoGPTQ's 3-bit loop (32 values in 3 words, crossing word boundaries) is read back by the
    generic little-endian bit-stream unpacking, for every value pattern."""
    rng = np.random.default_rng(1)
    for bits in (2, 3, 4, 8):
        values = rng.integers(0, 2**bits, size=(64, 5))
        packed = qw.gptq_pack_rows(values, bits)
        np.testing.assert_array_equal(unpack_bits(packed.T.view(np.uint32), bits, 64), values.T)
        np.testing.assert_array_equal(unpack_bits(qw.mlx_pack_rows(values.T, bits), bits, 64), values.T)


def _requant(base, name, mutate, key="quantization_config"):
    root, model, _ = base
    folder = root / name
    qw.write_gptq(model, folder, 4, 32, True, False)
    config = json.loads((folder / "config.json").read_text())
    mutate(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "name, mutate, words",
    [
        ("hqq", lambda c: c["quantization_config"].update(quant_method="hqq"), "quant_method 'hqq'"),
        ("marlin", lambda c: c["quantization_config"].update(checkpoint_format="marlin"), "checkpoint_format 'marlin'"),
        ("bits", lambda c: c["quantization_config"].update(bits=5), "bits = 5"),
        (
            "awq-gemv",
            lambda c: c.update(
                quantization_config={"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}
            ),
            "AWQ version 'gemv'",
        ),
        (
            "ct-sparse",
            lambda c: c.update(
                quantization_config={"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups": {}}
            ),
            "format .marlin-24.",
        ),
        (
            "mlx-mode",
            lambda c: (
                c.update(quantization={"bits": 4, "group_size": 32, "mode": "mxfp4"}) or c.pop("quantization_config")
            ),
            "mode 'mxfp4'",
        ),
    ],
)
def test_variants_not_read_are_refused_in_one_line(base, name, mutate, words):
    folder = _requant(base, name, mutate)
    with pytest.raises(SpecboundError, match=words) as info:
        specbound.analyze(folder, threads=1)
    assert "\n" not in str(info.value)


def test_gptq_shapes_that_disagree_are_refused(base):
    """A group count that does not match the scales, before anything is unpacked."""
    folder = _requant(base, "groups", lambda c: c["quantization_config"].update(group_size=16))

    # without g_idx the group size is what assigns rows to groups: 16 makes 4 groups of 64 rows, not 2
    tensors = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if not k.endswith("g_idx")}
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(SpecboundError, match="groups"):
        open_checkpoint(folder)


def test_activation_and_kv_cache_scales_are_set_aside_and_said(base):
    """A W8A8 FP8 checkpoint stores input_scale per Linear and k_scale / v_scale per attention: not
    weights; the analysis reads the weights and its note counts what it set aside."""
    pytest.importorskip("compressed_tensors")
    import torch
    from safetensors.torch import load_file, save_file

    root, model, hf = base
    folder = root / "w8a8"
    expected = qw.write_compressed(model, folder, CT["fp8-channel"][1], "float-quantized")
    tensors = load_file(str(folder / "model.safetensors"))
    for i in range(2):
        for p in qw.PROJ:
            tensors[f"model.layers.{i}.{p}.input_scale"] = torch.tensor([0.01])
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(1.0)
    save_file(tensors, str(folder / "model.safetensors"))
    ours = _check(folder, expected, hf, ["16 activation / KV-cache quantization scales set aside"], 0.2)
    assert not any("input_scale" in t for row in ours.to_dict()["matrices"] for t in row.get("tensors", []))


def test_a_dequantized_weight_that_cannot_fit_in_memory_is_refused(base, monkeypatch):
    root, model, _ = base
    folder = root / "gptq-memory"
    qw.write_gptq(model, folder, 4, 32, True, False)
    ckpt = open_checkpoint(folder)
    monkeypatch.setattr(specbound.io.base, "available_memory", lambda: 1000)
    with pytest.raises(SpecboundError, match="float64 copy needs"):
        ckpt.read("model.layers.0.self_attn.q_proj.weight")


def test_a_quantized_model_saved_as_pytorch_bin_is_refused_by_name(base):
    import torch
    from safetensors.torch import load_file

    root, model, _ = base
    folder = root / "gptq-bin"
    qw.write_gptq(model, folder, 4, 32, True, False)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(SpecboundError, match="gptq checkpoint is read from safetensors files") as info:
        open_checkpoint(folder)
    assert "\n" not in str(info.value)


def test_a_float_save_that_kept_its_quantization_config_reads_its_floats(base):
    root, model, hf = base
    folder = root / "dequantized"
    shutil.copytree(root / "hf", folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    (folder / "config.json").write_text(json.dumps(config))
    ours = specbound.analyze(folder, threads=1)
    assert not any(e["name"] == "quantized_weights" for e in ours.assumptions)
    assert ours.log10_bounds == hf.log10_bounds


def test_compressed_tensors_activation_order_g_idx(base):
    """An older compressed-tensors save with ``weight_g_idx``: column j takes the scale of group
    g_idx[j] (the library sorted the columns by g_idx, dequantized by contiguous groups, and put
    them back), checked with the library's own unpack and dequantize on the sorted columns."""
    pytest.importorskip("compressed_tensors")
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors.torch import load_file, save_file

    root, model, _ = base
    folder = root / "ct-actorder"
    args = dict(num_bits=4, type="int", strategy="group", group_size=16, symmetric=True)
    qw.write_compressed(model, folder, args, "pack-quantized")
    tensors = load_file(str(folder / "model.safetensors"))
    rng = np.random.default_rng(5)
    name = "model.layers.0.mlp.down_proj"
    n_in = int(tensors[f"{name}.weight_shape"][1])
    g_idx = torch.from_numpy(rng.permutation(np.arange(n_in) // 16).astype(np.int32))
    tensors[f"{name}.weight_g_idx"] = g_idx
    save_file(tensors, str(folder / "model.safetensors"))
    q = unpack_from_int32(tensors[f"{name}.weight_packed"], 4, torch.Size(tensors[f"{name}.weight_shape"].tolist()))
    perm = torch.argsort(g_idx, stable=True)
    grouped = dequantize(q[:, perm], tensors[f"{name}.weight_scale"], args=QuantizationArgs(**args))
    expected = torch.empty_like(grouped)
    expected[:, perm] = grouped
    np.testing.assert_array_equal(open_checkpoint(folder).read(f"{name}.weight"), expected.double().numpy())


def test_every_method_is_one_row_and_the_refusal_lists_the_rows(base):
    """The methods read are the rows of ``METHODS`` (one each: its quant_method and its builder);
    the refusal of another quant_method lists them, derived from the rows."""

    assert QUANT_METHODS == tuple(METHODS) == ("gptq", "awq", "compressed-tensors", "fp8", "bitsandbytes", "mlx")
    assert all(row.name == name and callable(row.build) for name, row in METHODS.items())
    folder = _requant(base, "hqq-rows", lambda c: c["quantization_config"].update(quant_method="hqq"))
    with pytest.raises(SpecboundError, match=f"it reads {', '.join(METHODS)}"):
        open_checkpoint(folder)
