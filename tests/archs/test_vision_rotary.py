"""The vision towers' 2D rotary heads held by brute force on transformers' own modules (docs/rotary.md section 9).

Each tower of ``support.families.VISION_2D`` runs a forward on one image; a hook on every attention module takes
the hidden states it receives, its rotary tables (``position_embeddings``, Llama 4's ``freqs_ci``) and which tokens
attend to which (Qwen's ``cu_seqlens``: Qwen2.5-VL's windows).  With the module's own projections (biases left
out, as every family's QK) and its own rotary function:

* every logit of every head is ``x_t W_Q^T M(p_t - p_s) W_K x_s^T`` at the tokens' grid positions ``p`` (the
  model's: raster order for Pixtral, the merge-block order and window permutation of transformers' vision
  helpers for Qwen, patches from 1 and the class token at 0 for Llama 4), ``M`` specbound's rotation;
* the offsets ``p_t - p_s`` of the pairs that attend are, where the analysis claims the exact maximum over offsets,
  exactly the layout's, and every QK number of the row is at least the dense product's at each of them, the
  spectral norm equal to their maximum when exact.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hypothesis import strategies as st
from support.drawn_configs import check_drawn
from support.families import FAMILIES, VISION_2D, H, N, _vision_classes, save_family  # noqa: E402

import specbound  # noqa: E402
from specbound.compute.rotary import rotations  # noqa: E402
from specbound.pipeline import open_model  # noqa: E402
from specbound.records.view import format_summary

REL = 1e-9  # float64 numbers of float32 weights
LOGIT_ATOL = 1e-5  # the modules rotate in float32 (their cos and sin, or q and k cast): relative to the largest logit
COLUMNS = ("spectral_norm", "frobenius_norm", "nuclear_norm", "norm_2_1", "norm_1_1", "rank", "stable_rank")


def _capture(model, attention_modules):
    """A forward pre-hook on each attention module, recording its positional and keyword arguments by layer."""
    seen = {}
    handles = [
        m.register_forward_pre_hook(
            lambda mod, args, kwargs, l=l: seen.__setitem__(l, (args, kwargs)), with_kwargs=True
        )
        for l, m in enumerate(attention_modules)
    ]
    return seen, handles


def _bias_free(linear, x):
    return linear(x) - linear(torch.zeros_like(x[:1]))


def _sides(value):
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def _pixtral(model):
    """One image of the largest size image_size allows: raster positions, every pair attends."""
    from transformers.models.pixtral.modeling_pixtral import apply_rotary_pos_emb

    layers = model.transformer.layers
    seen, handles = _capture(model, [b.attention for b in layers])
    (height, width), patch = _sides(model.config.image_size), model.config.patch_size
    model(torch.randn(1, 3, height, width, dtype=torch.float64))
    rows, cols = height // patch, width // patch
    positions = np.stack(np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"), -1).reshape(-1, 2)
    out = []
    for l, b in enumerate(layers):
        args, kwargs = seen[l]
        x = kwargs["hidden_states"][0]
        q, k = (
            _bias_free(getattr(b.attention, f"{w}_proj"), x).view(1, -1, H, N // H).transpose(1, 2) for w in ("q", "k")
        )
        cos, sin = kwargs["position_embeddings"]
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
        out.append((x, q[0].transpose(0, 1), k[0].transpose(0, 1), positions, np.ones((len(x), len(x)), bool)))
    return out, handles


def _qwen(model, grid_h, grid_w, windows=False):
    """One image of ``grid_h x grid_w`` patches through a Qwen vision tower: the positions of transformers'
    ``get_vision_position_ids`` (merge-block order), permuted into windows as the model does for Qwen2.5-VL;
    which pairs attend from each layer's ``cu_seqlens`` (its windows, or the whole image)."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb_vision
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    cfg = model.config
    grid_thw = torch.tensor([[1, grid_h, grid_w]])
    seen, handles = _capture(model, [b.attn for b in model.blocks])
    patch = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    model(torch.randn(grid_h * grid_w, patch, dtype=torch.float64), grid_thw=grid_thw)
    positions = get_vision_position_ids(grid_thw, cfg.spatial_merge_size)
    if windows:
        index, _ = get_vision_window_index(grid_thw, cfg.spatial_merge_size, cfg.window_size, cfg.patch_size)
        positions = model.permute_input_for_window_attn(positions, index, len(positions))
    out = []
    for l, b in enumerate(model.blocks):
        args, kwargs = seen[l]
        x = args[0] if args else kwargs["hidden_states"]
        qkv = _bias_free(b.attn.qkv, x).reshape(len(x), 3, H, -1)
        cos, sin = kwargs["position_embeddings"]
        q, k = apply_rotary_pos_emb_vision(qkv[:, 0], qkv[:, 1], cos, sin)
        cuts = kwargs["cu_seqlens"].tolist()
        segment = np.repeat(np.arange(len(cuts) - 1), np.diff(cuts))
        out.append((x, q, k, positions.numpy(), segment[:, None] == segment[None, :]))
    return out, handles


def _llama4(model):
    """One tile (``G x G`` patches, exactly image_size) and the class token after them: patch ``i`` at
    ``(i // G + 1, i % G + 1)``, the class token at ``(0, 0)``; every pair attends."""
    from transformers.models.llama4.modeling_llama4 import vision_apply_rotary_emb

    layers = model.model.layers
    seen, handles = _capture(model, [b.self_attn for b in layers])
    size = model.config.image_size
    model(torch.randn(1, 3, size, size, dtype=torch.float64))
    grid = size // model.config.patch_size
    i = np.arange(grid * grid)
    positions = np.concatenate([np.stack([i // grid + 1, i % grid + 1], -1), [[0, 0]]])
    out = []
    for l, b in enumerate(layers):
        args, kwargs = seen[l]
        x = (args[0] if args else kwargs["hidden_states"])[0]
        q, k = (_bias_free(getattr(b.self_attn, f"{w}_proj"), x).view(1, len(x), H, -1) for w in ("q", "k"))
        q, k = vision_apply_rotary_emb(q, k, freqs_ci=kwargs["freqs_ci"])
        out.append((x, q[0], k[0], positions, np.ones((len(x), len(x)), bool)))
    return out, handles


def _qwen2_5(model):
    """An image of at least one whole window of each layer's and a part one (the window's side ``S`` patches)."""
    cfg = model.config
    side = cfg.window_size // cfg.spatial_merge_size // cfg.patch_size * cfg.spatial_merge_size
    return _qwen(model, max(8, side), max(8, side) + 4, windows=True)


FORWARDS = {
    "pixtral_vision": _pixtral,
    "llama4_vision": _llama4,
    "qwen2_vl_vision": lambda m: _qwen(m, 6, 8),
    "qwen3_vl_vision": lambda m: _qwen(m, 6, 8),
    "qwen2_5_vl_vision": _qwen2_5,
}


def _dense(stack, rank_tol):
    s = np.linalg.svd(stack, compute_uv=False)
    frob = np.sqrt(np.sum(s**2, axis=1))
    return {
        "spectral_norm": s[:, 0],
        "frobenius_norm": frob,
        "nuclear_norm": s.sum(axis=1),
        "norm_2_1": np.linalg.norm(stack, axis=1).sum(axis=1),
        "norm_1_1": np.abs(stack).sum(axis=(1, 2)),
        "rank": np.count_nonzero(s > rank_tol * stack.shape[1] * np.maximum(s[:, :1], 1.0), axis=1),
        "stable_rank": np.where(s[:, 0] > 0, frob**2 / np.where(s[:, 0] > 0, s[:, 0], 1) ** 2, 0.0),
    }


def _tower(family, model, folder):
    """``(family, model, analysis, opened model, tokens)`` of a saved tower: its analysis and one forward's tokens."""
    model = model.double()
    with torch.no_grad():
        tokens, handles = FORWARDS[family](model)
    for handle in handles:
        handle.remove()
    return family, model, specbound.analyze(folder, threads=1), open_model(folder), tokens


@pytest.fixture(scope="module", params=VISION_2D)
def tower(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    transformers.logging.set_verbosity_error()
    return _tower(request.param, save_family(request.param, folder), folder)


def test_every_logit_of_the_module_is_the_rotated_bilinear_form(tower):
    """``q_rot[t] . k_rot[s]`` of the module equals ``x_t W_Q^T M(p_t - p_s) W_K x_s^T`` for every pair."""
    _check_logits(tower)


def _check_logits(tower):
    family, model, _, opened, tokens = tower
    get = FAMILIES[family][1](model)
    d = N // H
    for layer, (x, q, k, positions, _) in enumerate(tokens):
        w = get(layer)
        offsets = (positions[:, None, :] - positions[None, :, :]).reshape(-1, 2)
        m = rotations(opened.rotary_for(layer), d, offsets).reshape(len(x), len(x), d, d)
        xs = x.numpy()
        for h in range(H):
            a, b = xs @ w["q"][:, h * d : (h + 1) * d], xs @ w["k"][:, h * d : (h + 1) * d]
            dense = np.einsum("ti,tsij,sj->ts", a, m, b)
            module = (q[:, h] @ k[:, h].T).numpy()
            assert np.abs(module - dense).max() <= LOGIT_ATOL * np.abs(dense).max(), (family, layer, h)


def test_every_qk_number_holds_at_every_offset_the_module_uses(tower):
    """Each QK row against ``W_Q^T M(delta) W_K`` at every offset of the pairs that attend: never below, and the
    spectral norm their maximum where the row says exact, whose offsets are exactly the layout's."""
    methods = _check_numbers(tower)
    expected = {
        "pixtral_vision": {"exact"},
        "llama4_vision": {"exact"},
        "qwen2_5_vl_vision": {"exact", "product"},
        "qwen2_vl_vision": {"product"},
        "qwen3_vl_vision": {"product"},
    }[tower[0]]
    assert methods == {f"rotary_{m}_over_offsets" if m == "exact" else f"rotary_{m}_bound" for m in expected}


def _check_numbers(tower):
    """Every QK row's numbers against the dense products at the offsets the module uses; the methods seen."""
    family, model, analysis, opened, tokens = tower
    get = FAMILIES[family][1](model)
    d = N // H
    rows = analysis.matrices[analysis.matrices["role"] == "QK"]
    methods = set()
    for layer, (x, _, _, positions, attends) in enumerate(tokens):
        layout = opened.rotary_for(layer)
        used = np.unique((positions[:, None, :] - positions[None, :, :])[attends], axis=0)
        m = rotations(layout, d, used)
        w = get(layer)
        for row in rows[rows["layer"] == layer].itertuples():
            h = int(row.head)
            stack = np.einsum("ai,tij,bj->tab", w["q"][:, h * d : (h + 1) * d], m, w["k"][:, h * d : (h + 1) * d])
            truth = _dense(stack, analysis.options["rank_tol"])
            for column in COLUMNS:
                assert getattr(row, column) >= truth[column].max() * (1 - REL), (family, layer, h, column)
            methods.add(row.sv_method)
            if row.sv_method == "rotary_exact_over_offsets":
                assert {tuple(o) for o in layout.offsets} == {tuple(o) for o in used}, (family, layer)
                assert row.spectral_norm == pytest.approx(truth["spectral_norm"].max(), rel=REL), (family, layer, h)
    return methods


def test_the_grid_is_recorded_and_named_among_the_assumptions(tower):
    """The JSON's ``model.rotary.grid`` (each layer's in ``by_layer``) and the ``rotary_grid`` assumption say which
    grid the numbers cover."""
    family, _, analysis, opened, tokens = tower
    grid = analysis.model["rotary"]["grid"]  # the first layer's: Qwen2.5-VL's a window's
    bounded = family in ("pixtral_vision", "llama4_vision")
    side = 4 if bounded or family == "qwen2_5_vl_vision" else None
    assert grid == {"rows": side, "columns": side, "class_token": family == "llama4_vision"}
    (entry,) = [a for a in analysis.assumptions if a["name"] == "rotary_grid"]
    assert ("every rotation" in entry["effect"]) == (not bounded) and "section 9" in entry["effect"]
    projector = [a["effect"] for a in analysis.assumptions if a["name"] == "projector_outside"]
    named = {
        "pixtral_vision": None,
        "llama4_vision": "pixel-shuffle adapter",
        "qwen3_vl_vision": "deepstack mergers",
        "qwen2_vl_vision": "patch merger",
        "qwen2_5_vl_vision": "patch merger",
    }[family]
    assert (named in projector[0]) if named else not projector  # Pixtral's tower holds no projector
    if family == "qwen2_5_vl_vision":
        assert [layer["grid"]["rows"] for layer in analysis.model["rotary"]["by_layer"]] == [4, None]
        assert "windows of 4 x 4 patches" in entry["effect"]


def _drawn_config(family, draw_from):
    """Config keywords of a tower of width 32 and 4 heads (the accessors' ``N``, ``H``) drawn for ``family``."""
    st = draw_from
    theta = st.sampled_from([10.0, 100.0, 10000.0])
    axial = theta.map(lambda t: {"rope_parameters": {"rope_theta": t, "rope_type": "axial"}})
    if family == "pixtral_vision":
        sides = st.sampled_from([16, 32, 48, 80])
        return st.fixed_dictionaries(
            {
                "image_size": st.one_of(sides, st.lists(sides, min_size=2, max_size=2)),
                "num_hidden_layers": st.integers(1, 2),
            }
        ).flatmap(
            lambda c: axial.map(
                lambda r: {
                    **c,
                    **r,
                    "hidden_size": N,
                    "intermediate_size": 48,
                    "num_attention_heads": H,
                    "patch_size": 16,
                }
            )
        )
    if family == "llama4_vision":
        return st.fixed_dictionaries(
            {
                "image_size": st.sampled_from([28, 56]),
                "num_hidden_layers": st.integers(1, 2),
                "rope_parameters": theta.map(lambda t: {"rope_theta": t}),
            }
        ).map(
            lambda c: {
                **c,
                "hidden_size": N,
                "intermediate_size": 4 * N,
                "num_attention_heads": H,
                "patch_size": 14,
                "vision_output_dim": 24,
                "projector_input_dim": 16,
                "projector_output_dim": 16,
            }
        )
    width = (
        {"embed_dim": N, "hidden_size": 24, "mlp_ratio": 2}
        if family == "qwen2_vl_vision"
        else {"hidden_size": N, "out_hidden_size": 24, "intermediate_size": 48}
    )
    extra = {"deepstack_visual_indexes": [0], "num_position_embeddings": 16} if family == "qwen3_vl_vision" else {}
    depth = st.integers(1, 3)
    if family == "qwen2_5_vl_vision":
        windows = depth.flatmap(
            lambda d: st.fixed_dictionaries(
                {
                    "depth": st.just(d),
                    "window_size": st.sampled_from([28, 56, 84, 112]),
                    "fullatt_block_indexes": st.lists(st.integers(0, d - 1), unique=True, max_size=d),
                }
            )
        )
        return windows.flatmap(
            lambda c: axial.map(
                lambda r: {**c, **r, **width, "num_heads": H, "patch_size": 14, "spatial_merge_size": 2}
            )
        )
    return depth.flatmap(lambda d: axial.map(lambda r: {**r, **width, **extra, "depth": d, "num_heads": H}))


CONFIG_CLASSES = {
    "pixtral_vision": "PixtralVisionConfig",
    "llama4_vision": "Llama4VisionConfig",
    "qwen2_vl_vision": "Qwen2VLVisionConfig",
    "qwen2_5_vl_vision": "Qwen2_5_VLVisionConfig",
    "qwen3_vl_vision": "Qwen3VLVisionConfig",
}


@pytest.mark.parametrize("family", VISION_2D)
def test_drawn_towers_hold_by_brute_force(family, tmp_path_factory):
    """Configurations drawn by hypothesis (grids square and not, 1 to 5 patches a side, Llama 4's 2 x 2 and 4 x 4
    tiles, Qwen2.5-VL's windows of 2 to 8 patches and any set of full-attention layers, bases 10 to 10^4): every
    logit the rotated bilinear form, every QK number at least the dense one at every offset used, exact rows equal
    to the maximum over exactly those offsets."""

    def check(config):
        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        cfg = getattr(transformers, CONFIG_CLASSES[family])(**config)
        model = (
            transformers.PixtralVisionModel
            if family == "pixtral_vision"
            else _vision_classes()[family.removesuffix("_vision")]
        )(cfg)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.2)
        folder = tmp_path_factory.mktemp(family)
        model.save_pretrained(folder)
        tower = _tower(family, model, folder)
        _check_logits(tower)
        methods = _check_numbers(tower)
        bounded = family in ("pixtral_vision", "llama4_vision")
        if family == "qwen2_5_vl_vision":  # a layer of window attention gets its window's exact maximum
            bounded = any(l not in config["fullatt_block_indexes"] for l in range(config["depth"]))
        assert ("rotary_exact_over_offsets" in methods) == bounded, (family, config, methods)

    check_drawn(_drawn_config(family, st), check, examples=3)


def test_the_summary_names_the_grid(tower):
    family, _, analysis, _, _ = tower
    line = next(l for l in format_summary(analysis).splitlines() if "2D rotary over the patch grid" in l)
    expected = {
        "pixtral_vision": "of 4 x 4 patches (",
        "llama4_vision": "of 4 x 4 patches and a class token (",
        "qwen2_5_vl_vision": "of 4 x 4 patches or an unbounded grid (the bounds for every rotation) (",
        "qwen2_vl_vision": "of an unbounded grid (the bounds for every rotation) (",
        "qwen3_vl_vision": "of an unbounded grid (the bounds for every rotation) (",
    }[family]
    assert expected in line and "docs/rotary.md 9" in line
