"""bitsandbytes saves (NF4 with nested quantization, FP4, LLM.int8) written by transformers with the
real bitsandbytes on CPU: every quantized weight reads as bitsandbytes' own dequantization
(``dequantize_4bit`` of the ``QuantState`` rebuilt from the saved tensors, ``int8_vectorwise_dequant``);
a QLoRA adapter on the 4-bit base analyses like any adapter, its base dequantized."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip("bitsandbytes")

import specbound  # noqa: E402
from specbound.io import open_checkpoint  # noqa: E402
from support import quant_writers as qw  # noqa: E402

CONFIGS = {
    "nf4-nested": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4"),
    "int8": dict(load_in_8bit=True),
    # QLoRA with FSDP: the packed bytes in bfloat16 words (bnb_4bit_quant_storage)
    "nf4-bf16-storage": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_quant_storage=torch.bfloat16),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("bnb")
    qw.tiny_llama(root / "hf")
    hf = specbound.analyze(root / "hf", threads=1)
    out = {}
    for name, kwargs in CONFIGS.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(root / "hf"), quantization_config=transformers.BitsAndBytesConfig(**kwargs), device_map="cpu",
            dtype=torch.float16)
        model.save_pretrained(str(root / name))
        out[name] = root / name
    return root, hf, out


def _reference(folder, name):
    """bitsandbytes' dequantization of ``name`` from the saved tensors."""
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    prefix = name[: -len(".weight")]
    if f"{prefix}.SCB" in state:
        return bnb.functional.int8_vectorwise_dequant(state[name], state[f"{prefix}.SCB"]).double().numpy()
    parts = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
    qs = bnb.functional.QuantState.from_dict(parts, device=torch.device("cpu"))
    return bnb.functional.dequantize_4bit(state[name].view(torch.uint8), qs).double().numpy()


@pytest.mark.parametrize("variant", sorted(CONFIGS))
def test_bitsandbytes_weights_read_as_bitsandbytes_dequantizes(saved, variant):
    root, hf, folders = saved
    folder = folders[variant]
    ckpt = open_checkpoint(folder)
    for layer in range(2):
        for proj in qw.PROJ:
            name = f"model.layers.{layer}.{proj}.weight"
            np.testing.assert_array_equal(ckpt.read(name), _reference(folder, name), err_msg=name)
    ours = specbound.analyze(folder, threads=1)
    note = next(e for e in ours.assumptions if e["name"] == "quantized_weights")
    assert "bitsandbytes" in note["effect"]
    for bound, value in hf.log10_bounds.items():
        if value is not None and np.isfinite(value):
            assert ours.log10_bounds[bound] == pytest.approx(value, abs=0.6 if variant != "int8" else 0.1), bound


def test_a_qlora_adapter_on_the_4bit_base_analyses_like_any_adapter(saved):
    peft = pytest.importorskip("peft")
    root, _, folders = saved
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(root / "hf"), dtype=torch.float32)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                         init_lora_weights=False))
    wrapped.save_pretrained(str(root / "adapter"))
    config = json.loads((root / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(folders["nf4-nested"])
    (root / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    ours = specbound.analyze(root / "adapter", threads=1)
    assert any(e["name"] == "quantized_weights" and "bitsandbytes" in e["effect"] for e in ours.assumptions)
    base = open_checkpoint(folders["nf4-nested"])
    merged = open_checkpoint(root / "adapter")
    name = "model.layers.0.self_attn.q_proj.weight"
    layer = wrapped.base_model.model.model.layers[0].self_attn.q_proj
    delta = (layer.lora_B.default.weight @ layer.lora_A.default.weight).detach().double().numpy() * layer.scaling["default"]
    np.testing.assert_allclose(merged.read(name), base.read(name) + delta, rtol=1e-6, atol=1e-6)
    untouched = "model.layers.0.self_attn.k_proj.weight"
    np.testing.assert_array_equal(merged.read(untouched), base.read(untouched))


@pytest.mark.parametrize("state, words", [
    (b"[" * 5000 + b"]" * 5000, "nested more than"), (b"\xff\xfe", "JSON"), (b"[1, 2]", "holds no JSON object"),
    (json.dumps({"shape": [64, 64], "blocksize": 0, "dtype": "float16"}).encode(), "blocksize 0"),
])
def test_a_hostile_quant_state_is_one_line(saved, tmp_path, state, words):
    import shutil

    from safetensors.torch import load_file, save_file

    _, _, folders = saved
    folder = tmp_path / "hostile"
    shutil.copytree(folders["fp4"], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__fp4"] = torch.frombuffer(
        bytearray(state), dtype=torch.uint8)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(specbound.SpecboundError, match=words) as info:
        open_checkpoint(folder)
    assert "\n" not in str(info.value)
