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

N, H, KV, D, P = 16, 4, 2, 8, 24

FAMILIES = {  # model class, config class, modeling module, extra config
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", "qwen3", {"head_dim": D}),
    "gemma3_text": ("Gemma3ForCausalLM", "Gemma3TextConfig", "gemma3", {"head_dim": D}),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", "olmo2", {}),
}


def _model(family, eps, seed=0):
    cls, cfg, _, extra = FAMILIES[family]
    config = getattr(transformers, cfg)(
        hidden_size=N, num_hidden_layers=1, num_attention_heads=H, num_key_value_heads=KV, intermediate_size=24,
        vocab_size=32, max_position_embeddings=P, rms_norm_eps=eps, attn_implementation="eager", **extra)
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

    def capture(mod, query, key, *args, **kw):  # the rotated, normalised q and k
        captured["q"], captured["k"] = query.detach().numpy(), key.detach().numpy()
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
    assert f"qk-norm: RMSNorm over" in str(a) and f"largest {kappa.max():.6g}" in str(a)  # said in the summary
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
    factor = float(np.sum(rows[rows["role"] == "OV"]["lipschitz_factor"].to_numpy()
                          * (1 + 4 * rows[rows["role"] == "QK"]["lipschitz_factor"].to_numpy())))
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
    from specbound.archs.model import QKNorm
    from specbound.compute.qk_logit import qk_norm_lipschitz

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
            wq = np.full(H, min(np.sqrt(np.sum(s1q ** 2)), np.linalg.norm(q)))
            wk = np.full(KV, min(np.sqrt(np.sum(s1k ** 2)), np.linalg.norm(k)))
        lq, lk = np.abs(gq).max(1) * wq / np.sqrt(eps), np.abs(gk).max(1) * wk / np.sqrt(eps)
        rq = np.abs(gq).max(1) * np.sqrt(nq) * s1q / np.sqrt(s1q ** 2 + nq * eps)
        rk = np.abs(gk).max(1) * np.sqrt(nk) * s1k / np.sqrt(s1k ** 2 + nk * eps)
        np.testing.assert_allclose(got, a ** 2 * np.maximum(lq * rk[kv], rq * lk[kv]), rtol=1e-12)
    # the whole projection's norm bound is no smaller than its exact spectral norm
    assert np.sqrt(np.sum(s1q ** 2)) >= np.linalg.svd(q.reshape(H * D, N), compute_uv=False)[0]
