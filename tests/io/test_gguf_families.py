"""GGUF files of Qwen3, Gemma (1), Gemma 2, Gemma 3 and OLMo 2, written with the ``gguf`` package's
writer the way llama.cpp's ``convert_hf_to_gguf.py`` converts each model (tensor names from gguf's
own ``TensorNameMap``; 1 added to every Gemma norm weight; no Q/K permutation for these
architectures; the metadata keys the converter writes), analyse to the numbers of the Hugging Face
folder they came from, to 1e-9.

Gemma 3's file has no per-layer rope settings: llama.cpp fixes its local layers at base 10000 and
every sixth layer global, which the reader restores; the global layers' linear scaling comes from
``rope.scaling.*``.  A Llama 3.1-style ``rope_freqs`` tensor (llama.cpp's frequency divisors) is read
as the model's frequencies."""

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specbound  # noqa: E402
from specbound import SpecboundError  # noqa: E402
from specbound.io import open_checkpoint  # noqa: E402
from support.gguf_convert import write_converted  # noqa: E402
from support.same_numbers import assert_same_numbers  # noqa: E402

N, H, KV, D, D_FF, VOCAB, CONTEXT = 32, 4, 2, 16, 48, 64, 24
GLOBAL_SCALING = 8.0

FAMILIES = {  # HF model class, config class, GGUF architecture, extra config
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", "qwen3", {"head_dim": D}, 2),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", "gemma", {"head_dim": D}, 2),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", "gemma2", {"head_dim": D, "sliding_window": 8}, 2),
    "gemma3_text": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        "gemma3",
        {
            "head_dim": D,
            "sliding_window": 8,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": GLOBAL_SCALING, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
        6,
    ),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", "olmo2", {}, 2),
    "smollm3": (
        "SmolLM3ForCausalLM",
        "SmolLM3Config",
        "smollm3",
        {"head_dim": D, "pad_token_id": 0},
        4,
    ),  # layer 3: NoPE
    # multipliers exact in float32 (the file stores them so)
    "granite": (
        "GraniteForCausalLM",
        "GraniteConfig",
        "granite",
        {"residual_multiplier": 0.5, "attention_multiplier": 0.25, "embedding_multiplier": 8.0, "logits_scaling": 2.0},
        2,
    ),
    "exaone4": (
        "Exaone4ForCausalLM",
        "Exaone4Config",
        "exaone4",
        {"head_dim": D, "sliding_window": 8, "sliding_window_pattern": 4, "pad_token_id": 0},
        4,
    ),
    # llama.cpp fixes Cohere2's pattern at 4: the folder's config says the same (layer 3 global, unrotated)
    "cohere2": (
        "Cohere2ForCausalLM",
        "Cohere2Config",
        "cohere2",
        {"head_dim": D, "sliding_window": 8, "logit_scale": 0.5, "pad_token_id": 0},
        4,
    ),
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", "starcoder2", {"sliding_window": 8}, 2),
}


def _hf_model(family, tmp_path):
    cls, cfg, _, extra, layers = FAMILIES[family]
    config = getattr(transformers, cfg)(
        hidden_size=N,
        num_hidden_layers=layers,
        num_attention_heads=H,
        num_key_value_heads=KV,
        intermediate_size=D_FF,
        vocab_size=VOCAB,
        max_position_embeddings=CONTEXT,
        **extra,
    )
    torch.manual_seed(7)
    model = getattr(transformers, cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # every weight non-trivial, the norms' included
            p.normal_(0.0, 0.3)
    folder = tmp_path / "hf"
    transformers.logging.set_verbosity_error()
    model.save_pretrained(str(folder))
    return folder, model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_file_analyses_like_the_hugging_face_folder(family, tmp_path):
    folder, model = _hf_model(family, tmp_path)
    path = write_converted(tmp_path / f"{family}.gguf", model, FAMILIES[family][2])
    hf = specbound.analyze(folder, threads=1)
    ours = specbound.analyze(path, threads=1)
    assert ours.model["family"] == f"{FAMILIES[family][2]}_gguf"
    # the file does not state Gemma's attention temperature (llama.cpp derives it): the one entry the
    # Hugging Face analysis has beyond the file's, and it changes no number
    named = {e["name"] for e in ours.assumptions}
    hf.assumptions = [e for e in hf.assumptions if e["name"] in named]
    assert {e["name"] for e in hf.assumptions} == named
    if family == "gemma3_text":  # the gain is stored as 1 + w in the file, as w in the folder: the same g
        assert (hf.model["qk_norm"]["gain"], ours.model["qk_norm"]["gain"]) == ("one_plus_weight", "weight")
        hf.model["qk_norm"]["gain"] = "weight"
        for e in hf.assumptions:
            e["effect"] = e["effect"].replace("(gain 1 + w,", "(gain w,")
    assert_same_numbers(hf, ours, rel=1e-9, family=False)
    if family in ("exaone4", "cohere2"):  # the global layer (every fourth) unrotated
        assert [r is None for r in ours.model["rotary"]["by_layer"]] == [False, False, False, True]
    if family == "smollm3":  # llama.cpp's NoPE step: the fourth layer unrotated, as the folder's
        assert [r is None for r in ours.model["rotary"]["by_layer"]] == [False, False, False, True]
    if family == "gemma3_text":
        assert [r["base"] for r in ours.model["rotary"]["by_layer"]] == [1e4] * 5 + [1e6]
        assert ours.model["rotary"]["by_layer"][5]["scaling"] == "linear"
    if FAMILIES[family][0] in ("Qwen3ForCausalLM", "Gemma3ForCausalLM", "Olmo2ForCausalLM", "Exaone4ForCausalLM"):
        assert ours.model["qk_norm"] == hf.model["qk_norm"]


def test_gemma3s_stored_norm_gains_hold_the_added_one(tmp_path):
    """The file really stores 1 + w (else the gain convention would go untested)."""
    folder, model = _hf_model("gemma3_text", tmp_path)
    path = write_converted(tmp_path / "g3.gguf", model, "gemma3")
    stored = open_checkpoint(path).read("blk.0.attn_q_norm.weight")
    w = model.model.layers[0].self_attn.q_norm.weight.detach().numpy().astype(np.float32)
    np.testing.assert_array_equal(stored, (w + 1).astype(np.float64))


def test_rope_freqs_are_the_models_frequencies(tmp_path):
    """Llama 3.1 in GGUF: no rope.scaling.type, a rope_freqs tensor of per-pair divisors (the
    converter's factors theta_default / theta_llama3); the analysis equals the Hugging Face llama3
    model's, whose frequencies transformers computes."""
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 8,
    }
    config = transformers.LlamaConfig(
        hidden_size=N,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rope_parameters=rope,
    )
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    folder = tmp_path / "hf"
    transformers.logging.set_verbosity_error()
    model.save_pretrained(str(folder))
    llama3 = model.model.rotary_emb.inv_freq.double().numpy()
    default = 10000.0 ** -(np.arange(0, N // 4, 2) / (N // 4))
    path = write_converted(
        tmp_path / "llama31.gguf", model, "llama", extra_tensors={"rope_freqs.weight": default / llama3}
    )
    ours = specbound.analyze(path, threads=1)
    assert ours.model["rotary"]["scaling"] == "rope_freqs"
    hf = specbound.analyze(folder, threads=1)
    assert hf.model["rotary"]["scaling"] == "llama3"
    for a in (hf, ours):  # the scaling's name differs, its frequencies not
        a.model["rotary"]["scaling"] = None
        a.assumptions = [e for e in a.assumptions if e["name"] != "rope_scaling"]
    assert_same_numbers(hf, ours, rel=1e-6, family=False)  # float32 divisors: 1e-7 in each frequency


def test_a_yarn_attention_factor_llama_cpp_would_change_is_refused(tmp_path):
    folder, model = _hf_model("qwen3", tmp_path)
    path = tmp_path / "yarn.gguf"
    write_converted(path, model, "qwen3")
    reader_config = open_checkpoint(path).config
    assert "rope_scaling" not in reader_config
    # the same file with YaRN metadata and an attn_factor: one line, naming the key
    writer = gguf.GGUFWriter(str(tmp_path / "yarn2.gguf"), "qwen3")
    for key, value in (
        ("block_count", 2),
        ("context_length", CONTEXT),
        ("embedding_length", N),
        ("feed_forward_length", D_FF),
        ("attention.head_count", H),
        ("attention.head_count_kv", KV),
    ):
        writer.add_uint32(f"qwen3.{key}", value)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    writer.add_rope_scaling_attn_factors(0.7)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((H * D, N), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SpecboundError, match="rope.scaling.attn_factor") as info:
        specbound.analyze(tmp_path / "yarn2.gguf", threads=1)
    assert "\n" not in str(info.value)
    json.dumps(reader_config)  # the config the reader builds is plain JSON
