"""Multi-head latent attention (DeepSeek-V3, Kimi-K2; docs/theory.md 3l), held by brute force on the model's
own modules: the logit's Lipschitz factor ``kappa_h`` (the QK row's ``lipschitz_factor``), the value path's
(the OV row's) and its reach, the rows' sensitivities to a change of their blocks, and the whole attention
module's Lipschitz constant in the max-row norm are never exceeded by gradient ascent over unit-ball tokens,
with a query latent and without, under YaRN (``mscale^2`` on the softmax scale, an attention factor on the
rotary key) and without; the numbers the propagation reads are those factors."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import json
import tempfile

from safetensors import safe_open
from support.lipschitz import measured_lipschitz  # noqa: E402

import specbound  # noqa: E402
from specbound import SpecboundError  # noqa: E402
from specbound.archs.extract import layer_weights  # noqa: E402
from specbound.compute.latent import latent_factors, latent_heads  # noqa: E402
from specbound.pipeline import open_model  # noqa: E402

N, H, RQ, RKV, NOPE, ROPE, DV = 16, 2, 8, 6, 4, 4, 3
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "mscale": 1.0,
    "mscale_all_dim": 0.5,
}


def _build(q_lora=True, yarn=False, eps=None):
    config = transformers.DeepseekV3Config(
        hidden_size=N,
        num_hidden_layers=1,
        num_attention_heads=H,
        num_key_value_heads=H,
        intermediate_size=20,
        moe_intermediate_size=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=RQ if q_lora else None,
        kv_lora_rank=RKV,
        qk_rope_head_dim=ROPE,
        qk_nope_head_dim=NOPE,
        v_head_dim=DV,
        vocab_size=32,
        max_position_embeddings=64,
        rope_parameters=YARN if yarn else None,
        attn_implementation="eager",
    )
    model = transformers.DeepseekV3ForCausalLM(config)
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    if eps is not None:  # the latent norms' epsilon (DeepSeek's take no config value: 1e-6)
        for norm in (model.model.layers[0].self_attn.q_a_layernorm, model.model.layers[0].self_attn.kv_a_layernorm):
            if norm is not None:
                norm.variance_epsilon = eps
    return model.eval()


CASES = {"latent_query": dict(), "plain_query": dict(q_lora=False), "yarn": dict(yarn=True)}


@pytest.fixture(scope="module", params=sorted(CASES))
def mla(request, tmp_path_factory):
    """``(case, analysis, model in float64, the layer's weights, its factors)``."""
    folder = tmp_path_factory.mktemp(request.param)
    transformers.logging.set_verbosity_error()
    model = _build(**CASES[request.param])
    model.save_pretrained(folder)
    a = specbound.analyze(folder, threads=1)
    opened = open_model(folder)
    weights = layer_weights(opened.spec, opened.ckpt, opened.dims, opened.prefix, 0)
    opened.ckpt.close()
    return request.param, a, model.double(), weights, latent_factors(weights.latent)


def _parts(attn, x, y, pos_x, pos_y, rotary):
    """Per head the module's query and key of tokens ``x`` (at ``pos_x``) and ``y`` (at ``pos_y``), shapes
    ``(B, H, d_qk)``, and ``m``, the logit's scale over ``qk_head_dim^(-1/2)``: every step through the
    module's own projections, norms and rotary embedding."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    b = x.shape[0]
    q = attn.q_proj(x) if attn.q_a_proj is None else attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
    q = q.view(b, H, NOPE + ROPE)
    kv, k_rot = torch.split(attn.kv_a_proj_with_mqa(y), [RKV, ROPE], dim=-1)
    kv = attn.kv_b_proj(attn.kv_a_layernorm(kv)).view(b, H, NOPE + DV)
    cq, sq = rotary(x, torch.full((b, 1), pos_x))
    ck, sk = rotary(y, torch.full((b, 1), pos_y))
    q_rot, _ = apply_rotary_pos_emb_interleave(q[..., NOPE:].unsqueeze(2), q[..., NOPE:].unsqueeze(2), cq, sq)
    _, k_rot = apply_rotary_pos_emb_interleave(k_rot[:, None, None, :], k_rot[:, None, None, :], ck, sk)
    query = torch.cat([q[..., :NOPE], q_rot[:, :, 0]], dim=-1)
    key = torch.cat([kv[..., :NOPE], k_rot[:, :, 0].expand(b, H, ROPE)], dim=-1)
    return query, key, kv[..., NOPE:], attn.scaling / (NOPE + ROPE) ** -0.5


def _logit(model, h, pos_x, pos_y):
    attn, rotary = model.model.layers[0].self_attn, model.model.rotary_emb

    def f(x, y):
        q, k, _, m = _parts(attn, x, y, pos_x, pos_y, rotary)
        return m * (q[:, h] * k[:, h]).sum(dim=-1, keepdim=True)

    return f


def _value(model, h):
    """Head ``h``'s output per key token: its values through ``o_proj``'s own columns of the head."""
    attn = model.model.layers[0].self_attn

    def f(y):
        _, _, v, _ = _parts(attn, y, y, 0, 0, model.model.rotary_emb)
        z = torch.zeros(y.shape[0], H * DV, dtype=torch.float64)
        z[:, h * DV : (h + 1) * DV] = v[:, h]
        return attn.o_proj(z)

    return f


def test_the_scales_are_the_modules(mla):
    case, a, model, weights, _ = mla
    attn = model.model.layers[0].self_attn
    lat = weights.latent.dims
    assert lat.logit_scale == pytest.approx(attn.scaling / (NOPE + ROPE) ** -0.5, rel=1e-12)
    assert lat.rope_factor == pytest.approx(model.model.rotary_emb.attention_scaling, rel=1e-12)
    if case == "yarn":  # both depart from 1 here, so each is tested
        assert lat.logit_scale > 1.01 and lat.rope_factor > 1.01
    assert a.model["latent_attention"]["q_rank"] == (None if case == "plain_query" else RQ)


def test_the_logits_lipschitz_factor_holds_against_gradient_ascent(mla):
    case, a, model, _, f = mla
    rows = a.matrices[(a.matrices["role"] == "QK") & (a.matrices["layer"] == 0)]
    np.testing.assert_allclose(rows["lipschitz_factor"], f.kappa, rtol=1e-12)
    for delta in (0, 63):
        for h in range(H):
            for side in (0, 1):
                found = measured_lipschitz(_logit(model, h, delta, 0), [(1, N)] * 2, [side], restarts=1, steps=12)
                assert 0 < found <= f.kappa[h], (case, delta, h, side, found / f.kappa[h])


def test_a_token_in_the_latents_null_space_moves_the_logit_most_and_stays_below_kappa(mla):
    """Where the latent projection sends a token to 0, the latent norm's Jacobian is largest (``g / sqrt(eps)``,
    docs/theory.md 3d): tokens there, moved along ``W``'s top right singular vector, reach a sizeable share of
    ``kappa_h`` (14-18% here, against under 2% for the ascent from random starts) and never pass it."""
    case, _, model, _, f = mla
    attn = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(0)
    best, e = 0.0, 1e-7
    sides = [(1, attn.kv_a_proj_with_mqa.weight[:RKV])] + (
        [(0, attn.q_a_proj.weight)] if attn.q_a_proj is not None else []
    )
    for side, w in sides:
        _, _, vt = torch.linalg.svd(w.detach())
        null, d = vt[w.shape[0] :], vt[0]
        for _ in range(30):
            z = null.T @ torch.randn(null.shape[0], dtype=torch.float64, generator=gen)
            z = 0.5 * z / z.norm()
            other = torch.randn(N, dtype=torch.float64, generator=gen)
            other = other / other.norm()
            for h in range(H):
                logit = _logit(model, h, 5, 0)
                with torch.no_grad():
                    pair = ((z + e * d, other), (z, other)) if side == 0 else ((other, z + e * d), (other, z))
                    moved = logit(pair[0][0][None], pair[0][1][None]) - logit(pair[1][0][None], pair[1][1][None])
                ratio = moved.abs().item() / e / f.kappa[h]
                assert ratio <= 1, (case, side, h, ratio)
                best = max(best, ratio)
    assert best > 0.05, (case, best)


def test_the_value_paths_factor_and_reach_hold(mla):
    case, a, model, _, f = mla
    rows = a.matrices[(a.matrices["role"] == "OV") & (a.matrices["layer"] == 0)]
    np.testing.assert_allclose(rows["lipschitz_factor"], f.value_lipschitz, rtol=1e-12)
    gen = torch.Generator().manual_seed(4)
    for h in range(H):
        found = measured_lipschitz(_value(model, h), [(1, N)], [0], restarts=1, steps=12)
        assert 0 < found <= f.value_lipschitz[h], (case, h, found / f.value_lipschitz[h])
        y = torch.randn(200, N, dtype=torch.float64, generator=gen)
        with torch.no_grad():
            reach = _value(model, h)(y / y.norm(dim=-1, keepdim=True)).norm(dim=-1).max()
        assert 0 < reach <= f.value_reach[h]


def _structured(w, gen, size):
    """A change of a matrix of spectral norm exactly ``size``."""
    d = torch.randn(*w.shape, dtype=torch.float64, generator=gen)
    return size * d / torch.linalg.matrix_norm(d, ord=2)


def test_the_rows_sensitivities_hold_for_a_change_of_every_block(mla):
    """A change of every block of head ``h``'s QK row, each of spectral norm ``t`` (so the row's is ``t``: a
    block-diagonal's norm is its largest block's), made in the module's own weights, moves the logit by at most
    ``s_h t`` on every token pair tried; the OV row's likewise moves the head's output by at most ``o_h t``."""
    case, _, model, weights, f = mla
    attn = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(5)
    t = 1e-6
    x = torch.randn(64, N, dtype=torch.float64, generator=gen)
    y = torch.randn(64, N, dtype=torch.float64, generator=gen)
    x, y = x / x.norm(dim=-1, keepdim=True), y / y.norm(dim=-1, keepdim=True)
    for h in range(H):
        with torch.no_grad():
            before = _logit(model, h, 7, 2)(x, y)
            out_before = _value(model, h)(y)
            saved = {n: p.clone() for n, p in attn.named_parameters()}
            q_b = attn.q_b_proj if attn.q_a_proj is not None else attn.q_proj
            rows = slice(h * (NOPE + ROPE), h * (NOPE + ROPE) + NOPE)
            rot = slice(h * (NOPE + ROPE) + NOPE, (h + 1) * (NOPE + ROPE))
            c_n = attn.kv_b_proj.weight[h * (NOPE + DV) : h * (NOPE + DV) + NOPE]  # (NOPE, RKV)
            # X_h = B_n^T C_n changed by t in spectral norm through B_n: dB_n^T C_n with ||.|| = t
            d_b = torch.randn(NOPE, q_b.weight.shape[1], dtype=torch.float64, generator=gen)
            d_b *= t / torch.linalg.matrix_norm(d_b.T @ c_n, ord=2)
            q_b.weight[rows] += d_b
            q_b.weight[rot] += _structured(q_b.weight[rot], gen, t)
            if attn.q_a_proj is not None:
                attn.q_a_proj.weight += _structured(attn.q_a_proj.weight, gen, t)
            attn.kv_a_proj_with_mqa.weight += _structured(attn.kv_a_proj_with_mqa.weight, gen, t)
            moved = (_logit(model, h, 7, 2)(x, y) - before).abs().max()
            for n, p in attn.named_parameters():
                p.copy_(saved[n])
            # the OV row: W_kv's latent rows and Y_h = C_v^T O_h, the latter through C_v
            c_v = slice(h * (NOPE + DV) + NOPE, (h + 1) * (NOPE + DV))
            o_h = attn.o_proj.weight[:, h * DV : (h + 1) * DV].T  # (DV, N)
            d_c = torch.randn(DV, RKV, dtype=torch.float64, generator=gen)
            d_c *= t / torch.linalg.matrix_norm(d_c.T @ o_h, ord=2)
            attn.kv_b_proj.weight[c_v] += d_c
            attn.kv_a_proj_with_mqa.weight[:RKV] += _structured(attn.kv_a_proj_with_mqa.weight[:RKV], gen, t)
            out_moved = (_value(model, h)(y) - out_before).norm(dim=-1).max()
            for n, p in attn.named_parameters():
                p.copy_(saved[n])
        assert 0 < moved <= f.qk_sensitivity[h] * t * (1 + 1e-3), (case, h, float(moved / (f.qk_sensitivity[h] * t)))
        assert 0 < out_moved <= f.ov_sensitivity[h] * t * (1 + 1e-3), (case, h)


def test_the_attention_modules_lipschitz_constant_holds(mla):
    """The whole attention module (every head, o_proj, the rotary key, no mask) on sequences of unit-ball rows:
    its max-row Lipschitz constant found by gradient ascent is at most ``sum_h L_k ||Y_h|| + 4 kappa_h R_k
    ||Y_h||``, the factor the layer's ``lambda`` multiplies by its feed-forward factor."""
    case, a, model, _, f = mla
    attn, rotary = model.model.layers[0].self_attn, model.model.rotary_emb
    bound = float(np.sum(f.value_lipschitz + 4 * f.kappa * f.value_reach))
    positions = torch.arange(4)[None]

    def whole(xs):
        emb = rotary(xs[None], positions)
        return attn(xs[None], position_embeddings=emb, attention_mask=None)[0][0]

    found = measured_lipschitz(whole, [(4, N)], [0], restarts=1, steps=15)
    assert 0 < found <= bound, (case, found / bound)
    rows = a.matrices[a.matrices["layer"] == 0]
    ff = {r: s for r, s in zip(rows["role"], rows["spectral_norm"]) if r.startswith("FF_")}
    lip_ff = (a.options["l_phi"] + 1) * ff["FF_gate"] * ff["FF_up"] * ff["FF_out"]
    assert a.layers["lambda"][0] == pytest.approx(bound * lip_ff, rel=1e-12)


def test_the_rows_are_their_blocks_and_count_the_stored_weights(mla):
    """Each row's singular values are its blocks' together (the dense block-diagonal's), and the parameter
    count is that of the stored attention and feed-forward projections."""

    case, a, model, weights, _ = mla
    lat = weights.latent
    xs, brs, ys = latent_heads(lat)
    sv = a.singular_values
    for i, row in enumerate(a.matrices.itertuples()):
        if row.role not in ("QK", "OV"):
            continue
        h = row.head
        blocks = (
            ([lat.q_a] if lat.q_a is not None else []) + [lat.kv_a, xs[h], brs[h]]
            if row.role == "QK"
            else [lat.kv_a[:RKV], ys[h]]
        )
        expected = np.sort(np.concatenate([np.linalg.svd(b, compute_uv=False) for b in blocks]))[::-1]
        got = np.sort(sv[(sv["matrix"] == i) & (sv["kind"] == "singular_value")]["sigma"].to_numpy())[::-1]
        np.testing.assert_allclose(got, expected[: got.size], rtol=1e-9, atol=1e-12)
        assert row.spectral_norm == pytest.approx(max(np.linalg.norm(b, 2) for b in blocks), rel=1e-12)
    del model

    with tempfile.TemporaryDirectory() as folder:
        _build(**CASES[case]).save_pretrained(folder)
        with safe_open(f"{folder}/model.safetensors", "np") as f:
            counted = sum(
                int(np.prod(f.get_slice(n).get_shape()))
                for n in f.keys()
                if "layers." in n and n.endswith("proj.weight") or "kv_a_proj_with_mqa.weight" in n
            )
    assert a.all_bounds()["param_count"] == counted


def test_a_missing_latent_dimension_is_one_line(tmp_path):
    transformers.logging.set_verbosity_error()
    _build().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["kv_lora_rank"] = None
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecboundError, match="kv_lora_rank") as info:
        specbound.analyze(tmp_path, threads=1)
    assert "\n" not in str(info.value)
    assert math.isfinite(specbound.analyze(_save_plain(tmp_path.parent / "ok"), threads=1).bounds["spectral_adaptive"])


def _save_plain(folder):
    _build().save_pretrained(folder)
    return folder


def test_deepseek_v32s_indexer_is_named_and_its_layer_types_followed(tmp_path):
    """DeepSeek-V3.2: the indexer's weights are stored but not analysed, the assumption says the key selection is
    held fixed, and mlp_layer_types decides which layers hold experts, as the modules are built."""
    config = transformers.DeepseekV32Config(
        hidden_size=N,
        num_hidden_layers=3,
        num_attention_heads=H,
        intermediate_size=20,
        moe_intermediate_size=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=RQ,
        kv_lora_rank=RKV,
        qk_rope_head_dim=ROPE,
        qk_nope_head_dim=NOPE,
        v_head_dim=DV,
        index_topk=2,
        index_head_dim=4,
        index_n_heads=2,
        mlp_layer_types=["sparse", "dense", "sparse"],
        vocab_size=32,
        max_position_embeddings=64,
    )
    model = transformers.DeepseekV32ForCausalLM(config)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(tmp_path)
    a = specbound.analyze(tmp_path, threads=1)
    applies = {e["name"]: e["applies"] for e in a.assumptions}
    assert applies["sparse_attention_fixed"] and applies["latent_attention"] and applies["mixture_of_experts"]
    for layer, block in enumerate(model.model.layers):
        roles = set(a.matrices[a.matrices["layer"] == layer]["role"])
        assert ("FF_gate[e0]" in roles) == hasattr(block.mlp, "experts") and ("FF_gate" in roles) != (
            "FF_gate[e0]" in roles
        )
    opened = open_model(tmp_path)
    assert any(".indexer." in n for n in opened.ckpt.names)  # read, accounted for as ignored, never a row
    opened.ckpt.close()


def test_init_measures_each_rows_blocks_differences(tmp_path):
    """``--init``: a latent row's ``W - W0`` is the block-diagonal of its blocks' differences (the shared latent
    projections', ``X_h - X0_h``, ``B_r - B0_r``, ``Y_h - Y0_h``), computed here densely from the two models'
    weights; a model against itself has every difference 0."""
    transformers.logging.set_verbosity_error()
    model, model0 = _build(), _build()
    torch.manual_seed(1)
    for p in model0.parameters():
        torch.nn.init.normal_(p, std=0.3)
    model.save_pretrained(tmp_path / "w")
    model0.save_pretrained(tmp_path / "w0")
    a = specbound.analyze(tmp_path / "w", threads=1, init=tmp_path / "w0")
    heads = []
    for m in (model, model0):
        opened = open_model(tmp_path / ("w" if m is model else "w0"))
        lat = layer_weights(opened.spec, opened.ckpt, opened.dims, opened.prefix, 0).latent
        heads.append((lat, latent_heads(lat)))
        opened.ckpt.close()
    (lat, (xs, brs, ys)), (lat0, (xs0, brs0, ys0)) = heads
    for row in a.matrices.itertuples():
        if row.role == "QK":
            blocks = [
                lat.q_a - lat0.q_a,
                lat.kv_a - lat0.kv_a,
                xs[row.head] - xs0[row.head],
                brs[row.head] - brs0[row.head],
            ]
        elif row.role == "OV":
            blocks = [lat.kv_a[:RKV] - lat0.kv_a[:RKV], ys[row.head] - ys0[row.head]]
        else:
            continue
        s = np.concatenate([np.linalg.svd(b, compute_uv=False) for b in blocks])
        assert row.delta_spectral_norm == pytest.approx(s.max(), rel=1e-9)
        assert row.delta_frobenius_norm == pytest.approx(np.sqrt(np.sum(s**2)), rel=1e-9)
    same = specbound.analyze(tmp_path / "w", threads=1, init=tmp_path / "w")
    assert (same.matrices["delta_spectral_norm"] == 0).all()
