"""QK-norm heads (Qwen3 and Gemma 3: RMSNorm per head; OLMo2: over the whole projection) against the
real attention modules of tiny transformers models: the logit ``q_t . k_s`` the module forms (after
its norms and its rotation, captured from its attention function) never changes faster than the
reported Lipschitz factor ``kappa_h`` (the QK row's lipschitz_factor, docs/theory.md 3d) allows, and
the module's output never faster than ``sum_h c(OV) (1 + 4 kappa_h)``.

Inputs are rows in the unit ball (the theorem's unit-norm inputs), some of them short (the norms'
Jacobian is largest near 0, which is where ``kappa`` is attained)."""

import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specbound  # noqa: E402
from specbound.archs.model import QKNorm
from specbound.compute.qk_logit import qk_norm_lipschitz, qk_norm_sensitivity

N, H, KV, D, P = 16, 4, 2, 8, 24

FAMILIES = {  # model class, config class, modeling module, extra config
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", "qwen3", {"head_dim": D}),
    "gemma3_text": ("Gemma3ForCausalLM", "Gemma3TextConfig", "gemma3", {"head_dim": D}),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", "olmo2", {}),
}


def _model(family, eps, seed=0):
    cls, cfg, _, extra = FAMILIES[family]
    config = getattr(transformers, cfg)(
        hidden_size=N,
        num_hidden_layers=1,
        num_attention_heads=H,
        num_key_value_heads=KV,
        intermediate_size=24,
        vocab_size=32,
        max_position_embeddings=P,
        rms_norm_eps=eps,
        attn_implementation="eager",
        **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return model


@pytest.fixture(params=[(f, 1e-6) for f in FAMILIES] + [("olmo2", 1e-2)], ids=lambda p: f"{p[0]}-eps{p[1]:g}")
def analysed(request, tmp_path, monkeypatch):
    family, eps = request.param
    model = _model(family, eps)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(tmp_path)
    analysis = specbound.analyze(tmp_path, threads=1)
    model = model.double()
    captured = {}
    module = importlib.import_module(f"transformers.models.{FAMILIES[family][2]}.modeling_{FAMILIES[family][2]}")
    eager = module.eager_attention_forward

    def capture(mod, query, key, *args, **kw):  # the rotated, normalised q and k (and as tensors, with grad)
        captured["q"], captured["k"] = query.detach().numpy(), key.detach().numpy()
        captured["tq"], captured["tk"] = query, key
        return eager(mod, query, key, *args, **kw)

    monkeypatch.setattr(module, "eager_attention_forward", capture)
    return family, model, analysis, captured


def _inputs(rng, T):
    x = rng.standard_normal((T, N))
    radius = 10 ** rng.uniform(-4, 0, size=(T, 1))  # inside the unit ball, some rows short
    return x / np.linalg.norm(x, axis=1, keepdims=True) * radius


def _run(model, xs):
    attn = model.model.layers[0].self_attn
    x = torch.tensor(xs)
    pos = torch.arange(xs.shape[1])[None].expand(xs.shape[0], -1)
    rope = model.model.rotary_emb
    emb = rope(x, pos, "sliding_attention") if "Gemma3" in type(rope).__name__ else rope(x, pos)
    with torch.no_grad():
        return attn(x, position_embeddings=emb, attention_mask=None)[0].numpy()


def test_the_modules_logits_never_exceed_the_reported_factor(analysed):
    family, model, a, captured = analysed
    qk = a.matrices[a.matrices["role"] == "QK"]
    kappa = qk["lipschitz_factor"].to_numpy()
    assert a.model["qk_norm"]["span"] == ("all_heads" if family == "olmo2" else "head")
    assert "qk_norm" in {e["name"] for e in a.assumptions if e["applies"] and e["kind"] == "extension"}
    assert "qk-norm: RMSNorm over" in str(a) and f"largest {kappa.max():.6g}" in str(a)  # said in the summary
    rng = np.random.default_rng(1)
    worst = np.zeros(H)
    for trial in range(20):
        T = int(rng.integers(2, P))
        x = _inputs(rng, T)
        e = rng.standard_normal((T, N)) * 10 ** rng.uniform(-7, -3)
        xp = x + e
        xp /= np.maximum(1.0, np.linalg.norm(xp, axis=1, keepdims=True))  # stay in the ball
        _run(model, np.stack([x, xp]))
        q, k = captured["q"], captured["k"]  # (2, H, T, d), (2, KV, T, d)
        dx = np.linalg.norm(xp - x, axis=1)
        for h in range(H):
            g = h // (H // KV)
            logits = np.einsum("btd,bsd->bts", q[:, h], k[:, g])  # unscaled, as the project's QK
            ratio = np.abs(logits[1] - logits[0]) / (dx[:, None] + dx[None, :])
            worst[h] = max(worst[h], ratio.max())
    assert np.all(worst > 0) and np.all(worst <= kappa)


def test_the_attention_module_never_exceeds_the_reported_layer_factor(analysed):
    family, model, a, _ = analysed
    rows = a.matrices[a.matrices["layer"] == 0]
    factor = float(
        np.sum(
            rows[rows["role"] == "OV"]["lipschitz_factor"].to_numpy()
            * (1 + 4 * rows[rows["role"] == "QK"]["lipschitz_factor"].to_numpy())
        )
    )
    rng = np.random.default_rng(2)
    worst = 0.0
    for trial in range(20):
        T = int(rng.integers(2, P))
        x = _inputs(rng, T)
        e = rng.standard_normal((T, N)) * 10 ** rng.uniform(-7, -3)
        out = _run(model, np.stack([x, x + e]))
        worst = max(worst, np.max(np.linalg.norm(out[1] - out[0], axis=1)) / np.max(np.linalg.norm(e, axis=1)))
    assert 0 < worst <= factor


def test_kappa_is_the_documented_formula():
    """kappa_h = max(L_q R_k, R_q L_k), L = ||g||_inf ||W_group|| / sqrt(eps), R = ||g||_inf sqrt(n) r /
    sqrt(r^2 + n eps), recomputed here from the raw factors for a per-head and a whole-projection norm."""

    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((H, D, N)), rng.standard_normal((KV, D, N))
    gq, gk = rng.standard_normal((H, D)), rng.standard_normal((KV, D))
    kv = np.arange(H) // (H // KV)
    for span, eps, a in (("head", 1e-6, 1.0), ("all_heads", 1e-3, 1.3)):
        got = qk_norm_lipschitz(q, k, kv, QKNorm(gq, gk, eps, span), a)
        s1q, s1k = (np.array([np.linalg.svd(w, compute_uv=False)[0] for w in ws]) for ws in (q, k))
        if span == "head":
            nq = nk = D
            wq, wk = s1q, s1k
        else:
            nq, nk = H * D, KV * D
            wq = np.full(H, min(np.sqrt(np.sum(s1q**2)), np.linalg.norm(q)))
            wk = np.full(KV, min(np.sqrt(np.sum(s1k**2)), np.linalg.norm(k)))
        lq, lk = np.abs(gq).max(1) * wq / np.sqrt(eps), np.abs(gk).max(1) * wk / np.sqrt(eps)
        rq = np.abs(gq).max(1) * np.sqrt(nq) * s1q / np.sqrt(s1q**2 + nq * eps)
        rk = np.abs(gk).max(1) * np.sqrt(nk) * s1k / np.sqrt(s1k**2 + nk * eps)
        np.testing.assert_allclose(got, a**2 * np.maximum(lq * rk[kv], rq * lk[kv]), rtol=1e-12)
    # the whole projection's norm bound is no smaller than its exact spectral norm
    assert np.sqrt(np.sum(s1q**2)) >= np.linalg.svd(q.reshape(H * D, N), compute_uv=False)[0]


def _attention_call(model, T):
    """``f(x, params)``: the layer's attention module on a batch of rows ``x`` (batch, T, N) with its
    parameters replaced by ``params`` (torch.func.functional_call), positions ``0 .. T - 1``."""
    attn = model.model.layers[0].self_attn
    rope = model.model.rotary_emb
    pos = torch.arange(T)[None]
    x0 = torch.zeros(1, T, N, dtype=torch.float64)
    emb = rope(x0, pos, "sliding_attention") if "Gemma3" in type(rope).__name__ else rope(x0, pos)

    def f(x, params):
        e = tuple(t.expand(x.shape[0], *t.shape[1:]) for t in emb)
        return torch.func.functional_call(attn, params, (x,), {"position_embeddings": e, "attention_mask": None})[0]

    return attn, f


def _logits(captured, f, x, params):
    """Every head's logits ``q_t . k_s`` (batch, H, T, T), as the module forms them from ``x`` under
    ``params`` (its rotated, normalised queries and keys, captured from its attention function)."""
    f(x, params)
    q, k = captured["tq"], captured["tk"]
    return torch.einsum("bhtd,bhsd->bhts", q, k.repeat_interleave(H // KV, dim=1))


def _null_rows(w, gen, shape):
    """Random unit-ball rows in the null space of ``w``'s rows (where the norm's Jacobian is largest)."""
    null = torch.linalg.svd(w, full_matrices=True)[2][w.shape[0] :]
    x = torch.randn(*shape, dtype=torch.float64, generator=gen)
    return x @ null.T @ null if null.shape[0] else x


def _measured_factor_sensitivity(model, captured, head, per_logit, steps=30, eps=1e-6, T=5, seed=0):
    """``(logit, output)``: the largest ``max_i |Delta l_i| / (s_i ||Delta Z_h||_2)`` (``s = per_logit``) and
    ``max_t ||Delta out_t|| / ||Delta Z_h||_2`` found by gradient ascent over unit-ball input rows (one run
    started in the null space of the query rows) and the direction of a change ``Delta Z_h = [Delta W_Q^h;
    Delta W_K^g]`` of spectral norm ``eps`` of the module's own q_proj and k_proj rows."""
    attn, f = _attention_call(model, T)
    per_logit = torch.tensor(np.array(per_logit, dtype=np.float64))
    params = {name: p.detach() for name, p in attn.named_parameters()}
    q_w, k_w = params["q_proj.weight"], params["k_proj.weight"]
    d, g = q_w.shape[0] // H, head // (H // KV)
    gen = torch.Generator().manual_seed(seed)
    best = [0.0, 0.0]
    for run, target in ((0, 0), (1, 0), (0, 1), (1, 1)):
        base = (
            _null_rows(q_w if d * H == N else q_w[head * d : (head + 1) * d], gen, (1, T, N))
            if run == 0
            else torch.randn(1, T, N, dtype=torch.float64, generator=gen)
        ).requires_grad_()
        direction = torch.randn(2 * d, N, dtype=torch.float64, generator=gen).requires_grad_()
        opt = torch.optim.Adam([base, direction], lr=0.05)
        for _ in range(steps):
            x = base / base.norm(dim=-1, keepdim=True).clamp(min=1.0)  # rows in the unit ball
            delta = eps * direction / torch.linalg.matrix_norm(direction, ord=2)
            moved = dict(params)
            moved["q_proj.weight"] = q_w.index_add(0, torch.arange(head * d, (head + 1) * d), delta[:d])
            moved["k_proj.weight"] = k_w.index_add(0, torch.arange(g * d, (g + 1) * d), delta[d:])
            if target == 0:
                change = (_logits(captured, f, x, moved) - _logits(captured, f, x, params)).abs().amax(dim=(0, 2, 3))
                ratio = (change / per_logit).max() / eps
            else:
                ratio = (f(x, moved) - f(x, params)).norm(dim=-1).max() / eps
            best[target] = max(best[target], float(ratio.detach()))
            opt.zero_grad()
            (-ratio).backward()
            opt.step()
    return best


def test_the_factors_sensitivity_holds_on_the_real_module(analysed):
    """A QK-norm head's row is its stacked raw factors ``Z_h`` (docs/theory.md 3d): a change of them moves
    the logits of every head ``i`` it reaches by at most ``s_i = S[i, i]`` per unit of ``||Delta Z_h||_2``
    (:func:`qk_norm_sensitivity` from the module's weights and gains; the module ties a key head to its
    query heads, so a change of ``W_K^g`` reaches each of them, which the cover counts through each query
    head's own copy), and the attention module's output by at most the sum of ``gamma_i / F`` over those
    heads (``gamma_i`` the rows' reported sensitivities, ``F = 2 c_g c_u c_d`` the feed-forward factor they
    carry; a norm over the whole projection reaches every head, and ``gamma_h / F`` alone counts them all),
    found by gradient ascent on the module itself over inputs and directions."""

    family, model, a, captured = analysed
    rows = a.matrices[a.matrices["layer"] == 0]
    ff = rows.set_index("role")["lipschitz_factor"]
    after = 2 * ff["FF_gate"] * ff["FF_up"] * ff["FF_out"]
    gamma = rows[rows["role"] == "QK"]["gamma"].to_numpy() / after
    attn = model.model.layers[0].self_attn
    q, k = (getattr(attn, f"{n}_proj").weight.detach().numpy() for n in "qk")
    d = q.shape[0] // H
    span = "all_heads" if family == "olmo2" else "head"
    gq, gk = (_gain(getattr(attn, f"{n}_norm"), family) for n in "qk")
    gq, gk = (np.tile(g, heads)[: heads * d] if g.size == d else g for g, heads in ((gq, H), (gk, KV)))
    norm = QKNorm(gq.reshape(H, d), gk.reshape(KV, d), float(_eps(attn.q_norm)), span)
    sens = qk_norm_sensitivity(q.reshape(H, d, N), k.reshape(KV, d, N), np.arange(H) // (H // KV), norm)
    group = np.arange(H) // (H // KV)
    for head in (H - 1,):  # the last key head's group (the first is the same code path)
        reached = gamma[head] if span == "all_heads" else gamma[group == group[head]].sum()
        logit, output = _measured_factor_sensitivity(model, captured, head, np.diag(sens))
        print(f"{family} head {head}: logit {logit:.3g} of s, output {output / reached:.3g} of the gammas / F")
        assert 0 < logit <= 1 and 0 < output <= reached, (family, head, logit, output / reached)


def _gain(norm, family):
    w = norm.weight.detach().double().numpy()
    return (1.0 + norm.weight.detach().float()).double().numpy() if family == "gemma3_text" else w


def _eps(norm):
    return getattr(norm, "variance_epsilon", None) or norm.eps


def test_gradient_ascent_on_the_tokens_stays_below_kappa(analysed):
    """``kappa_h`` bounds ``|l(x, y) - l(x', y')| / (||x - x'|| + ||y - y'||)`` for every pair of positions
    (docs/theory.md 3d): gradient ascent over unit-ball rows (one run started in the null space of the query
    rows, where the norm's Jacobian is largest) and their moves never exceeds it."""
    family, model, a, captured = analysed
    kappa = torch.tensor(a.matrices[a.matrices["role"] == "QK"]["lipschitz_factor"].to_numpy())
    T, eps = 5, 1e-6
    attn, f = _attention_call(model, T)
    params = {name: p.detach() for name, p in attn.named_parameters()}
    q_w = params["q_proj.weight"]
    d = q_w.shape[0] // H
    gen = torch.Generator().manual_seed(0)
    best = torch.zeros(H, dtype=torch.float64)
    for run in range(2):
        base = (
            _null_rows(q_w[:d] if d * H != N else q_w, gen, (1, T, N))
            if run == 0
            else torch.randn(1, T, N, dtype=torch.float64, generator=gen)
        ).requires_grad_()
        move = torch.randn(1, T, N, dtype=torch.float64, generator=gen).requires_grad_()
        opt = torch.optim.Adam([base, move], lr=0.05)
        for _ in range(40):
            x = base / base.norm(dim=-1, keepdim=True).clamp(min=1.0) * (1 - eps)
            dx = eps * move / move.norm(dim=-1, keepdim=True).clamp(min=1.0)
            change = (_logits(captured, f, x + dx, params) - _logits(captured, f, x, params)).abs()[0]
            lengths = dx[0].norm(dim=-1)
            ratio = change / (lengths[:, None] + lengths[None, :])[None] / kappa[:, None, None]
            best = torch.maximum(best, ratio.detach().amax(dim=(1, 2)))
            opt.zero_grad()
            (-ratio.amax(dim=(1, 2)).sum()).backward()  # every head's worst pair
            opt.step()
    print(f"{family}: gradient ascent reaches {best.min():.3g} - {best.max():.3g} of kappa_h")
    assert torch.all(best > 0) and torch.all(best <= 1)


def test_distance_from_init_of_a_qk_norm_head_is_its_stacked_factors_difference(tmp_path):
    """``--init``: a QK-norm head's ``W - W0`` is ``Z_h - Z0_h = [W_Q^h - W_Q0^h; W_K^g - W_K0^g]``
    (docs/theory.md 3d), on both the factored and the dense route, and the propagation stays ``W``'s."""
    trained, init = _model("qwen3", 1e-6, seed=0), _model("qwen3", 1e-6, seed=1)
    transformers.logging.set_verbosity_error()
    trained.save_pretrained(tmp_path / "w")
    init.save_pretrained(tmp_path / "w0")
    q, k = (getattr(trained.model.layers[0].self_attn, f"{n}_proj").weight.detach().double().numpy() for n in "qk")
    q0, k0 = (getattr(init.model.layers[0].self_attn, f"{n}_proj").weight.detach().double().numpy() for n in "qk")
    plain = specbound.analyze(tmp_path / "w", threads=1)
    for method in ("factored", "dense"):
        a = specbound.analyze(tmp_path / "w", init=tmp_path / "w0", method=method, threads=1)
        rows = a.matrices[a.matrices["role"] == "QK"]
        for h, (_, row) in enumerate(rows.iterrows()):
            g = h // (H // KV)
            z = np.concatenate(
                [q[h * D : (h + 1) * D] - q0[h * D : (h + 1) * D], k[g * D : (g + 1) * D] - k0[g * D : (g + 1) * D]]
            )
            s = np.linalg.svd(z, compute_uv=False)
            assert row["delta_spectral_norm"] == pytest.approx(s[0], rel=1e-9)
            assert row["delta_frobenius_norm"] == pytest.approx(np.linalg.norm(z), rel=1e-9)
            assert row["delta_norm_1_1"] == pytest.approx(np.abs(z).sum(), rel=1e-9)
        np.testing.assert_allclose(a.matrices["gamma"], plain.matrices["gamma"], rtol=1e-12)


def test_gemmas_one_plus_w_query_key_gains_are_described_as_what_the_rows_hold(tmp_path):
    """Gemma 3's query/key norms multiply by ``1 + w``: the ``one_plus_weight_norms`` entry says they are folded into
    no matrix (the text once said "folded into QK", which schema 3's rows are not), and the rows agree: each QK
    row's norms are the raw stacked factors ``[W_Q^h; W_K^g]``'s, not those with the gains applied, while its
    ``lipschitz_factor`` grows with ``||1 + w||_inf``."""
    model = _model("gemma3_text", 1e-6)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(tmp_path / "a")
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.q_norm.weight.add_(3.0)  # gains 1 + w about 4 times larger, the raw factors unchanged
        attn.k_norm.weight.add_(3.0)
    model.save_pretrained(tmp_path / "b")
    a, b = (specbound.analyze(tmp_path / name, threads=1) for name in "ab")
    effect = {e["name"]: e["effect"] for e in a.assumptions if e["applies"]}["one_plus_weight_norms"]
    assert "folded into QK" not in effect and "folded into no matrix" in effect and "[W_Q^h; W_K^g]" in effect
    q, k = (getattr(attn, f"{n}_proj").weight.detach().double().numpy() for n in "qk")
    rows_a, rows_b = (x.matrices[x.matrices["role"] == "QK"].reset_index() for x in (a, b))
    for h in range(H):
        g = h // (H // KV)
        z = np.concatenate([q[h * D : (h + 1) * D], k[g * D : (g + 1) * D]])
        for rows in (rows_a, rows_b):
            assert rows["frobenius_norm"][h] == pytest.approx(np.linalg.norm(z), rel=1e-9)
            assert rows["spectral_norm"][h] == pytest.approx(np.linalg.norm(z, ord=2), rel=1e-9)
        assert rows_b["lipschitz_factor"][h] > 2 * rows_a["lipschitz_factor"][h]


def test_a_gemma_without_query_key_norms_says_nothing_of_them(tmp_path):
    config = transformers.GemmaConfig(
        hidden_size=N,
        num_hidden_layers=1,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=D,
        intermediate_size=24,
        vocab_size=32,
        max_position_embeddings=P,
    )
    transformers.GemmaForCausalLM(config).save_pretrained(tmp_path)
    a = specbound.analyze(tmp_path, threads=1)
    effect = {e["name"]: e["effect"] for e in a.assumptions if e["applies"]}["one_plus_weight_norms"]
    assert "query/key" not in effect and "folded" not in effect
