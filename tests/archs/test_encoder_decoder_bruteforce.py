"""docs/theory.md 3i checked by brute force on the theorem's model of a real T5 (no biases, no
1/sqrt(d_h), so the model's attention is the theorem's exactly): residual connections removed, RMSNorm
replaced by the projection onto the unit ball, rows of the inputs in the unit ball.  Every reported
Lipschitz factor (a layer's ``lambda`` in its stream, a decoder layer's ``memory_lipschitz`` in the
encoder's output, the encoder-to-output factor ``Z``, the two-input constant ``K``) and every
``alpha * gamma*`` of the matrices perturbed is at least the ratio measured by gradient ascent over
the inputs (and over the perturbation's direction)."""

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specbound  # noqa: E402
from support.lipschitz import measured_lipschitz, unit_rows  # noqa: E402

N, H, D_KV, D_FF = 16, 2, 8, 24
L_E, L_D = 2, 2
N_ENC, N_DEC = 5, 4  # tokens


def _project(x):
    """Normalisation as the projection onto the unit ball, row by row."""
    return x / torch.clamp(x.norm(dim=-1, keepdim=True), min=1.0)


def _attention(att, y, z, bias):
    """T5Attention's own formula (no scaling) from its q, k, v, o modules: queries from ``y``, keys and
    values from ``z``; ``bias`` (heads, n_y, n_z) added to the logits.  Shapes (n, N)."""
    n_y, n_z = y.shape[0], z.shape[0]
    q = att.q(y).view(n_y, H, D_KV).transpose(0, 1)
    k = att.k(z).view(n_z, H, D_KV).transpose(0, 1)
    v = att.v(z).view(n_z, H, D_KV).transpose(0, 1)
    weights = torch.softmax(q @ k.transpose(1, 2) + bias, dim=-1)
    return att.o((weights @ v).transpose(0, 1).reshape(n_y, H * D_KV))


class TheoremT5:
    """The residual-free chain of a T5ForConditionalGeneration (float64), layer by layer."""

    def __init__(self, model):
        self.model = model
        enc0, dec0 = model.encoder.block[0].layer[0].SelfAttention, model.decoder.block[0].layer[0].SelfAttention
        with torch.no_grad():
            self.enc_bias = enc0.compute_bias(N_ENC, N_ENC)[0]
            causal = torch.full((N_DEC, N_DEC), -torch.inf, dtype=torch.float64).triu(1)
            self.dec_bias = dec0.compute_bias(N_DEC, N_DEC)[0] + causal
        self.cross_bias = torch.zeros(H, N_DEC, N_ENC, dtype=torch.float64)

    def encoder_layer(self, i, x):
        b = self.model.encoder.block[i]
        x = _project(_attention(b.layer[0].SelfAttention, x, x, self.enc_bias))
        return _project(b.layer[1].DenseReluDense(x))

    def decoder_layer(self, j, y, z):
        b = self.model.decoder.block[j]
        y = _project(_attention(b.layer[0].SelfAttention, y, y, self.dec_bias))
        y = _project(_attention(b.layer[1].EncDecAttention, y, z, self.cross_bias))
        return _project(b.layer[2].DenseReluDense(y))

    def encode(self, x):
        for i in range(L_E):
            x = self.encoder_layer(i, x)
        return x

    def __call__(self, x, y):
        z = self.encode(x)
        for j in range(L_D):
            y = self.decoder_layer(j, y, z)
        return y


@pytest.fixture(scope="module", params=["relu", "gated-gelu"])
def t5(request, tmp_path_factory):
    torch.manual_seed(1)
    config = transformers.T5Config(
        d_model=N,
        d_kv=D_KV,
        num_layers=L_E,
        num_decoder_layers=L_D,
        num_heads=H,
        d_ff=D_FF,
        vocab_size=30,
        feed_forward_proj=request.param,
    )
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # matrices of norm below 1 keep every row inside the unit ball (the projection idle) and
            # the softmax unsaturated, so the bounds are not loose by orders of magnitude
            torch.nn.init.normal_(p, std=0.1)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    analysis = specbound.analyze(folder, threads=1)
    return TheoremT5(model.double()), analysis


def _layer(analysis, layer):
    layers = analysis.layers
    return layers[layers["layer"] == layer].iloc[0]


def test_each_layer_factor_bounds_the_measured_one(t5):
    model, analysis = t5
    for i in range(L_E):
        measured = measured_lipschitz(lambda x, i=i: model.encoder_layer(i, x), [(N_ENC, N)], [0], seed=i)
        assert 0 < measured <= _layer(analysis, i)["lambda"], ("encoder", i)
    for j in range(L_D):
        row = _layer(analysis, L_E + j)
        layer = lambda y, z, j=j: model.decoder_layer(j, y, z)  # noqa: E731
        shapes = [(N_DEC, N), (N_ENC, N)]
        in_stream = measured_lipschitz(layer, shapes, [0], seed=10 + j)
        in_memory = measured_lipschitz(layer, shapes, [1], seed=20 + j)
        assert 0 < in_stream <= row["lambda"], ("decoder stream", j, in_stream, row["lambda"])
        assert 0 < in_memory <= row["memory_lipschitz"], ("decoder memory", j, in_memory, row["memory_lipschitz"])


def test_the_encoder_s_output_factor_z_bounds_the_decoder(t5):
    model, analysis = t5
    lambdas = analysis.layers["lambda"].to_numpy()
    decoder = [_layer(analysis, L_E + j) for j in range(L_D)]
    z_factor = sum(
        math.prod(lambdas[L_E + k] for k in range(j + 1, L_D)) * decoder[j]["memory_lipschitz"] for j in range(L_D)
    )
    # the encoder's last layer has alpha = Z (nothing of the encoder after it)
    assert _layer(analysis, L_E - 1)["downstream_factor"] == pytest.approx(z_factor, rel=1e-12)
    shapes = [(N_ENC, N), (N_DEC, N)]
    dec_only = lambda z, y: model.decoder_layer(1, model.decoder_layer(0, y, z), z)  # noqa: E731
    assert 0 < measured_lipschitz(dec_only, shapes, [0], seed=3) <= z_factor


@pytest.mark.parametrize("t5", ["relu"], indirect=True)
def test_the_model_s_factors_bound_it_end_to_end(t5):
    """Through the encoder (``(prod_encoder Lambda) Z``) and in both inputs (``K``, the chain
    baselines' product).  ReLU only: the gated block's factor at small inputs is loose by orders of
    magnitude per layer (``gelu(a) b`` is quadratic there), ~1e-30 over four layers, no power."""
    model, analysis = t5
    lambdas = analysis.layers["lambda"].to_numpy()
    shapes = [(N_ENC, N), (N_DEC, N)]
    through_encoder = measured_lipschitz(model, shapes, [0], seed=4)
    assert 0 < through_encoder <= math.prod(lambdas[:L_E]) * _layer(analysis, L_E - 1)["downstream_factor"]
    assert 0 < measured_lipschitz(model, shapes, [0, 1], seed=5) <= analysis.baselines["spectral_product"]


def _head_rows(h):
    return slice(h * D_KV, (h + 1) * D_KV)


def _perturbations(model):
    """``(name, layer, role, head, parameter, delta of the parameter, delta of the role's matrix)``:
    one perturbation of a weight per kind the theorem's sensitivities name, the matrix's change in the
    row orientation of docs/theory.md 1 (``QK = W_Q^T W_K`` from the torch (out, in) weights)."""
    gen = torch.Generator().manual_seed(7)
    out = []
    enc, dec = model.model.encoder.block, model.model.decoder.block
    for name, layer, role, att in (
        ("enc QK", 0, "QK", enc[0].layer[0].SelfAttention),
        ("dec QK", L_E, "QK", dec[0].layer[0].SelfAttention),
        ("dec QK_cross", L_E, "QK_cross", dec[0].layer[1].EncDecAttention),
    ):
        delta = torch.zeros_like(att.q.weight)
        delta[_head_rows(1)] = torch.randn(D_KV, N, dtype=torch.float64, generator=gen)
        dm = delta[_head_rows(1)].T @ att.k.weight[_head_rows(1)].detach()
        out.append((name, layer, role, 1, att.q.weight, delta, dm))
    for name, layer, role, att in (
        ("enc OV", 0, "OV", enc[0].layer[0].SelfAttention),
        ("dec OV", L_E, "OV", dec[0].layer[0].SelfAttention),
        ("dec OV_cross", L_E + 1, "OV_cross", dec[1].layer[1].EncDecAttention),
    ):
        delta = torch.zeros_like(att.o.weight)
        delta[:, _head_rows(0)] = torch.randn(N, D_KV, dtype=torch.float64, generator=gen)
        dm = att.v.weight[_head_rows(0)].detach().T @ delta[:, _head_rows(0)].T
        out.append((name, layer, role, 0, att.o.weight, delta, dm))
    for name, layer, ff in (
        ("enc FF_out", 1, enc[1].layer[1].DenseReluDense),
        ("dec FF_out", L_E + 1, dec[1].layer[2].DenseReluDense),
    ):
        delta = torch.randn(*ff.wo.weight.shape, dtype=torch.float64, generator=gen)
        out.append((name, layer, "FF_out", None, ff.wo.weight, delta, delta.T))
    first = dec[0].layer[2].DenseReluDense  # FF_in, or the gated block's FF_gate
    w, role = (first.wi_0.weight, "FF_gate") if hasattr(first, "wi_0") else (first.wi.weight, "FF_in")
    delta = torch.randn(*w.shape, dtype=torch.float64, generator=gen)
    out.append((f"dec {role}", L_E, role, None, w, delta, delta.T))
    return out


def test_each_sensitivity_bounds_its_layer_s_move(t5):
    """Perturbing one matrix by ``Delta`` moves its layer's output by at most ``gamma* ||Delta||_2``
    (docs/theory.md 3i: a decoder's self-attention through the cross-attention's queries, a cross
    matrix with the encoder's output held); ``alpha`` carries it on (the factors tested above)."""
    model, analysis = t5
    m = analysis.matrices
    gen = torch.Generator().manual_seed(11)
    for name, layer, role, head, param, delta, dm in _perturbations(model):
        rows = m[(m["layer"] == layer) & (m["role"] == role)]
        row = rows.iloc[head] if head is not None else rows.iloc[0]
        bound = row["gamma"] * float(torch.linalg.matrix_norm(dm, 2))
        step = 1e-6 / float(torch.linalg.matrix_norm(dm, 2))
        if layer < L_E:
            f = lambda x, y, layer=layer: model.encoder_layer(layer, x)  # noqa: E731
        else:
            f = lambda x, y, layer=layer: model.decoder_layer(layer - L_E, y, x)  # noqa: E731
        worst = 0.0
        for _ in range(8):
            x, y = unit_rows((N_ENC, N), 1.0, gen), unit_rows((N_DEC, N), 1.0, gen)
            with torch.no_grad():
                before = f(x, y)
                param += step * delta
                after = f(x, y)
                param -= step * delta
            worst = max(worst, float((after - before).norm(dim=-1).max()) / step)
        assert 0 < worst <= bound, (name, worst, bound)
