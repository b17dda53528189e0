"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE): the matrices specbound reads, with the router it reads,
reproduce the model's own sparse block on random inputs; the feed-forward Lipschitz factor it reports
holds for every expert mix the router can pick (routing frozen), while the real block, routing
included, jumps where the top-k selection switches (why routing is an assumption); the router is read
and named, never dropped; what the family does not model is refused in one line."""

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import shutil

import specbound  # noqa: E402
from specbound import SpecboundError  # noqa: E402
from specbound.archs.extract import layer_weights  # noqa: E402
from specbound.compute.propagation import feed_forward_lipschitz  # noqa: E402
from specbound.pipeline import open_model  # noqa: E402
from specbound.records.view import per_layer_frame, per_role_frame

N, H, E, K, D_FF, SHARED = 16, 2, 4, 2, 12, 20


def _build(kind):
    if kind == "mixtral":
        config = transformers.MixtralConfig(
            hidden_size=N,
            num_hidden_layers=2,
            num_attention_heads=H,
            num_key_value_heads=1,
            intermediate_size=D_FF,
            vocab_size=32,
            num_local_experts=E,
            num_experts_per_tok=K,
            max_position_embeddings=8,
            experts_implementation="eager",
        )
        model = transformers.MixtralForCausalLM(config)
    elif kind == "qwen3_moe":  # per-head query/key RMSNorms, no shared expert
        config = transformers.Qwen3MoeConfig(
            hidden_size=N,
            num_hidden_layers=2,
            num_attention_heads=H,
            num_key_value_heads=1,
            head_dim=8,
            intermediate_size=24,
            moe_intermediate_size=D_FF,
            vocab_size=32,
            num_experts=E,
            num_experts_per_tok=K,
            max_position_embeddings=8,
            norm_topk_prob=True,
            experts_implementation="eager",
        )
        model = transformers.Qwen3MoeForCausalLM(config)
    else:
        config = transformers.Qwen2MoeConfig(
            hidden_size=N,
            num_hidden_layers=2,
            num_attention_heads=H,
            num_key_value_heads=1,
            intermediate_size=24,
            moe_intermediate_size=D_FF,
            shared_expert_intermediate_size=SHARED,
            vocab_size=32,
            num_experts=E,
            num_experts_per_tok=K,
            max_position_embeddings=8,
            experts_implementation="eager",
        )
        model = transformers.Qwen2MoeForCausalLM(config)
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


@pytest.fixture(scope="module", params=["mixtral", "qwen2_moe", "qwen3_moe"])
def moe(request, tmp_path_factory):
    """``(kind, folder, model in float64)``."""
    model = _build(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(folder)
    return request.param, folder, model.double()


def _silu(t):
    return t / (1 + np.exp(-t))


def _expert(ff, branch, x):
    """One expert's output from specbound's matrices: ``down(silu(x W_g) * (x W_u))``, row vectors."""
    return (_silu(x @ ff[f"FF_gate[{branch}]"]) * (x @ ff[f"FF_up[{branch}]"])) @ ff[f"FF_out[{branch}]"]


def _block(ff, router, shared_gate, x, norm_topk, frozen=None):
    """The sparse block from specbound's matrices and the router it read: softmax over the router's
    logits, the top-k experts weighted by their probabilities (renormalised when ``norm_topk``), plus
    the shared expert times sigmoid of its gate.  ``frozen``: ``(selected, weights, shared_scale)`` to
    use instead of the router's (the routing held fixed)."""
    logits = x @ router
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    top = np.argsort(-probs, axis=1, kind="stable")[:, :K]
    weights = np.take_along_axis(probs, top, axis=1)
    if norm_topk:
        weights = weights / weights.sum(axis=1, keepdims=True)
    scale = None if shared_gate is None else 1 / (1 + np.exp(-(x @ shared_gate)))
    if frozen is not None:
        top, weights, scale = frozen
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(top[t], weights[t]):
            out[t] += w * _expert(ff, f"e{e}", x[t : t + 1])[0]
    if shared_gate is not None:
        out += scale * _expert(ff, "shared", x)
    return out, (top, weights, scale)


def _read(folder, layer):
    model = open_model(folder)
    weights = layer_weights(model.spec, model.ckpt, model.dims, model.prefix, layer)
    ff = {role: weights.ff[role] for role in weights.ff}
    router = model.ckpt.read(model.spec.experts.router.name_for(layer, model.prefix)).T  # (N, E)
    gate = model.spec.experts.shared_gate
    shared_gate = None if gate is None else model.ckpt.read(gate.name_for(layer, model.prefix)).T  # (N, 1)
    return model, ff, router, shared_gate


def test_extracted_matrices_and_router_reproduce_the_models_block(moe):
    kind, folder, model = moe
    rng = np.random.default_rng(1)
    for layer in range(2):
        opened, ff, router, shared_gate = _read(folder, layer)
        expected = [f"FF_{r}[e{e}]" for e in range(E) for r in ("gate", "up", "out")]
        expected += [f"FF_{r}[shared]" for r in ("gate", "up", "out")] if kind == "qwen2_moe" else []
        assert list(ff) == expected
        x = rng.standard_normal((9, N))
        norm_topk = kind == "mixtral" or model.config.norm_topk_prob
        got, (top, weights, scale) = _block(ff, router, shared_gate, x, norm_topk)
        mlp = model.model.layers[layer].mlp
        with torch.no_grad():
            xt = torch.tensor(x)
            logits, _, selected = mlp.gate(xt)  # the router's logits, and the experts it selects
            np.testing.assert_allclose(x @ router, logits.numpy(), rtol=1e-12, atol=1e-14)
            assert (np.sort(selected.numpy(), axis=1) == np.sort(top, axis=1)).all()
            # the experts module with these selections and (float64) weights: every expert's matrices
            routed = mlp.experts(xt, torch.tensor(top), torch.tensor(weights)).numpy()
            if shared_gate is not None:
                np.testing.assert_allclose(1 / (1 + np.exp(-mlp.shared_expert_gate(xt).numpy())), scale, rtol=1e-12)
                routed = routed + scale * mlp.shared_expert(xt).numpy()
            np.testing.assert_allclose(got, routed, rtol=1e-9, atol=1e-12)
            # the whole block, router included; its softmax runs in float32 (router_logits.float()),
            # so this agrees to float32 rounding only
            whole = mlp(xt[None])[0].numpy()
        np.testing.assert_allclose(got, whole, rtol=1e-4, atol=1e-6)
        opened.ckpt.close()


def test_the_feed_forward_factor_holds_for_every_frozen_routing_and_not_across_a_switch(moe):
    """With the routing frozen (any expert mix with gates >= 0 summing to <= 1, the shared gate <= 1)
    the block is Lipschitz with the reported factor; the real block, whose routing follows the input,
    jumps at the boundary between two top-k selections, so no finite factor covers it."""
    kind, folder, model = moe
    a = specbound.analyze(folder, threads=1)
    rows = a.matrices[a.matrices["layer"] == 0]
    ff_norms = {r: s for r, s in zip(rows["role"], rows["spectral_norm"]) if r.startswith("FF_")}
    factor = feed_forward_lipschitz(ff_norms, a.options["l_phi"])  # SiLU: L_phi = 1.0998, c_phi = 1
    opened, ff, router, shared_gate = _read(folder, 0)
    norm_topk = kind == "mixtral" or model.config.norm_topk_prob
    rng = np.random.default_rng(2)
    worst = 0.0
    for _ in range(200):
        x = rng.standard_normal((1, N))
        x /= np.linalg.norm(x)
        y = x + rng.standard_normal((1, N)) * 10 ** rng.uniform(-4, -1)
        fx, routing = _block(ff, router, shared_gate, x, norm_topk)
        if rng.random() < 0.5:  # any gates on the simplex, not only the router's, are covered
            w = rng.dirichlet(np.ones(K))[None] * rng.uniform(0.2, 1.0)
            routing = (routing[0], w, None if shared_gate is None else rng.uniform(0, 1, (1, 1)))
            fx, _ = _block(ff, router, shared_gate, x, norm_topk, frozen=routing)
        fy, _ = _block(ff, router, shared_gate, y, norm_topk, frozen=routing)
        worst = max(worst, np.linalg.norm(fy - fx) / np.linalg.norm(y - x))
    assert 0 < worst <= factor

    # a switch of the top-k selection: bisect between two inputs routed differently
    a0, a1 = None, None
    while a1 is None:
        x0, x1 = rng.standard_normal((2, N)) / np.sqrt(N)
        s0 = set(_block(ff, router, shared_gate, x0[None], norm_topk)[1][0][0])
        s1 = set(_block(ff, router, shared_gate, x1[None], norm_topk)[1][0][0])
        if s0 != s1:
            a0, a1 = x0, x1
    for _ in range(45):
        mid = (a0 + a1) / 2
        if set(_block(ff, router, shared_gate, mid[None], norm_topk)[1][0][0]) == s0:
            a0 = mid
        else:
            a1 = mid
    jump = np.linalg.norm(
        _block(ff, router, shared_gate, a1[None], norm_topk)[0]
        - _block(ff, router, shared_gate, a0[None], norm_topk)[0]
    ) / np.linalg.norm(a1 - a0)
    assert jump > 1e6 * factor
    opened.ckpt.close()


def test_the_router_is_named_and_the_structure_is_said(moe):
    kind, folder, model = moe
    a = specbound.analyze(folder, threads=1)
    experts = a.model["experts"]
    assert experts["experts"] == E and experts["top_k"] == K and experts["d_ff"] == D_FF
    assert experts["router"] == (
        "model.layers.0.block_sparse_moe.gate.weight" if kind == "mixtral" else "model.layers.0.mlp.gate.weight"
    )
    assert ("qk_norm" in a.model) == (kind == "qwen3_moe")
    assert experts["shared_d_ff"] == (SHARED if kind == "qwen2_moe" else None)
    applying = {e["name"]: e for e in a.assumptions if e["applies"]}
    assert applying["mixture_of_experts"]["kind"] == "extension"
    assert "discontinuous" in applying["moe_routing_fixed"]["effect"]
    roles = set(a.matrices["role"])
    assert {"FF_gate[e0]", "FF_out[e3]"} <= roles and ("FF_up[shared]" in roles) == (kind == "qwen2_moe")
    tensors = a.matrices.set_index("role")["tensors"]
    assert (
        tensors["FF_gate[e3]"]
        .iloc[0]
        .endswith("experts.3.w1.weight" if kind == "mixtral" else "experts.3.gate_proj.weight")
    )
    # the summary sums each role over the routed experts (a model with 64 experts keeps its tables narrow)
    columns = set(per_layer_frame(a).columns)
    assert {"FF_gate[experts]", "FF_out[experts]"} <= columns and not any(re.search(r"\[e\d+\]", c) for c in columns)
    roles = per_role_frame(a)
    assert roles.loc["FF_up[experts]", "matrices"] == 2 * E  # 2 layers
    assert roles.loc["FF_up[experts]", "contribution"] == pytest.approx(
        a.matrices[a.matrices["role"].str.match(r"FF_up\[e\d\]")]["contribution"].sum(), rel=1e-12
    )
    # every expert's stored weights are counted (the router's are not analysed matrices)
    widths = E * D_FF + (SHARED if kind == "qwen2_moe" else 0)
    attention = N * H * (N // H) * 2 + N * 1 * (N // H) * 2
    assert a.baselines["param_count"] == 2 * (attention + 3 * N * widths)


def _rewrite_config(folder, tmp_path, **changes):
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_what_the_families_do_not_model_is_refused_in_one_line(moe, tmp_path):
    kind, folder, _ = moe
    key = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_local_experts"}[kind]
    with pytest.raises(
        SpecboundError,
        match=r"gate\.weight' has shape \(4, 16\), but config.json .*5 experts.*\) "
        r"implies \(5, 16\) for a linear router",
    ) as info:
        specbound.analyze(_rewrite_config(folder, tmp_path, **{key: 5}), threads=1)
    assert "\n" not in str(info.value)
    if kind != "mixtral":
        with pytest.raises(SpecboundError, match=r"mlp_only_layers=\[1\]: these layers have a dense feed-forward"):
            specbound.analyze(_rewrite_config(folder, tmp_path / "b", mlp_only_layers=[1]), threads=1)


def test_an_in_memory_mixture_of_experts_is_refused_with_what_to_do(moe):
    """transformers 5 holds a loaded model's experts as 3-D banks (``mlp.experts.gate_up_proj``); its
    files hold one tensor per expert, which the spec names: the module is refused, saying to save it."""
    kind, folder, model = moe
    with pytest.raises(
        SpecboundError,
        match=r"holds its experts as 3-D banks \(model\.layers\.0\.mlp\.experts\.down_proj .*save the "
        r"model with save_pretrained",
    ) as info:
        specbound.analyze(model, threads=1)
    assert "\n" not in str(info.value)
