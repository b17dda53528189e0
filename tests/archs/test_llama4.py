"""Llama 4 (docs/theory.md 3n) on the model's own modules: the NoPE layer's attention, its queries scaled
by the temperature at every position of a full context, stays below the reported factor; a layer of experts
with its routing frozen (sigmoid gates on the experts' inputs, top 2, and the shared expert) stays below
``gate_sum max_e Lip(F_e) + Lip(F_shared)``; the layers of experts and the dense ones are read as the config
says, and a config that switches the L2 norm off gets plain heads."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.families import build_family  # noqa: E402
from support.lipschitz import attention_factor, measured_attention, measured_lipschitz  # noqa: E402

import specbound  # noqa: E402
from specbound.archs.rotary import parse_rotary
from specbound.errors import SpecboundError  # noqa: E402

L_PHI = 1.0999  # SiLU's, the table's


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    transformers.logging.set_verbosity_error()
    model = build_family("llama4_text", seed=4)
    model.config._attn_implementation = "eager"
    folder = tmp_path_factory.mktemp("llama4")
    model.save_pretrained(folder)
    return folder, model.double()


def test_layers_of_experts_and_dense_layers_as_the_config_says(saved):
    folder, model = saved
    a = specbound.analyze(folder, threads=1)
    assert (
        a.model["experts"]["layers"] == [1] and a.model["experts"]["dense_d_ff"] == model.config.intermediate_size_mlp
    )
    assert a.model["experts"]["gate_sum"] == 2
    roles = a.matrices.groupby("layer")["role"].apply(set)
    assert roles[0] == {"QK", "OV", "FF_gate", "FF_up", "FF_out"}
    assert "FF_gate[e3]" in roles[1] and "FF_out[shared]" in roles[1] and "FF_gate" not in roles[1]
    assert a.model["qk_norm"]["layers"] == "rotary" and a.model["qk_norm"]["gain"] == "none"
    names = {e["name"] for e in a.assumptions if e["applies"]}
    assert {
        "nope_layers",
        "qk_norm",
        "chunked_attention",
        "attention_temperature_tuning",
        "mixture_of_experts",
    } <= names


def test_the_nope_layers_attention_with_its_temperature_stays_below_the_factor(saved):
    """Every position of the context (64), so the temperature reaches its largest value."""
    folder, model = saved
    a = specbound.analyze(folder, threads=1)
    layer = 1
    attn = model.model.layers[layer].self_attn
    assert not attn.use_rope and attn.attn_temperature_tuning
    factor = attention_factor(a, layer)
    found = measured_attention(model, layer, model.config.max_position_embeddings, restarts=1, steps=15)
    assert 0 < found <= factor, (found, factor)


def test_a_layer_of_experts_with_its_routing_frozen_stays_below_its_factor(saved):
    folder, model = saved
    a = specbound.analyze(folder, threads=1)
    moe = model.model.layers[1].feed_forward
    E, N = moe.num_experts, model.config.hidden_size
    rows = a.matrices[a.matrices["layer"] == 1].set_index("role")["spectral_norm"]

    def lip(branch):
        return (L_PHI + 1) * rows[f"FF_gate[{branch}]"] * rows[f"FF_up[{branch}]"] * rows[f"FF_out[{branch}]"]

    factor = 2 * max(lip(f"e{e}") for e in range(E)) + lip("shared")
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(4):
        with torch.no_grad():  # the module's router at a random token fixes the experts and their gates
            scores, _ = moe.router(torch.randn(1, N, dtype=torch.float64, generator=gen))
        gates = scores[0].clone()
        if trial == 3:  # both chosen gates near 1: the top_k sum
            gates = torch.where(gates > 0, torch.full_like(gates, 0.999), gates)

        def f(x):  # noqa: B023 (called within the loop): Llama4TextMoe.forward with the scores held
            routed = moe.experts(x.repeat(E, 1) * gates.reshape(-1, 1))
            return moe.shared_expert(x) + routed.reshape(E, -1, N).sum(dim=0)

        worst = max(worst, measured_lipschitz(f, [(1, N)], [0], restarts=1, steps=30, seed=trial))
    assert 0 < worst <= factor, (worst, factor)


def test_a_config_without_the_l2_norm_has_plain_heads(tmp_path):
    model = build_family("llama4_text", seed=1)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["use_qk_norm"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))
    a = specbound.analyze(tmp_path, threads=1)
    assert "qk_norm" not in a.model
    qk = a.matrices[(a.matrices["role"] == "QK") & (a.matrices["layer"] == 0)]
    assert qk["sv_method"].str.startswith("rotary").all() and (qk["cols"] == model.config.hidden_size).all()


@pytest.mark.parametrize(
    "moe_layers, message", [([5], "moe_layers=\\[5\\] must list the indices"), ("all", "moe_layers='all' must list")]
)
def test_a_bad_list_of_expert_layers_is_one_line(tmp_path, moe_layers, message):
    build_family("llama4_text").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["moe_layers"] = moe_layers
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecboundError, match=message) as err:
        specbound.analyze(tmp_path, threads=1)
    assert "\n" not in str(err.value)


def test_a_dense_layer_where_the_checkpoint_holds_experts_is_one_line(tmp_path):
    build_family("llama4_text").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["moe_layers"] = []
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        SpecboundError,
        match="missing tensor 'model.layers.1.feed_forward.gate_proj.weight' "
        "\\(ff_gate of the dense feed-forward of layer 1\\)",
    ):
        specbound.analyze(tmp_path, threads=1)


def test_without_the_list_every_step_th_layer_holds_the_experts(tmp_path):
    build_family("llama4_text", layers=4).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["moe_layers"]
    config["interleave_moe_layer_step"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    a = specbound.analyze(tmp_path, threads=1)
    assert a.model["experts"]["layers"] == [1, 3]


def test_an_empty_list_of_expert_layers_is_a_dense_model(tmp_path):
    config = build_family("llama4_text").config
    config.moe_layers = []
    torch.manual_seed(0)
    transformers.Llama4ForCausalLM(config).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["moe_layers"] == []
    a = specbound.analyze(tmp_path, threads=1)
    assert a.model["experts"]["layers"] == [] and a.model["experts"]["router"] is None
    assert not any("[" in r for r in a.matrices["role"]) and np.isfinite(a.bounds["spectral_adaptive"])
    assert not {"mixture_of_experts", "moe_routing_fixed"} & {e["name"] for e in a.assumptions if e["applies"]}
    assert a.baselines["param_count"] == 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 48)


def test_scouts_rope_scaling_analyses(tmp_path):
    """Llama 4 Scout's config: llama3 rope scaling with high_freq_factor == low_freq_factor (no smoothing
    band); the rotated layers' frequencies are the module's own."""
    model = build_family("llama4_text", seed=2)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    scout = {
        "rope_type": "llama3",
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 1.0,
        "original_max_position_embeddings": 8,
    }
    config["rope_parameters"] = {**scout, "rope_theta": config["rope_parameters"]["rope_theta"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    a = specbound.analyze(tmp_path, threads=1)
    assert np.isfinite(a.bounds["spectral_adaptive"])
    module = reloaded.model.rotary_emb.inv_freq.double().numpy()
    d = reloaded.config.head_dim
    default = 1.0 / config["rope_parameters"]["rope_theta"] ** (np.arange(0, d, 2) / d)
    assert (module < 0.5 * default).any() and np.isclose(module, default).any()  # some scaled, some not

    ours = parse_rotary(config, reloaded.config.head_dim, "interleaved")
    np.testing.assert_allclose(ours.thetas, module, rtol=2e-6)
