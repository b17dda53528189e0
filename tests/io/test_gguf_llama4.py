"""llama.cpp's GGUF files of Llama 4 (architecture ``llama4``), written by the ``gguf`` package's GGUFWriter
the way ``convert_hf_to_gguf.py``'s ``Llama4Model`` writes them (tests/support/gguf_convert.py: the metadata
of ``set_gguf_parameters``, the banks ``gate_up_proj`` split and transposed into ``ffn_{gate,up}_exps``,
``down_proj`` transposed, Q and K not permuted, ``rope_freqs`` for a llama3 rope).  Oracle: the tiny
``Llama4ForCausalLM`` saved with save_pretrained; every matrix and every number of the GGUF analysis equals
the folder's, but the family's name, the router's tensor names and the one assumption the reader adds
(llama.cpp's fixed constants, which the folder's config states as its own)."""

import pytest
from safetensors.numpy import load_file
from support.gguf_convert import llama4_metadata, llama4_tensors, write_gguf
from support.same_numbers import assert_close_tree, assert_same_layer_weights, numbers

import specbound
from specbound import SpecboundError
from specbound.io.gguf_archs import llama4_keys
from specbound.pipeline import open_model

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N, H, KV, D, L, E, MOE_FF, D_FF, VOCAB = 32, 4, 2, 16, 4, 4, 16, 48, 64
# a context past floor_scale (8192): the NoPE layers' query temperature is 1 + 0.1 ln 5, not 1
CONTEXT = 32768
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 16.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}
CASES = {  # name -> (Hugging Face config keys, relative tolerance)
    "every_layer_moe": ({"interleave_moe_layer_step": 1, "num_experts_per_tok": 2}, 1e-9),
    "interleaved": ({"interleave_moe_layer_step": 2, "num_experts_per_tok": 1}, 1e-9),
    # Llama 4 Scout's rope type, llama3, with a smoothing band (high_freq_factor 4; Scout's own 1.0 = low
    # has none): the band's frequencies are the ones the file's rope_freqs divisors must carry.
    # The converter's rope_freqs divisors are float32, 1e-7 off in the one smoothed pair; the numbers of
    # this model agree to 1e-15 all the same (measured), so the tolerance is the others'
    "llama3_rope": ({"interleave_moe_layer_step": 2, "num_experts_per_tok": 1, "rope_parameters": LLAMA3}, 1e-9),
}


def build(root, case, **meta_changes):
    """``(Hugging Face folder, GGUF file, tensors, metadata)`` of the tiny Llama 4 of ``case``."""

    config = transformers.Llama4TextConfig(
        hidden_size=N,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=D,
        intermediate_size=MOE_FF,
        intermediate_size_mlp=D_FF,
        num_local_experts=E,
        vocab_size=VOCAB,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-5,
        **CASES[case][0],
    )
    torch.manual_seed(11)
    model = transformers.Llama4ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(root / "hf")
    meta = {**llama4_metadata(model.config), **meta_changes}
    tensors = llama4_tensors(load_file(str(root / "hf" / "model.safetensors")), model.config)
    return root / "hf", write_gguf(root / "model.gguf", "llama4", tensors, meta, VOCAB), tensors, meta


@pytest.fixture(scope="module", params=sorted(CASES))
def converted(request, tmp_path_factory):
    folder, path, tensors, _ = build(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, folder, path, tensors


def test_the_converter_wrote_llama4s_tensors(converted):
    case, _, _, tensors = converted
    step = CASES[case][0]["interleave_moe_layer_step"]
    for layer in range(L):
        moe = (layer + 1) % step == 0
        assert (f"blk.{layer}.ffn_gate_exps.weight" in tensors) == moe
        assert (f"blk.{layer}.ffn_gate.weight" in tensors) == (not moe)
    assert tensors[f"blk.{L - 1}.ffn_gate_exps.weight"].shape == (E, MOE_FF, N)
    assert tensors[f"blk.{L - 1}.ffn_down_exps.weight"].shape == (E, N, MOE_FF)
    assert ("rope_freqs.weight" in tensors) == (case == "llama3_rope")


def test_every_matrix_equals_the_hugging_face_checkpoints(converted):
    case, folder, path, _ = converted
    a, b = open_model(folder), open_model(path)
    assert b.spec.family == "llama4_gguf"
    assert a.dims == b.dims
    step = CASES[case][0]["interleave_moe_layer_step"]
    assert b.dims.moe.layers == tuple(range(step - 1, L, step)) and b.dims.moe.scoring == "sigmoid"
    assert b.nope_layers() == a.nope_layers() == [3]
    assert_same_layer_weights(a, b, L)


def test_the_analysis_equals_the_hugging_face_checkpoints(converted):
    case, folder, path, _ = converted
    result = specbound.analyze(path, threads=1)
    assert result.model["family"] == "llama4_gguf"
    fixed = [e for e in result.assumptions if e["name"] == "gguf_llama4_constants"]
    assert len(fixed) == 1 and fixed[0]["kind"] == "convention" and "query/key norm on (4 experts" in fixed[0]["effect"]
    result.assumptions = [e for e in result.assumptions if e["name"] != "gguf_llama4_constants"]
    hf = specbound.analyze(folder, threads=1)
    names = {e["name"] for e in hf.assumptions if e["applies"]}
    assert {
        "nope_layers",
        "qk_norm",
        "chunked_attention",
        "attention_temperature_tuning",
        "mixture_of_experts",
    } <= names
    if case == "llama3_rope":  # the scaling's name differs (llama3 / llama.cpp's rope_freqs), its frequencies not
        for a in (hf, result):
            a.model["rotary"]["scaling"] = None
            for row in a.model["rotary"].get("by_layer") or []:
                if row is not None:  # a NoPE layer's entry is None
                    row["scaling"] = None
            a.assumptions = [e for e in a.assumptions if e["name"] != "rope_scaling"]
    x, y = numbers(hf, family=False), numbers(result, family=False)
    for key in ("router", "shared_gate"):  # the router's tensor names: provenance, like "tensors"
        assert (x["model"]["experts"].pop(key, None) is None) == (y["model"]["experts"].pop(key, None) is None)
    assert_close_tree(x, y, CASES[case][1])


@pytest.mark.parametrize("experts, on", [(16, True), (128, False)])
def test_llama_cpp_turns_the_query_key_norm_off_for_128_experts(experts, on):
    """llama.cpp's llama4 loader: use_kq_norm unless the model is its 17B-128E type (Maverick, whose config
    says use_qk_norm false); the other constants fixed."""

    keys, conventions = llama4_keys(None, {"expert_count": experts, "interleave_moe_layer_step": 2})
    assert keys["use_qk_norm"] is on
    assert {k: keys[k] for k in ("no_rope_layer_interval", "attention_chunk_size", "floor_scale", "attn_scale")} == {
        "no_rope_layer_interval": 4,
        "attention_chunk_size": 8192,
        "floor_scale": 8192,
        "attn_scale": 0.1,
    }
    assert keys["attn_temperature_tuning"] is True
    assert f"norm {'on' if on else 'off'} ({experts} experts" in conventions["gguf_llama4_constants"]


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"sliding_window": 0}, "sliding_window 0"),  # llama.cpp's MobileLLM variant
        ({"interleave_moe_layer_step": 0}, "interleave_moe_layer_step"),
    ],
)
def test_an_unmodelled_or_malformed_file_is_refused_in_one_line(tmp_path, meta, match):
    _, path, _, _ = build(tmp_path, "interleaved", **meta)
    with pytest.raises(SpecboundError, match=match) as info:
        specbound.analyze(path, threads=1)
    assert "\n" not in str(info.value)
