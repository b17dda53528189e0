"""Rotary attention through the whole pipeline: every reported QK quantity holds at every relative
position, on a head whose W_Q^T W_K is 0 but whose rotary logits are not, on random heads against dense
products at every offset, and against a real rotary attention module's measured Lipschitz ratio."""

import math

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.lipschitz import attention_factor  # noqa: E402

import specbound  # noqa: E402
from specbound.archs.rotary import parse_rotary  # noqa: E402
from specbound.compute.rotary import rotation  # noqa: E402
from specbound.records.curves import contribution_curves

N, H, D, P = 16, 2, 8, 24  # hidden size, heads, head size, max positions (small: the exact path runs)


def _llama(seed=0, std=0.3, kv=H):
    config = transformers.LlamaConfig(
        hidden_size=N,
        num_hidden_layers=2,
        num_attention_heads=H,
        num_key_value_heads=kv,
        intermediate_size=24,
        vocab_size=32,
        max_position_embeddings=P,
        head_dim=D,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval().double()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=std)
    return model


def _save(model, folder):
    transformers.logging.set_verbosity_error()
    model.float().save_pretrained(folder)
    model.double()
    return folder


def _heads(model, layer):
    attn = model.model.layers[layer].self_attn
    q = attn.q_proj.weight.detach().numpy().astype(np.float64).reshape(-1, D, N)  # (H, d_h, N)
    k = attn.k_proj.weight.detach().numpy().astype(np.float64).reshape(-1, D, N)
    return q, k


def test_a_head_blind_to_w_q_w_k_is_seen_through_its_rotation(tmp_path):
    model = _llama()
    with torch.no_grad():
        for layer in model.model.layers:  # head 0: W_Q = 3 e_1 e_1^T, W_K = 3 e_2 e_2^T in one rotary pair
            q, k = layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight
            q[:D].zero_(), k[:D].zero_()
            q[0, 0] = 3.0  # head dim 0 reads input coordinate 0
            k[D // 2, 1] = 3.0  # head dim d_h/2 (pair 0's partner, HF rotate_half) reads coordinate 1
    a = specbound.analyze(_save(model, tmp_path / "m"), threads=1)
    row = a.matrices[(a.matrices["role"] == "QK") & (a.matrices["head"] == 0)].iloc[0]
    exact = 9 * max(abs(math.sin(d)) for d in range(-(P - 1), P))  # theta_0 = 1: logit 9 x_1 y_2 sin(delta)
    assert row["spectral_norm"] == pytest.approx(exact, rel=1e-12)
    assert row["rank"] >= 1 and row["contribution"] > 0
    assert a.model["rotary"]["pairing"] == "half" and a.model["rotary"]["max_positions"] == P
    # the rotation-blind variant sees W_Q^T W_K = 0 for that head: its bound is smaller
    assert a.adaptive_variants["spectral_adaptive_rotation_blind"] < a.bounds["spectral_adaptive"]


@pytest.mark.parametrize("kv", [H, 1])
def test_every_offset_stays_below_the_reported_quantities(tmp_path, kv):
    model = _llama(seed=3, kv=kv)
    a = specbound.analyze(_save(model, tmp_path / "m"), threads=1)
    layout = parse_rotary(model.config.to_dict(), D, "half")
    sv = a.singular_values
    slack = 1 + 1e-12  # rounding of the dense products (about 1e-15 here)
    for layer in range(2):
        q, k = _heads(model, layer)
        rows = a.matrices[(a.matrices["role"] == "QK") & (a.matrices["layer"] == layer)]
        for h, (i, row) in enumerate(rows.iterrows()):
            g = h // (H // kv)
            mine = sv[sv["matrix"] == i]
            assert set(mine["kind"]) == {"sigma_bound", "horn_envelope"}  # no row claims to be a singular value
            envelope = mine[mine["kind"] == "horn_envelope"]["sigma"].to_numpy()[: int(row["rank"])]
            sigma_bound = mine[mine["kind"] == "sigma_bound"]["sigma"].to_numpy()
            best, best_stable = 0.0, 0.0
            for delta in range(-(P - 1), P):
                x = q[h].T @ rotation(layout, D, delta) @ k[g]  # N x N, at this offset
                s = np.linalg.svd(x, compute_uv=False)
                best, best_stable = max(best, s[0]), max(best_stable, np.sum(s**2) / s[0] ** 2)
                kept = s[s > 1e-10 * N * max(s[0], 1)]
                assert kept.size <= row["rank"]
                for p in (0.05, 0.5, 1.0, 1.5, 2.0):
                    assert np.sum(kept**p) <= np.sum(envelope**p) * slack
                assert np.all(s[: sigma_bound.size] <= sigma_bound * slack + 1e-12 * s[0])
                assert np.sqrt(np.sum(s**2)) <= row["frobenius_norm"] * slack
                assert np.sum(s) <= row["nuclear_norm"] * slack
                assert np.linalg.norm(x, axis=0).sum() <= row["norm_2_1"] * slack
                assert np.abs(x).sum() <= row["norm_1_1"] * slack
            # exact over the offsets, and said so
            assert row["sv_method"] == "rotary_exact_over_offsets" and not pd.isna(row["argmax_offset"])
            assert row["spectral_norm"] == pytest.approx(best, rel=1e-10)
            assert row["stable_rank"] == pytest.approx(best_stable, rel=1e-8)
    assert a.model["rotary"]["qk_spectral_norm"] == {"exact_over_offsets": 2 * H, "product_bound": 0}


def test_a_rotary_attention_module_never_exceeds_the_reported_factor(tmp_path):
    """Measured ``max_t ||A(X + E)_t - A(X)_t|| / max_t ||E_t||`` of the real LlamaAttention (rotary
    positions, unit-norm token rows) stays below the reported ``sum_h c(OV) (1 + 4 c(QK))``."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = _llama(seed=5, std=0.4)
    a = specbound.analyze(_save(model, tmp_path / "m"), threads=1)
    attn = model.model.layers[0].self_attn
    rope = LlamaRotaryEmbedding(model.config).double()
    factor = attention_factor(a, 0)
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(40):
        T = int(rng.integers(2, P))
        x = rng.standard_normal((T, N))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        e = rng.standard_normal((T, N)) * 10 ** rng.uniform(-6, -2)
        xs = torch.tensor(np.stack([x, x + e]))  # a batch of two: X and X + E
        pos = torch.arange(T)[None].expand(2, T)
        with torch.no_grad():
            out = attn(xs, position_embeddings=rope(xs, pos), attention_mask=None)[0].numpy()
        ratio = np.max(np.linalg.norm(out[1] - out[0], axis=1)) / np.max(np.linalg.norm(e, axis=1))
        worst = max(worst, ratio)
    assert 0 < worst <= factor


def test_curves_from_the_records_restate_each_rotary_contribution(tmp_path):
    """C(p) rebuilt from the stored tables (the Horn envelope cut at the rank, not re-thresholded)
    has the bound's own minimum for every matrix, rotary QK heads included."""

    a = specbound.analyze(_save(_llama(seed=3, kv=1), tmp_path / "m"), threads=1)
    curves = contribution_curves(
        a.matrices, a.singular_values, n=N, grid_m=a.options["grid_m"], rank_tol=a.options["rank_tol"]
    )
    minima = curves.groupby("matrix")["c"].min().to_numpy()
    np.testing.assert_allclose(minima, a.matrices["contribution"].to_numpy(), rtol=1e-12)
