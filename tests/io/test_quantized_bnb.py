"""bitsandbytes saves (NF4 with nested quantization, FP4, LLM.int8) written by transformers with the
real bitsandbytes on CPU.  Every quantized weight reads as the format's published layout decodes it
(support.bnb_layout: the bytes, absmax per block, nested statistics, code books, storage dtype, each
decoded without specbound's reader or bitsandbytes' kernels, bit-exact on any CPU), and both lie
within the format's error bound of the float weights before quantization.  bitsandbytes' own
``dequantize_4bit`` is compared too, but only for shapes where it passes its own round trip on this
CPU: its AVX-512 kernel (0.50.2) reads the wrong absmax when the row length is not a multiple of the
block size (docs/development.md, "CPU-independent tests").  A QLoRA adapter on the 4-bit base
analyses like any adapter, its base dequantized."""

import functools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip("bitsandbytes")

import shutil

from safetensors.numpy import load_file
from support import bnb_layout as bl  # noqa: E402
from support import quant_writers as qw  # noqa: E402

import specbound  # noqa: E402
from specbound.io import open_checkpoint  # noqa: E402
from specbound.io.quantized import QuantizedCheckpoint
from specbound.options import KernelOptions
from specbound.pipeline import adapter_base, adapter_updates, open_model

CONFIGS = {
    "nf4-nested": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4"),
    "int8": dict(load_in_8bit=True),
    # QLoRA with FSDP: the packed bytes in bfloat16 words (bnb_4bit_quant_storage)
    "nf4-bf16-storage": dict(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_storage=torch.bfloat16,
    ),
}
NAMES = [f"model.layers.{layer}.{proj}.weight" for layer in range(2) for proj in qw.PROJ]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("bnb")
    qw.tiny_llama(root / "hf")
    hf = specbound.analyze(root / "hf", threads=1)
    out = {}
    for name, kwargs in CONFIGS.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(root / "hf"),
            quantization_config=transformers.BitsAndBytesConfig(**kwargs),
            device_map="cpu",
            dtype=torch.float16,
        )
        model.save_pretrained(str(root / name))
        out[name] = root / name
    original = {k: v.astype(np.float64) for k, v in load_file(str(root / "hf" / "model.safetensors")).items()}
    return root, hf, out, original


def _layout(tensors, name, w):
    """The layout's decode of ``name`` and its per-value error bound against the float weights ``w``,
    after checking the stored code books and statistics against the published ones and ``w``."""
    if f"{name[: -len('.weight')]}.SCB" in tensors:
        prefix = name[: -len(".weight")]
        scb = np.frombuffer(tensors[f"{prefix}.SCB"][2], dtype="<f4")
        np.testing.assert_array_equal(scb, np.abs(w.astype(np.float16)).max(axis=1), err_msg=f"{name}: SCB")
        return bl.decode_int8(tensors, prefix), bl.int8_bound(w, tensors, prefix)
    d = bl.Decoded(tensors, name)
    np.testing.assert_array_equal(d.stored_code_book, bl.CODE_BOOKS[d.quant_type], err_msg=f"{name}: quant_map")
    true = bl.block_absmax(w, d)
    if d.nested_map is None:
        np.testing.assert_array_equal(d.absmax, true, err_msg=f"{name}: absmax is each block's max |w|")
    else:
        # the stored 8-bit map is the dynamic map (built here in float64, bitsandbytes in float32: 4 ulps at 1)
        np.testing.assert_allclose(d.nested_map, bl.dynamic_map(), rtol=0, atol=2.0**-22)
        # the offset is the mean of the absmax (a float32 sum of len(true) terms), the nested absmax
        # the largest |absmax - offset| (one float32 subtraction)
        assert float(d.offset) == pytest.approx(true.mean(), rel=len(true) * 2.0**-23), name
        chunks = np.arange(len(true)) // d.state["nested_blocksize"]
        for c, s2 in enumerate(d.nested_absmax):
            assert float(s2) == pytest.approx(
                np.abs(true[chunks == c] - d.offset).max(), abs=2.0**-22 * (true.max() + float(d.offset))
            ), name
    return d.values, bl.four_bit_bound(w, d)


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_bitsandbytes_weights_read_as_the_layout_decodes_within_the_format_error(saved, variant):
    root, hf, folders, original = saved
    folder = folders[variant]
    tensors = bl.safetensors_bytes(folder / "model.safetensors")
    ckpt = open_checkpoint(folder)
    for name in NAMES:
        w = original[name]
        expected, bound = _layout(tensors, name, w)
        np.testing.assert_array_equal(ckpt.read(name), expected, err_msg=name)
        ratio = np.abs(w - expected) / bound
        assert ratio.max() <= 1, f"{name}: |w - dequantized| reaches {ratio.max():.4f} of the format's bound"
        if variant != "int8" and w.shape[1] % 64:
            # the oracle tells a wrong scale apart: bitsandbytes' AVX-512 indexing breaks the bound here
            wrong = bl.row_block_kernel(bl.Decoded(tensors, name))
            assert (np.abs(w - wrong) > bound).any(), name
    ours = specbound.analyze(folder, threads=1)
    note = next(e for e in ours.assumptions if e["name"] == "quantized_weights")
    assert "bitsandbytes" in note["effect"]
    for bound, value in hf.log10_bounds.items():
        if value is not None and np.isfinite(value):
            assert ours.log10_bounds[bound] == pytest.approx(value, abs=0.6 if variant != "int8" else 0.1), bound


@functools.lru_cache(maxsize=None)
def _round_trip_holds(shape, quant_type, nested):
    """Whether bitsandbytes' quantize_4bit -> dequantize_4bit of a random ``shape`` matrix stays within the
    format's bound and equals the layout's decode on this CPU."""
    r = bl.bnb_round_trip(shape, quant_type, nested)
    return r["ratio"] <= 1 and r["equals_decode"]


def _bnb_dequantize(folder, name):
    """bitsandbytes' dequantization of ``name`` from the saved tensors."""
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    prefix = name[: -len(".weight")]
    if f"{prefix}.SCB" in state:
        return bnb.functional.int8_vectorwise_dequant(state[name], state[f"{prefix}.SCB"]).double().numpy()
    parts = {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")}
    qs = bnb.functional.QuantState.from_dict(parts, device=torch.device("cpu"))
    return bnb.functional.dequantize_4bit(state[name].view(torch.uint8), qs).double().numpy()


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_bitsandbytes_own_dequantize_agrees_where_its_round_trip_holds(saved, variant):
    """LLM.int8's ``int8_vectorwise_dequant`` is two float32 products (exact on any CPU) and always
    compared; ``dequantize_4bit`` only for shapes whose round trip holds on this CPU."""
    _, _, folders, _ = saved
    folder = folders[variant]
    ckpt = open_checkpoint(folder)
    quant_type, nested = ("fp4", False) if variant == "fp4" else ("nf4", True)
    compared = 0
    for name in NAMES:
        if variant == "int8" or _round_trip_holds(ckpt.shape(name), quant_type, nested):
            np.testing.assert_array_equal(ckpt.read(name), _bnb_dequantize(folder, name), err_msg=name)
            compared += 1
    if not compared:
        pytest.skip(f"bitsandbytes' dequantize_4bit fails its own round trip here for every shape of {variant}")


def _qlora_adapter(saved, folder):
    """A LoRA adapter (q_proj, v_proj; random factors) of the tiny LLaMA saved in ``folder``, its base the
    NF4-nested save; returns the PEFT model that wrote it."""
    peft = pytest.importorskip("peft")
    root, _, folders, _ = saved
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(root / "hf"), dtype=torch.float32)
    wrapped = peft.get_peft_model(
        model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    wrapped.save_pretrained(str(folder))
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(folders["nf4-nested"])
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return wrapped


def test_a_qlora_adapter_on_the_4bit_base_analyses_like_any_adapter(saved):
    root, _, folders, _ = saved
    wrapped = _qlora_adapter(saved, root / "adapter")
    ours = specbound.analyze(root / "adapter", threads=1)
    assert any(e["name"] == "quantized_weights" and "bitsandbytes" in e["effect"] for e in ours.assumptions)
    base = open_checkpoint(folders["nf4-nested"])
    merged = open_checkpoint(root / "adapter")
    name = "model.layers.0.self_attn.q_proj.weight"
    layer = wrapped.base_model.model.model.layers[0].self_attn.q_proj
    # the update in float64 (a float32 product of inner dimension 4 would be off by ~1e-7, kernel by kernel)
    b, a = (m.default.weight.detach().double().numpy() for m in (layer.lora_B, layer.lora_A))
    delta = b @ a * layer.scaling["default"]
    np.testing.assert_allclose(merged.read(name), base.read(name) + delta, rtol=1e-12, atol=1e-14)
    untouched = "model.layers.0.self_attn.k_proj.weight"
    np.testing.assert_array_equal(merged.read(untouched), base.read(untouched))
    base.close()
    merged.close()


def test_a_qlora_adapters_base_is_its_own_opened_checkpoint(saved, tmp_path):
    """The adapter's base opened as its initial weights is the quantized checkpoint the adapter holds (not the
    safetensors checkpoint the quantization is stored in), so the update is read from the factors."""

    _qlora_adapter(saved, tmp_path / "adapter")
    opened = open_model(tmp_path / "adapter")
    try:
        init = adapter_base(opened)
        assert isinstance(init.opened_checkpoint, QuantizedCheckpoint)
        assert init.opened_checkpoint is opened.opened_checkpoint.base_ckpt
        assert adapter_updates(opened, init, 0, KernelOptions(method="factored")) is not None
    finally:
        opened.opened_checkpoint.close()


@pytest.mark.parametrize(
    "state, words",
    [
        (b"[" * 5000 + b"]" * 5000, "nested more than"),
        (b"\xff\xfe", "JSON"),
        (b"[1, 2]", "holds no JSON object"),
        (json.dumps({"shape": [64, 64], "blocksize": 0, "dtype": "float16"}).encode(), "blocksize 0"),
    ],
)
def test_a_hostile_quant_state_is_one_line(saved, tmp_path, state, words):
    from safetensors.torch import load_file, save_file

    _, _, folders, _ = saved
    folder = tmp_path / "hostile"
    shutil.copytree(folders["fp4"], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__fp4"] = torch.frombuffer(
        bytearray(state), dtype=torch.uint8
    )
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(specbound.SpecboundError, match=words) as info:
        open_checkpoint(folder)
    assert "\n" not in str(info.value)
