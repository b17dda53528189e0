"""Invariants held on every shipped family's tiny model (tests/support/families.py is the table: a
family added there gets every test here with no extra code).

* each row describes one matrix: ``spectral <= Frobenius <= nuclear``, ``Frobenius <= sqrt(rank)
  spectral``, ``stable rank <= rank`` (docs/spec.md section 2);
* ``frobenius_product >= spectral_product`` (docs/bounds.md section 8: each layer factor with the
  Frobenius-side analogue of every Lipschitz factor in place of it, a QK-norm head's ``kappa_F >= kappa``);
* every column that claims to bound a quantity is at least that quantity, computed by brute force from
  the module's own matrices: a rotary head's at every relative offset (dense ``W_Q^T M(delta) W_K``), a
  QK-norm head's Lipschitz factor against gradient ascent on its normalised logit;
* the gap forms recomputed from their written derivation (docs/bounds.md section 9; the quadrature of
  tests/support/gap_oracle.py for the spectrum-adaptive family).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dataclasses import replace

from support.families import (
    FAMILIES,
    TOWER,
    H,
    num_layers,
    reference_matrices,
    save_family,  # noqa: E402
    text_view,
)
from support.gap_oracle import adaptive_gap_integral
from support.lipschitz import measured_lipschitz

import specbound  # noqa: E402
from specbound.bounds.schatten import schatten_grid  # noqa: E402
from specbound.compute.rotary import rotations
from specbound.pipeline import open_model

N_SAMPLES, MARGIN, DELTA = 10**6, 1.0, 0.05
REL = 1e-9  # rounding of the reported norms (float64 spectra of float32 weights)
# Offsets brute-forced: every one for the families' contexts up to 256 positions (every tiny model that gets
# the exact maximum over offsets); the longer contexts, whose tiny models get bounds valid for every rotation
# matrix (rotary_product_bound), on |delta| < 256
MAX_POSITIONS = 256
MAX_GRID = 12  # a 2D layout's grid (rows and columns) brute-forced: every offset of the tiny models' 4 x 4 grids


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def analysed(request, tmp_path_factory):
    """``(family, analysis, model, folder)``: the family's tiny model saved and analysed once, with a gap
    bound; the model in float64 (its saved float32 weights, upcast exactly)."""
    folder = tmp_path_factory.mktemp(f"inv_{request.param}")
    transformers.logging.set_verbosity_error()
    model = save_family(request.param, folder)
    a = specbound.analyze(folder, threads=1, n=N_SAMPLES, margin=MARGIN, delta=DELTA, tower=TOWER.get(request.param))
    return request.param, a, model.double(), folder


def test_every_row_describes_one_matrix(analysed):
    family, a, _, _ = analysed
    m = a.matrices
    spectral, frob, nuclear = (m[c].to_numpy() for c in ("spectral_norm", "frobenius_norm", "nuclear_norm"))
    rank, stable = m["rank"].to_numpy(), m["stable_rank"].to_numpy()
    assert np.all(spectral <= frob * (1 + REL)), family
    assert np.all(frob <= nuclear * (1 + REL)), family
    assert np.all(frob <= np.sqrt(rank) * spectral * (1 + REL)), family
    assert np.all(stable <= rank * (1 + REL)), family
    assert np.all(m["lipschitz_factor_frobenius"] >= m["lipschitz_factor"] * (1 - REL)), family
    plain = m["role"] != "QK" if "qk_norm" in a.model else np.ones(len(m), dtype=bool)
    if "latent_attention" in a.model:  # QK and OV rows carry the latent factors (docs/theory.md 3l)
        plain = ~m["role"].isin(["QK", "OV"])
    assert (m["lipschitz_factor"][plain] == m["spectral_norm"][plain]).all(), family
    assert (m["lipschitz_factor_frobenius"][plain] == m["frobenius_norm"][plain]).all(), family


def test_the_frobenius_product_is_at_least_the_spectral_product(analysed):
    family, a, _, _ = analysed
    b = a.baselines
    assert b["frobenius_product"] >= b["spectral_product"] * (1 - REL), family
    np.testing.assert_array_less(a.layers["lambda"] * (1 - REL), a.layers["lambda_frobenius"], err_msg=family)


def _measured(matrices, rank_tol):
    """Per matrix of a stack ``(k, a, b)``: spectral, Frobenius, nuclear, (2,1), (1,1) norms, rank, stable rank."""
    s = np.linalg.svd(matrices, compute_uv=False)
    tau = rank_tol * min(matrices.shape[1:]) * np.maximum(s[:, 0], 1.0)
    frob = np.sqrt(np.sum(s**2, axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        stable = np.where(s[:, 0] > 0, frob**2 / s[:, 0] ** 2, 0.0)
    return {
        "spectral_norm": s[:, 0],
        "frobenius_norm": frob,
        "nuclear_norm": np.where(s > tau[:, None], s, 0.0).sum(axis=1),
        "norm_2_1": np.linalg.norm(matrices, axis=1).sum(axis=1),
        "norm_1_1": np.abs(matrices).sum(axis=(1, 2)),
        "rank": np.count_nonzero(s > tau[:, None], axis=1),
        "stable_rank": stable,
    }


def _offset_matrices(factors, layout, attention_factor):
    """``a^2 W_Q^T M(delta) W_K`` at every offset ``|delta| < min(P, MAX_POSITIONS)``, shape ``(2P - 1, N, N)``;
    with several position axes at every offset vector of the layout (docs/rotary.md section 7), or of a vision tower's
    grid (section 9) cut to its first ``MAX_GRID`` positions a side when longer (an unbounded grid)."""

    q, k = factors  # (N, d) each: W_Q^h.T, W_K^g.T
    p = min(layout.max_positions, MAX_POSITIONS)
    if layout.axes is None:
        deltas = np.arange(-(p - 1), p)
    else:  # the tiny M-RoPE towers have small contexts: every offset vector is brute-forced
        if not layout.shared_shift:
            layout = replace(
                layout,
                grid=tuple(min(g, MAX_GRID) for g in layout.grid),
                max_positions=min(layout.max_positions, MAX_GRID),
            )
        assert layout.max_offset_count <= 10**4, layout
        deltas = layout.offsets
    m = rotations(layout, q.shape[1], deltas)
    return attention_factor**2 * np.einsum("ai,tij,bj->tab", q, m, k)


def test_every_bound_claiming_column_holds_for_its_matrix_at_every_offset(analysed):
    """Each row's norms, rank and stable rank against the module's own matrix (``reference_matrices``:
    the model's modules called on identity inputs), a rotary head's against its matrix at every offset:
    never below it (to rounding), and the Lipschitz factor of a plain matrix is its spectral norm."""

    family, a, model, folder = analysed
    get = FAMILIES[family][1](model)
    kv = get(0)["k"].shape[1] // (get(0)["q"].shape[1] // H) if "q" in get(0) else H  # latent attention: H
    ref = reference_matrices(get, H, kv, num_layers(model))
    opened = open_model(folder, tower=TOWER.get(family))
    rank_tol = a.options["rank_tol"]
    columns = ("spectral_norm", "frobenius_norm", "nuclear_norm", "norm_2_1", "norm_1_1", "rank", "stable_rank")
    for (role, w, factors), row in zip(ref, a.matrices.itertuples()):
        if factors is not None and opened.rotary is not None:
            layout = opened.rotary_for(row.layer)
            stack = _offset_matrices(factors, layout, 1.0)  # the factors carry the module's attention factor
        else:
            stack = w[None]
        truth = _measured(stack, rank_tol)
        for column in columns:
            claimed, worst = getattr(row, column), truth[column].max()
            assert claimed >= worst * (1 - REL) - 1e-300, (family, row.layer, row.head, role, column, claimed, worst)
        if "latent_attention" in a.model and role in ("QK", "OV"):  # their own factors (docs/theory.md 3l)
            continue
        if "qk_norm" not in a.model or role != "QK":
            assert row.lipschitz_factor == row.spectral_norm


def _normalised(attn, which, x):
    """The module's normalised queries (``which = "q"``) or keys of rows ``x``, shape ``(..., heads, d_h)``."""
    proj = getattr(attn, f"{which}_proj")(x)
    if hasattr(attn, "qk_norm"):  # Llama 4: one weightless norm over each head of both
        return attn.qk_norm(proj.view(*proj.shape[:-1], -1, attn.head_dim))
    norm, d = getattr(attn, f"{which}_norm"), attn.head_dim
    if norm.weight.numel() == d:  # a norm per head (Qwen3, Gemma 3)
        return norm(proj.view(*proj.shape[:-1], -1, d))
    return norm(proj).view(*proj.shape[:-1], -1, d)  # over the whole projection (OLMo2)


def _zero_and_far_offsets(layout):
    """Offset 0 and a far one: ``P - 1``; with several position axes the zero vector (the middle of the sorted,
    symmetric set) and ``(P - 1, ..., P - 1, P - 2)``, off the text diagonal; only 0 without rotary positions."""
    if layout is None:
        return (0,)
    if layout.axes is None:
        return (0, layout.max_positions - 1)
    offsets = layout.offsets
    return offsets[len(offsets) // 2], offsets[-2]


def test_a_qk_norm_heads_lipschitz_factor_holds_against_gradient_ascent(analysed):
    """``kappa_h`` (the QK row's ``lipschitz_factor``) bounds the normalised logit ``q_h(x) M k_g(y)^T``'s
    change per unit move of either token, at offsets 0 and the last, as gradient ascent over unit-ball
    tokens (tests/support/lipschitz.py) measures it on the module's own projections and norms."""

    family, a, model, folder = analysed
    if "qk_norm" not in a.model:
        pytest.skip("no query/key normalisation")
    opened = open_model(folder, tower=TOWER.get(family))
    rows = a.matrices[a.matrices["role"] == "QK"]
    model = text_view(family, model)  # a wrapper's text decoder
    for layer in range(model.config.num_hidden_layers):
        attn = getattr(model, "model", model).layers[layer].self_attn  # a bare text model's layers are its own
        if not any(hasattr(attn, n) for n in ("q_norm", "qk_norm")):
            continue  # a layer that does not normalise (Llama 4's NoPE layers)
        layout = opened.rotary_for(layer)  # None: a layer without rotary positions (EXAONE 4's global layers)
        group = H // model.config.num_key_value_heads
        factor = 1.0 if layout is None else layout.attention_factor**2
        for delta in _zero_and_far_offsets(layout):
            m = (
                torch.eye(attn.head_dim, dtype=torch.float64)
                if layout is None
                else torch.tensor(rotations(layout, attn.head_dim, [delta])[0])
            )
            for h, kappa in enumerate(rows[rows["layer"] == layer]["lipschitz_factor"]):

                def logit(x, y):  # noqa: B023 (called within the loop)
                    q, k = _normalised(attn, "q", x)[..., h, :], _normalised(attn, "k", y)[..., h // group, :]
                    return factor * ((q @ m) * k).sum(dim=-1, keepdim=True)

                for side in (0, 1):
                    found = measured_lipschitz(logit, [(1, attn.config.hidden_size)] * 2, [side], restarts=1, steps=20)
                    assert 0 < found <= kappa, (family, layer, h, delta, side, found / kappa)


def _kept(a):
    """Each row's kept values (what its ``S_p`` sums over): the first ``rank`` singular values, or of a
    rotary head's Horn envelope."""
    sv = a.singular_values
    out = []
    for i, row in enumerate(a.matrices.itertuples()):
        mine = sv[sv["matrix"] == i]
        kind = "horn_envelope" if (mine["kind"] == "horn_envelope").any() else "singular_value"
        values = np.sort(mine[mine["kind"] == kind]["sigma"].to_numpy())[::-1]
        out.append(values[: row.rank])
    return out


def test_the_gap_forms_are_their_written_derivation(analysed):
    """docs/bounds.md section 9 restated from the tables: the spectrum-adaptive family's leading term is the
    entropy integral with the budget split over the ``T`` covered matrices (scale_T = scale T / L), each at
    the index with the smallest integral (tests/support/gap_oracle.py), fixed ``p`` at its own index; its
    union cost ``#matrices ln(2m + 1)``; the chain proxies' ``B ln(2W) ln n / (margin sqrt(n))``."""

    family, a, _, _ = analysed
    m, dims = a.matrices, a.model
    kept = _kept(a)
    covered = sum(1 for s in kept if s.size)
    terms = [(s, row.rows, row.cols, 10**row.log10_scale * covered / dims["L"]) for s, row in zip(kept, m.itertuples())]
    grid_m = a.options["grid_m"]
    gaps = a.gap_bound["bounds"]
    confidence = lambda u: math.sqrt((math.log(1 / DELTA) + u) / N_SAMPLES)  # noqa: E731
    for name, grid, union in (
        ("spectral_adaptive", schatten_grid(grid_m), len(m) * math.log(2 * grid_m + 1)),
        ("spectral_fixed_p0", [0.0], 0.0),
        ("spectral_fixed_p1", [1.0], 0.0),
        ("spectral_fixed_p2", [2.0], 0.0),
    ):
        g = gaps[name]
        integral = adaptive_gap_integral(terms, grid, MARGIN, math.sqrt(dims["L"]))
        assert g["union_cost"] == pytest.approx(union, rel=1e-12), (family, name)
        assert g["leading"] == pytest.approx(integral / math.sqrt(N_SAMPLES), rel=1e-8), (family, name)
        assert g["gap"] == pytest.approx(g["leading"] + confidence(union), rel=1e-12), (family, name)
    widest = max(dims["N"], dims["d_ff"], *m["rows"], *m["cols"])
    for name in ("edelman", "bft", "l11_proxy"):
        value = a.bounds.get(name, a.baselines.get(name))
        leading = value * math.log(2 * widest) * math.log(N_SAMPLES) / (MARGIN * math.sqrt(N_SAMPLES))
        assert gaps[name]["gap"] == pytest.approx(leading + confidence(0.0), rel=1e-12), (family, name)
