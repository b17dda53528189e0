"""Rotary positions of the new families through their own attention code: GPT-J's interleaved pairs on
the first ``rotary_dim`` dimensions, Phi's and Phi-3's partial rotate_half, Falcon's rotate_half behind
a fused per-group weight.  The queries and keys are captured *after* the model's own rotation (one
batch row per input basis vector, one sequence of every position), so the logit matrix of every
relative offset is the model's; no reported QK quantity may be below any of them, and the reported
spectral norm is their exact maximum.  The models build their cos/sin tables in float32 (GPT-J's
``create_sinusoidal_positions``, the rotary embeddings' ``inv_freq``), so their angles carry float32
rounding: the comparisons allow 1e-6 relative, far above that rounding and far below any wrong pairing
or slice (which moves these numbers by tens of percent)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specbound  # noqa: E402
from support.offset_checks import check_offset_matrix  # noqa: E402

N, H, P = 16, 2, 10  # hidden size, heads (d_h = 8), positions


def _gptj():
    return transformers.GPTJForCausalLM(
        transformers.GPTJConfig(
            n_embd=N, n_layer=1, n_head=H, rotary_dim=6, vocab_size=32, n_positions=P, attn_implementation="eager"
        )
    )


def _phi():
    return transformers.PhiForCausalLM(
        transformers.PhiConfig(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            intermediate_size=24,
            vocab_size=32,
            max_position_embeddings=P,
            attn_implementation="eager",
        )
    )  # partial_rotary_factor 0.5


def _phi3():
    return transformers.Phi3ForCausalLM(
        transformers.Phi3Config(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            num_key_value_heads=1,
            intermediate_size=24,
            vocab_size=32,
            pad_token_id=0,
            max_position_embeddings=P,
            original_max_position_embeddings=P,
            attn_implementation="eager",
            partial_rotary_factor=0.75,
        )
    )


def _falcon():
    return transformers.FalconForCausalLM(
        transformers.FalconConfig(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            num_kv_heads=1,
            new_decoder_architecture=True,
            vocab_size=32,
            max_position_embeddings=P,
            bias=True,
        )
    )


def _inputs():
    """``N + 1`` sequences of ``P`` positions: basis vector ``e_i`` at every position, then zeros (to
    remove the biases' part of the queries and keys)."""
    x = torch.zeros(N + 1, P, N, dtype=torch.float64)
    x[:N] = torch.eye(N, dtype=torch.float64)[:, None, :]
    return x, torch.arange(P)[None].expand(N + 1, P)


def _captured_by_attention_interface(monkeypatch, modeling, call):
    """Queries and keys as the eager attention function receives them (after the rotation):
    ``(batch, heads, positions, d_h)``."""
    seen = {}

    def capture(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        seen["q"], seen["k"] = query, key
        return torch.zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype), None

    monkeypatch.setattr(modeling, "eager_attention_forward", capture)
    call()
    return seen["q"], seen["k"]


def _rotated(kind, model, monkeypatch):
    x, pos = _inputs()
    if kind == "falcon":
        from transformers.models.falcon import modeling_falcon as modeling

        seen, original = {}, modeling.apply_rotary_pos_emb

        def capture(q, k, cos, sin, *args, **kwargs):
            seen["q"], seen["k"] = original(q, k, cos, sin, *args, **kwargs)
            return seen["q"], seen["k"]

        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", capture)
        attn, rope = model.transformer.h[0].self_attention, model.transformer.rotary_emb
        with torch.no_grad():
            attn(x, alibi=None, attention_mask=None, position_embeddings=rope(x, pos))
        return seen["q"], seen["k"]
    module = {"gptj": "gptj", "phi": "phi", "phi3": "phi3"}[kind]
    modeling = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=["x"])
    if kind == "gptj":
        attn, rope = model.transformer.h[0].attn, model.transformer.rotary_emb
    else:
        attn, rope = model.model.layers[0].self_attn, model.model.rotary_emb
    with torch.no_grad():
        return _captured_by_attention_interface(
            monkeypatch, modeling, lambda: attn(x, position_embeddings=rope(x, pos), attention_mask=None)
        )


@pytest.mark.parametrize(
    "kind, build, pairing",
    [("gptj", _gptj, "interleaved"), ("phi", _phi, "half"), ("phi3", _phi3, "half"), ("falcon", _falcon, "half")],
)
def test_every_offset_of_the_models_own_rotation_stays_below_the_reported_quantities(
    kind, build, pairing, tmp_path, monkeypatch
):
    torch.manual_seed(4)
    model = build().eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    transformers.logging.set_verbosity_error()
    model.save_pretrained(tmp_path)
    a = specbound.analyze(tmp_path, threads=1)
    assert a.model["rotary"]["pairing"] == pairing
    q, k = _rotated(kind, model.double(), monkeypatch)
    q, k = (q[:N] - q[N]).numpy(), (k[:N] - k[N]).numpy()  # (N inputs, heads, P, d_h): the linear part
    group = q.shape[1] // k.shape[1]
    rows = a.matrices[a.matrices["role"] == "QK"]
    sv = a.singular_values
    slack = 1 + 1e-6
    for h, (i, row) in enumerate(rows.iterrows()):
        envelope = np.sort(sv[sv["matrix"] == i]["sigma"].to_numpy())[::-1][: int(row["rank"])]
        best = 0.0
        for delta in range(-(P - 1), P):  # query at t, key at s, t - s = delta
            t, s = max(delta, 0), max(-delta, 0)
            x = q[:, h, t, :] @ k[:, h // group, s, :].T  # N x N: logit of inputs (e_i at t, e_j at s)
            best = max(best, check_offset_matrix(x, row, envelope, slack))
        assert row["spectral_norm"] == pytest.approx(best, rel=1e-6)  # the exact maximum over the offsets
