"""DeBERTa-v2/v3's disentangled attention (docs/theory.md 3h), held against the module itself.

The derivation rests on one structural fact: with ``share_att_key`` every logit of head ``h`` is

    a_ij = [x_i QK x_j^T + x_i QK p_{c(i,j)}^T + p_{r(j,i)} QK x_j^T] / sqrt(3 d_h),
    QK = W_Q^h W_K^h^T,

the content-to-position and position-to-content terms reusing the head's own ``QK`` against rows
``p`` of the layer-normalised relative embedding table.  The first test rebuilds the module's logits
from that formula (biases set to zero: specbound ignores biases); the second checks the Lipschitz
inequality the bound uses on the module's own logits; the last that the analysis puts
``1 + 2 (2 + n) c(QK)`` into Lambda and ``2 (1 + n) c(OV)`` into gamma*.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import json

from support.lipschitz import measured_lipschitz, unit_rows

import specbound  # noqa: E402
from specbound.cli import main

N, H, D_FF, T = 32, 4, 48, 7
D = N // H


def _model(pos_att_type=("p2c", "c2p")):
    torch.manual_seed(3)
    config = transformers.DebertaV2Config(
        hidden_size=N,
        num_hidden_layers=2,
        num_attention_heads=H,
        intermediate_size=D_FF,
        vocab_size=50,
        relative_attention=True,
        pos_att_type=list(pos_att_type),
        position_buckets=4,
        max_relative_positions=8,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        position_biased_input=False,
    )
    model = transformers.DebertaV2Model(config).eval()
    for name, p in model.named_parameters():
        torch.nn.init.normal_(p, std=0.3)
        if name.endswith("_proj.bias"):  # biases are outside the analysed matrices
            torch.nn.init.zeros_(p)
    return model.double()


def _row(linear):
    """Row-oriented weight (x -> x W) of a bias-free Linear."""
    return linear.weight.detach().numpy().T


def _module_logits(model, x):
    """Head logits of layer 0's attention, up to a constant per query row (from its probabilities),
    shape (H, T, T), each row centred."""
    enc = model.encoder
    att = enc.layer[0].attention.self
    hidden = torch.tensor(x[None])
    rel = enc.get_rel_embedding()
    rel_pos = enc.get_rel_pos(hidden)
    mask = torch.ones(1, 1, T, T, dtype=torch.bool)
    with torch.no_grad():
        _, probs = att(hidden, mask, output_attentions=True, relative_pos=rel_pos, rel_embeddings=rel)
    logits = torch.log(probs[0]).numpy()
    return logits - logits.mean(axis=-1, keepdims=True)


def _formula_logits(model, x, terms):
    """The same logits from the bilinear forms of docs/theory.md 3d, each row centred."""
    enc = model.encoder
    att = enc.layer[0].attention.self
    with torch.no_grad():
        p = enc.get_rel_embedding().numpy()
        rel_pos = enc.get_rel_pos(torch.tensor(x[None])).numpy().reshape(T, T)
    span = att.pos_ebd_size
    c2p = np.clip(rel_pos + span, 0, 2 * span - 1)  # row of p in x_i QK p^T for query i, key j
    p2c = np.clip(-rel_pos + span, 0, 2 * span - 1)  # row of p in p QK x_j^T, indexed [j, i]
    wq, wk = _row(att.query_proj), _row(att.key_proj)
    out = []
    for h in range(H):
        qk = wq[:, h * D : (h + 1) * D] @ wk[:, h * D : (h + 1) * D].T
        a = x @ qk @ x.T
        if "c2p" in terms:
            a = a + np.einsum("in,ijn->ij", x @ qk, p[c2p])
        if "p2c" in terms:
            a = a + np.einsum("jin,jn->ij", p[p2c] @ qk, x)
        a = a / _module_scale(1 + len(terms))
        out.append(a - a.mean(axis=-1, keepdims=True))
    return np.stack(out)


def _module_scale(factor):
    """``sqrt(d_h * factor)`` as the module forms it: in float32 (scaled_size_sqrt)."""
    return float(torch.sqrt(torch.tensor(D * factor, dtype=torch.float32)))


def _unit_rows(rng, rows=T):
    x = rng.standard_normal((rows, N))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("terms", [("p2c", "c2p"), ("c2p",), ("p2c",)])
def test_position_terms_reuse_the_heads_qk(terms):
    model = _model(terms)
    x = _unit_rows(np.random.default_rng(0))
    np.testing.assert_allclose(_module_logits(model, x), _formula_logits(model, x, terms), rtol=0, atol=1e-9)
    # without the position terms the module's logits are not reproduced: the terms are really there
    assert (
        np.max(
            np.abs(
                _module_logits(model, x)
                - _formula_logits(model, x, ()) * _module_scale(1) / _module_scale(1 + len(terms))
            )
        )
        > 1e-3
    )


def test_logit_spread_obeys_the_lipschitz_inequality():
    """Perturbing the unit rows by at most eps moves each unscaled logit by at most
    (2 + n rho) c(QK) eps (rho: the largest position row's norm), so the spread of a row's change,
    which is what the softmax sees, by at most twice that."""
    model = _model()
    att = model.encoder.layer[0].attention.self
    with torch.no_grad():
        rho = float(np.linalg.norm(model.encoder.get_rel_embedding().numpy(), axis=1).max())
    wq, wk = _row(att.query_proj), _row(att.key_proj)
    c = np.array([np.linalg.norm(wq[:, h * D : (h + 1) * D] @ wk[:, h * D : (h + 1) * D].T, 2) for h in range(H)])
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = _unit_rows(rng)
        eps = 10.0 ** rng.uniform(-4, -1)
        delta = rng.standard_normal((T, N))
        delta *= eps / np.linalg.norm(delta, axis=1, keepdims=True)
        change = (_module_logits(model, x + delta) - _module_logits(model, x)) * _module_scale(3)
        spread = change.max(axis=-1) - change.min(axis=-1)  # (H, T)
        assert np.all(spread <= 2 * (2 + 2 * rho) * c[:, None] * eps * (1 + 1e-9))


def test_analysis_puts_the_position_terms_into_lambda_and_gamma(tmp_path):
    model = _model()
    model.float().save_pretrained(tmp_path)
    result = specbound.analyze(tmp_path, threads=1)
    assert result.model["position_terms"] == 2
    assert "disentangled_attention" in {a["name"] for a in result.assumptions if a["applies"]}
    m, layers = result.matrices, result.layers
    for layer in range(2):
        rows = m[m["layer"] == layer]
        c = {role: rows[rows["role"] == role]["spectral_norm"].to_numpy() for role in ("QK", "OV", "FF_in", "FF_out")}
        lam = 1.13 * c["FF_in"][0] * c["FF_out"][0] * np.sum(c["OV"] * (1 + 2 * (2 + 2) * c["QK"]))
        assert layers["lambda"][layer] == pytest.approx(lam, rel=1e-12)
        gamma_qk = rows[rows["role"] == "QK"]["gamma"].to_numpy()
        np.testing.assert_allclose(gamma_qk, 2 * (1 + 2) * c["OV"] * c["FF_in"][0] * c["FF_out"][0], rtol=1e-12)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"share_att_key": False}, "share_att_key"),
        ({"norm_rel_ebd": "none"}, "norm_rel_ebd"),
        ({"pos_att_type": ["c2p", "x2y"]}, "x2y"),
    ],
)
def test_configs_outside_the_derivation_are_refused(tmp_path, change, needle, capsys):
    _model().float().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_convolution_layer_is_refused_naming_it(tmp_path, capsys):
    torch.manual_seed(0)
    transformers.DebertaV2Model(
        transformers.DebertaV2Config(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            intermediate_size=D_FF,
            vocab_size=50,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            conv_kernel_size=3,
        )
    ).save_pretrained(tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "encoder.conv." in err and "convolution" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("terms", [("p2c", "c2p"), ("c2p",)])
def test_attention_output_obeys_the_factors_by_brute_force(terms):
    """The module's attention output (self-attention then ``attention.output.dense``, biases zero) on
    rows in the unit ball, the position rows ``p`` of norm 1 (normalisation as projection) and the
    query weights scaled by the module's ``sqrt((1 + n) d_h)``, so that its logits are exactly the
    theorem's: gradient ascent over the inputs finds no ratio above ``sum_h c(OV_h)(1 + 2 (2 + n)
    c(QK_h))``, and perturbing head 1's ``QK`` by ``Delta`` moves the output by at most
    ``2 (1 + n) c(OV_1) ||Delta||`` (docs/theory.md 3h; the feed-forward factor is section 3's)."""

    n = len(terms)
    model = _model(terms)
    enc, layer = model.encoder, model.encoder.layer[0]
    att, dense = layer.attention.self, layer.attention.output.dense
    with torch.no_grad():
        torch.nn.init.zeros_(dense.bias)
        for w in (att.query_proj.weight, att.key_proj.weight):
            w *= 0.3  # logits of order one, so the softmax is not saturated
        wq, wk, wv, wo = (_row(m).copy() for m in (att.query_proj, att.key_proj, att.value_proj, dense))
        att.query_proj.weight *= _module_scale(1 + n)
        rel = enc.get_rel_embedding()
        rel = rel / rel.norm(dim=-1, keepdim=True)
    heads = [slice(h * D, (h + 1) * D) for h in range(H)]
    qk = [np.linalg.norm(wq[:, s] @ wk[:, s].T, 2) for s in heads]
    ov = [np.linalg.norm(wv[:, s] @ wo[s], 2) for s in heads]
    mask = torch.ones(1, 1, T, T, dtype=torch.bool)
    rel_pos = enc.get_rel_pos(torch.zeros(1, T, N, dtype=torch.float64))

    def output(x):
        return dense(att(x[None], mask, relative_pos=rel_pos, rel_embeddings=rel)[0][0])

    factor = sum(o * (1 + 2 * (2 + n) * q) for o, q in zip(ov, qk))
    assert 0 < measured_lipschitz(output, [(T, N)], [0], steps=40) <= factor

    gen = torch.Generator().manual_seed(5)
    delta = torch.zeros_like(att.query_proj.weight)
    delta[heads[1]] = torch.randn(D, N, dtype=torch.float64, generator=gen)
    d_qk = float(np.linalg.norm(delta[heads[1]].numpy().T @ wk[:, heads[1]].T, 2))
    step = 1e-6 / d_qk
    worst = 0.0
    for _ in range(8):
        x = unit_rows((T, N), 1.0, gen)
        with torch.no_grad():
            before = output(x)
            att.query_proj.weight += step * _module_scale(1 + n) * delta  # the logits' QK moves by step * dQK
            after = output(x)
            att.query_proj.weight -= step * _module_scale(1 + n) * delta
        worst = max(worst, float((after - before).norm(dim=-1).max()) / step)
    assert 0 < worst <= 2 * (1 + n) * ov[1] * d_qk


def test_without_relative_attention_the_terms_are_off(tmp_path):
    """``relative_attention: false`` with ``pos_att_type`` still listed: the module adds no position
    term (its logits are ``x QK x^T`` over its scale), and the analysis is the plain chain's
    (``1 + 4 c(QK)``, no ``disentangled_attention``)."""
    torch.manual_seed(4)
    model = transformers.DebertaV2Model(
        transformers.DebertaV2Config(
            hidden_size=N,
            num_hidden_layers=1,
            num_attention_heads=H,
            intermediate_size=D_FF,
            vocab_size=50,
            relative_attention=False,
            pos_att_type=["p2c", "c2p"],
        )
    ).eval()
    for name, p in model.named_parameters():
        torch.nn.init.normal_(p, std=0.3)
        if name.endswith("_proj.bias"):
            torch.nn.init.zeros_(p)
    model.save_pretrained(tmp_path)
    model = model.double()
    att = model.encoder.layer[0].attention.self
    x = _unit_rows(np.random.default_rng(2))
    with torch.no_grad():
        _, probs = att(torch.tensor(x[None]), torch.ones(1, 1, T, T, dtype=torch.bool), output_attentions=True)
    logits = torch.log(probs[0]).numpy()
    wq, wk = _row(att.query_proj), _row(att.key_proj)
    for h in range(H):
        plain = x @ wq[:, h * D : (h + 1) * D] @ wk[:, h * D : (h + 1) * D].T @ x.T / _module_scale(3)
        np.testing.assert_allclose(
            logits[h] - logits[h].mean(-1, keepdims=True), plain - plain.mean(-1, keepdims=True), rtol=0, atol=1e-9
        )
    result = specbound.analyze(tmp_path, threads=1)
    assert "position_terms" not in result.model
    assert "disentangled_attention" not in {a["name"] for a in result.assumptions if a["applies"]}
    m = result.matrices
    c = {role: m[m["role"] == role]["spectral_norm"].to_numpy() for role in ("QK", "OV", "FF_in", "FF_out")}
    lam = 1.13 * c["FF_in"][0] * c["FF_out"][0] * np.sum(c["OV"] * (1 + 4 * c["QK"]))
    assert result.layers["lambda"][0] == pytest.approx(lam, rel=1e-12)
