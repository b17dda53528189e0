"""Mixtures of experts with dense layers between them and gates that are not probabilities (GLM-4-MoE,
ERNIE 4.5 MoE; DeepSeek-V3's router): which layers hold experts follows the model's own modules for every
config rule; the matrices and the router reproduce the model's block with the gates its own router gives;
the gate bounds (routed_scaling_factor, un-normalised sigmoid scores) hold on those gates and enter the
feed-forward factor, which the frozen block never exceeds; the parameter count is the stored tensors'
(docs/theory.md 3f)."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import copy
from importlib.resources import files

from safetensors import safe_open

import specbound  # noqa: E402
from specbound import SpecboundError  # noqa: E402
from specbound.archs.extract import layer_weights  # noqa: E402
from specbound.archs.spec import parse_spec
from specbound.compute.propagation import feed_forward_lipschitz  # noqa: E402
from specbound.pipeline import open_model  # noqa: E402

N, H, E, K, D_FF, DENSE = 16, 2, 4, 2, 12, 20


def _glm(layers=3, **extra):
    config = dict(
        hidden_size=N,
        num_hidden_layers=layers,
        num_attention_heads=H,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=DENSE,
        moe_intermediate_size=D_FF,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        n_shared_experts=2,
        routed_scaling_factor=2.5,
        vocab_size=32,
        max_position_embeddings=8,
        experts_implementation="eager",
    )
    config.update(extra)
    return transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(**config))


def _ernie(layers=4, **extra):
    config = dict(
        hidden_size=N,
        num_hidden_layers=layers,
        num_attention_heads=H,
        num_key_value_heads=1,
        intermediate_size=DENSE,
        moe_intermediate_size=D_FF,
        moe_num_experts=E,
        moe_k=K,
        moe_layer_start_index=1,
        moe_num_shared_experts=1,
        vocab_size=32,
        max_position_embeddings=8,
        experts_implementation="eager",
    )
    config.update(extra)
    return transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(**config))


def _save(model, folder, seed=0):
    torch.manual_seed(seed)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    for name, b in model.named_buffers():  # the score correction: it changes the choice, never a gate
        if "e_score_correction_bias" in name:
            b.normal_(std=0.3)
    transformers.logging.set_verbosity_error()
    model.eval().save_pretrained(folder)
    return model.double()


BUILDS = {
    "glm_normalised": lambda: _glm(),
    "glm_sigmoid_raw": lambda: _glm(norm_topk_prob=False, routed_scaling_factor=1.5),
    "ernie": lambda: _ernie(),
}


@pytest.fixture(scope="module", params=sorted(BUILDS))
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, _save(BUILDS[request.param](), folder)


def _silu(t):
    return t / (1 + np.exp(-t))


def _expert(ff, branch, x):
    return (_silu(x @ ff[f"FF_gate[{branch}]"]) * (x @ ff[f"FF_up[{branch}]"])) @ ff[f"FF_out[{branch}]"]


def _frozen_block(ff, top, weights, x):
    """The block with its routing frozen: the chosen experts weighted by fixed gates, plus the shared expert."""
    out = _expert(ff, "shared", x)
    for t in range(x.shape[0]):
        for e, w in zip(top[t], weights[t]):
            out[t] += w * _expert(ff, f"e{e}", x[t : t + 1])[0]
    return out


def test_which_layers_hold_experts_follows_the_modules(saved):
    kind, folder, model = saved
    a = specbound.analyze(folder, threads=1)
    for layer, block in enumerate(model.model.layers):
        roles = set(a.matrices[a.matrices["layer"] == layer]["role"])
        if hasattr(block.mlp, "experts"):
            assert {"FF_gate[e0]", f"FF_out[e{E - 1}]", "FF_up[shared]"} <= roles and "FF_gate" not in roles
        else:
            assert roles == {"QK", "OV", "FF_gate", "FF_up", "FF_out"}, (kind, layer)


def test_the_matrices_and_the_modules_router_reproduce_the_block_and_the_gate_bounds_hold(saved):
    kind, folder, model = saved
    opened = open_model(folder)
    moe = opened.dims.moe
    rng = np.random.default_rng(1)
    worst_sum = worst_max = 0.0
    for layer, block in enumerate(model.model.layers):
        if not hasattr(block.mlp, "experts"):
            continue
        weights = layer_weights(opened.spec, opened.ckpt, opened.dims, opened.prefix, layer)
        ff = {role: weights.ff[role] for role in weights.ff}
        x = rng.standard_normal((64, N)) * 3
        with torch.no_grad():
            xt = torch.tensor(x)
            _, gate_values, top = block.mlp.gate(xt)  # the module's own routing: experts and their gates
            gate_values, top = gate_values.double().numpy(), top.numpy()
            whole = block.mlp(xt[None])[0].numpy()
        np.testing.assert_allclose(_frozen_block(ff, top, gate_values, x), whole, rtol=1e-4, atol=1e-5)
        assert np.all(gate_values >= 0)
        worst_max = max(worst_max, gate_values.max())
        worst_sum = max(worst_sum, gate_values.sum(axis=1).max())
    assert worst_max <= moe.gate_max * (1 + 1e-6) and worst_sum <= moe.gate_sum * (1 + 1e-6)
    if kind == "glm_normalised":  # the scale reaches the gates: probabilities would be wrong
        assert (moe.gate_max, moe.gate_sum) == (2.5, 2.5) and worst_sum > 2.5 * (1 - 1e-6)
    elif kind == "glm_sigmoid_raw":  # un-normalised sigmoid scores: their sum passes one scale, up to k of them
        assert (moe.gate_max, moe.gate_sum) == (1.5, 1.5 * K) and worst_sum > 1.5
    else:
        assert (moe.gate_max, moe.gate_sum) == (1.0, 1.0)
    opened.ckpt.close()


def test_the_reported_factor_holds_for_the_frozen_block_and_carries_the_gates(saved):
    """The layer's reported Lambda over its attention factor is the feed-forward factor with the gate sum;
    the block with its routing frozen at the module's own gates never moves by more than it, and without the
    gates (the probability reading) the factor would be smaller by exactly the gate sum."""
    kind, folder, model = saved
    a = specbound.analyze(folder, threads=1)
    opened = open_model(folder)
    moe = opened.dims.moe
    layer = next(l for l, b in enumerate(model.model.layers) if hasattr(b.mlp, "experts"))
    rows = a.matrices[a.matrices["layer"] == layer]
    norms = {r: s for r, s in zip(rows["role"], rows["spectral_norm"]) if r.startswith("FF_")}
    l_phi = a.options["l_phi"]
    factor = feed_forward_lipschitz(norms, l_phi, gate_sum=moe.gate_sum)
    branches = {}
    for role, s in norms.items():
        kind_, branch = role[:-1].split("[")
        branches.setdefault(branch, {})[kind_] = s
    lip = {b: (l_phi + 1) * v["FF_gate"] * v["FF_up"] * v["FF_out"] for b, v in branches.items()}
    assert factor == pytest.approx(moe.gate_sum * max(v for b, v in lip.items() if b != "shared") + lip["shared"])
    qk = rows[rows["role"] == "QK"]["lipschitz_factor"].to_numpy()
    ov = rows[rows["role"] == "OV"]["spectral_norm"].to_numpy()
    assert a.layers["lambda"][layer] == pytest.approx(np.sum(ov * (1 + 4 * qk)) * factor, rel=1e-12)
    ff = {r: w for r, w in layer_weights(opened.spec, opened.ckpt, opened.dims, opened.prefix, layer).ff.items()}
    rng = np.random.default_rng(3)
    worst = 0.0
    for _ in range(100):
        x = rng.standard_normal((1, N))
        x /= np.linalg.norm(x)
        y = x + 1e-3 * rng.standard_normal((1, N))
        y /= max(1.0, np.linalg.norm(y))
        with torch.no_grad():
            _, g, top = model.model.layers[layer].mlp.gate(torch.tensor(x))
        frozen = (top.numpy(), g.double().numpy())
        ratio = np.linalg.norm(_frozen_block(ff, *frozen, x) - _frozen_block(ff, *frozen, y)) / np.linalg.norm(x - y)
        worst = max(worst, ratio)
    assert worst <= factor
    # each routed expert's sensitivities carry the largest gate (1 for probabilities)
    gamma = dict(zip(rows["role"], rows["gamma"]))
    assert gamma["FF_out[e0]"] == pytest.approx(moe.gate_max) and gamma["FF_out[shared]"] == pytest.approx(1.0)
    opened.ckpt.close()


def test_the_parameter_count_is_the_stored_analysed_tensors(saved):
    kind, folder, _ = saved
    a = specbound.analyze(folder, threads=1)
    counted = 0
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        for name in f.keys():
            if name.endswith("proj.weight") and "layers." in name:
                counted += int(np.prod(f.get_slice(name).get_shape()))
    assert a.all_bounds()["param_count"] == counted


@pytest.mark.parametrize(
    "build, flags",
    [
        (lambda: _glm(layers=3, first_k_dense_replace=0), [True, True, True]),
        (lambda: _glm(layers=3, first_k_dense_replace=3), [False, False, False]),
        (lambda: _ernie(layers=6, moe_layer_start_index=1, moe_layer_interval=2), None),
        (lambda: _ernie(layers=6, moe_layer_start_index=0, moe_layer_end_index=3), None),
    ],
)
def test_the_layer_rule_matches_the_modules_for_each_config(build, flags, tmp_path):
    model = _save(build(), tmp_path)
    opened = open_model(tmp_path)
    truth = [hasattr(b.mlp, "experts") for b in model.model.layers]
    assert flags is None or truth == flags
    assert [opened.dims.routed(l) for l in range(len(truth))] == truth
    a = specbound.analyze(tmp_path, threads=1)
    assert len(a.matrices) == opened.dims.matrix_count()
    applies = {e["name"]: e["applies"] for e in a.assumptions}
    assert applies.get("mixture_of_experts", False) == any(truth) and applies.get("moe_routing_fixed", False) == any(
        truth
    )
    assert a.model["experts"]["layers"] == [l for l, t in enumerate(truth) if t]
    opened.ckpt.close()


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("routed_scaling_factor", -1.0, "routed_scaling_factor=-1.0 must be a positive number"),
        ("first_k_dense_replace", 1.5, "first_k_dense_replace=1.5 must be an integer"),
    ],
)
def test_bad_routing_config_is_one_line(key, value, says, tmp_path):
    _save(_glm(layers=2), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecboundError, match=says) as info:
        specbound.analyze(tmp_path, threads=1)
    assert "\n" not in str(info.value)


def test_no_shared_expert_when_the_config_counts_none(tmp_path):
    """ERNIE with moe_num_shared_experts 0 builds no shared expert: none is read, none is a row, none enters
    the factor."""
    model = _save(_ernie(layers=2, moe_num_shared_experts=0), tmp_path)
    assert model.model.layers[1].mlp.shared_experts is None
    a = specbound.analyze(tmp_path, threads=1)
    roles = set(a.matrices["role"])
    assert "FF_gate[e0]" in roles and not any(r.endswith("[shared]") for r in roles)
    assert a.model["experts"]["shared_d_ff"] is None


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda d: d["experts"].update(gates={"scoring": "relu"}), "'experts.gates' must be"),
        (lambda d: d["experts"]["dense"].pop("layers"), "'experts.dense' must be an object with 'tensors'"),
        (
            lambda d: d["experts"]["dense"].update(layers={"first": "first_k_dense_replace", "phase": 2}),
            "'experts.dense' must be an object with 'tensors'",
        ),
        (lambda d: d["config"].pop("dense_ff_size"), "needs the config fields \\['dense_ff_size'\\]"),
        (lambda d: d["latent_attention"]["tensors"].pop("kv_b"), "'latent_attention' tensors must name exactly"),
        (lambda d: d["latent_attention"].update(eps_default=0), "eps_default must be a positive number"),
    ],
)
def test_a_bad_spec_for_the_new_keys_is_one_line(change, says):
    doc = json.loads((files("specbound.archs") / "data" / "deepseek_v3.json").read_text())
    bad = copy.deepcopy(doc)
    change(bad)
    with pytest.raises(SpecboundError, match=says) as info:
        parse_spec(bad, "test.json")
    assert "\n" not in str(info.value)
    parse_spec(doc, "test.json")  # the shipped document itself is valid
