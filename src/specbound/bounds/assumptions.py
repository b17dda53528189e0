"""Where an analysed model departs from the model the theorem is proven for, said in every output.

Sakai & Imaizumi's Theorem 3.1 is proven for a network without residual connections, with
normalisation acting as a projection onto the unit ball, unit-norm inputs to every matrix, fixed
embeddings and head, and (for its gap form) i.i.d. samples.  Real checkpoints break some of that, and the extensions to
gated, parallel, grouped-query, shared-weight and rotary models are this project's derivations.  Each
entry says whether it applies to this analysis and what it does to the numbers, so a reader can tell
which numbers are theorems and which are proxies under named assumptions (docs/theory.md, section 6).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..archs.model import UNBOUNDED_POSITIONS, ModelDims, RotaryLayout
from ..archs.structure import Structure
from ..compute.propagation import clamped_swiglu_constants
from ..io.base import WEIGHTS_NOTE


def _entry(name: str, applies: bool, effect: str, kind: str) -> dict[str, Any]:
    return {"name": name, "applies": bool(applies), "kind": kind, "effect": effect}


def layer_form(dims: ModelDims, *, rotary: bool = False) -> str:
    """The ``Lambda`` this family's layers get (docs/spec.md section 3, docs/theory.md 3b), as text."""
    qk = "c*(QK_h)" if rotary else "c(QK_h)"
    attention = f"sum_h c(OV_h)(1 + {2 * (2 + dims.position_terms)} {qk})"
    ff = "(L_phi + c_phi) c(FF_gate) c(FF_up) c(FF_out)" if dims.feed_forward == "gated" else "L_phi c(FF_in) c(FF_out)"
    if dims.feed_forward == "gated" and dims.up_offset:  # gpt-oss's (clamp(u) + 1) * phi(g) (docs/theory.md 3n)
        ff = f"({ff} + {dims.up_offset:g} L_phi c(FF_gate) c(FF_out))"
    if dims.stacks is not None and any(part.cross for part in dims.stacks):  # docs/theory.md 3i
        return (
            f"Lambda = {ff} {attention}, a decoder layer's also times its cross-attention's "
            f"2 sum_h c(OV_cross,h) c(QK_cross,h)"
        )
    return f"Lambda = {attention} + {ff}" if dims.block == "parallel" else f"Lambda = {ff} {attention}"


def _activation_effect(l_phi: float | None, source: str | None, gated: bool) -> str:
    constant = "L_phi" + (" (and c_phi = 1, |phi(t)| <= |t|)" if gated else "")
    if source == "user":
        return f"{constant}: L_phi = {l_phi:g} as given (--l-phi); specbound does not check it against the activation"
    if source is not None and source.startswith("default"):
        return (
            f"{constant}: config.json names no activation; L_phi = {l_phi:g}, GELU's, is assumed (pass --l-phi "
            f"if the model's activation is another)"
        )
    return (
        f"{constant}: L_phi = {l_phi:g} for {source} (its sup |phi'| rounded up: the table of compute/propagation.py)"
    )


@dataclass(frozen=True)
class AssumptionContext:
    """What the assumptions of one analysis depend on, built once by ``pipeline.assemble`` and passed whole.

    ``rotary``: whether the family rotates its queries and keys; ``gap``: whether a generalisation-gap bound is
    asked for; ``notes``: name -> sentence for what the checkpoint's reader (or its opener) assumed where the file
    leaves it unstated, and under ``quantized_weights`` that the weights read are not the stored values as trained
    (:class:`~specbound.io.base.ReaderFacts`); ``l_phi``, ``l_phi_source``: the activation constant used and where
    it came from; ``rotary_methods``: how many rotary QK heads got the exact maximum over offsets and how many the
    product bound; ``rope``: the model's distinct rotary layouts; ``qk_norm``: its query/key normalisation
    (``span``, ``eps``, ``gain`` and the largest Lipschitz factor ``max_factor`` with its ``layer`` and ``head``);
    ``structure``: what the family does beyond its matrices (:mod:`.archs.structure`); ``tower``: the tower of a
    two-tower model this analysis is (``wrapper``: the vision-language wrapper's spec when that model is one, its
    projector named); ``nope_layers``: the layers without rotary positions of a model whose other layers rotate;
    ``modules``: a sentence-transformers folder's modules after the Transformer (``model.modules``).
    """

    dims: ModelDims
    rotary: bool = False
    gap: bool = False
    notes: Mapping[str, str] = field(default_factory=dict)
    l_phi: float | None = None
    l_phi_source: str | None = None
    rotary_methods: Mapping[str, int] | None = None
    rope: tuple[RotaryLayout, ...] = ()
    qk_norm: Mapping[str, Any] | None = None
    structure: Structure | None = None
    tower: str | None = None
    nope_layers: tuple[int, ...] = ()
    modules: list[dict[str, Any]] | None = None
    wrapper: Any = None

    @property
    def gated(self) -> bool:
        return self.dims.feed_forward == "gated"


@dataclass(frozen=True)
class Assumption:
    """One declared assumption: its ``name`` and ``kind``, when it ``applies`` and its ``effect`` (what it does to
    the numbers), each a function of the :class:`AssumptionContext`; ``listed``: whether it is listed when it does
    not apply (the theorem's own assumptions and the extensions a model may use are; a model's particulars only
    when they apply)."""

    name: str
    kind: str
    applies: Callable[[AssumptionContext], Any]
    effect: Callable[[AssumptionContext], str]
    listed: bool = True

    def entries(self, ctx: AssumptionContext) -> list[dict[str, Any]]:
        applies = self.applies(ctx)
        return [_entry(self.name, applies, self.effect(ctx), self.kind)] if applies or self.listed else []


@dataclass(frozen=True)
class Assumptions:
    """Entries of a variable number, or whose name depends on the model (the structure's, the rotary layouts',
    the reader's notes), from one function of the context; ``names``: the names its entries may have (none declared
    for the reader's notes, which the readers name)."""

    names: tuple[str, ...]
    entries: Callable[[AssumptionContext], list[dict[str, Any]]]


def _always(ctx: AssumptionContext) -> bool:
    return True


def _text(text: str) -> Callable[[AssumptionContext], str]:
    return lambda ctx: text


def _layer_form_effect(ctx: AssumptionContext) -> str:
    dims = ctx.dims
    return (
        f"{layer_form(dims, rotary=ctx.rotary)} and the sensitivities gamma*: the multi-head form of the paper's "
        f"BERT experiment"
        + (
            ", with this family's blocks as derived in docs/theory.md 3b"
            if ctx.gated or dims.block == "parallel"
            else ""
        )
        + "; L_phi enters Lambda but not gamma* (the reference code's convention)"
    )


def _activation_constant_effect(ctx: AssumptionContext) -> str:
    if ctx.l_phi is None:
        return "L_phi from the activation table of compute/propagation.py or --l-phi"
    return _activation_effect(ctx.l_phi, ctx.l_phi_source, ctx.gated)


def _rotary_effect(ctx: AssumptionContext) -> str:
    if ctx.qk_norm:
        return (
            "the queries and keys are normalised before the rotation: each QK row is its head's stacked factors "
            "[W_Q^h; W_K^g], on which no rotation acts, and its sensitivity and Lipschitz factor kappa hold "
            "for every rotation (docs/theory.md 3d), so every number is valid at every relative position; "
            "no rotation-blind variant is computed"
        )
    methods = ctx.rotary_methods or {}
    return (
        "every QK number bounds its value at every relative position (docs/rotary.md): c*(QK) is the exact "
        f"maximum over offsets for {methods.get('exact_over_offsets', 0)} heads and the product "
        f"||W_Q|| ||W_K|| for {methods.get('product_bound', 0)} (columns sv_method, argmax_offset); S_p "
        "and the rank come from the Horn envelope (singular_values rows of kind horn_envelope, not "
        "singular values); the theorem's covering argument is not proven for rotary heads, so these "
        "bounds are proxies; the *_rotation_blind variants ignore the rotation"
    )


def _latent_effect(ctx: AssumptionContext) -> str:
    lat = ctx.dims.latent
    scales = ""
    if lat.logit_scale != 1.0 or lat.rope_factor != 1.0:
        scales = (
            f"; YaRN's mscale^2 = {lat.logit_scale:.6g} multiplies every logit and the rope scaling's "
            f"attention factor a = {lat.rope_factor:.6g} its rotary part by a^2, both in the factors"
        )
    query = (
        f"queries through q_a_proj, an RMSNorm of its {lat.q_rank} features and q_b_proj"
        if lat.q_rank is not None
        else "queries through q_proj"
    )
    return (
        f"multi-head latent attention: {query}; keys and values through the shared latent kv_a_proj_with_mqa, "
        f"an RMSNorm of its {lat.kv_rank} features (eps = {lat.kv_eps:g}) and kv_b_proj, {lat.d_rope} rotary key "
        f"features shared by every head. The logit and the values are not bilinear forms of one matrix, so each "
        f"head is covered through its raw factors: its QK row is the block-diagonal diag(W_qa, [W_kv; A], X_h = "
        f"B_n^T C_n, B_r) and its OV row diag(W_kv, Y_h = C_v^T O_h) (the shared latent projections counted in "
        f"every head's rows), every norm, S_p and rank those of the block-diagonal matrix; the QK row's "
        f"lipschitz_factor is the logit's Lipschitz constant kappa_h and the OV row's the value path's L_k "
        f"||Y_h||, both finite because eps > 0, and the head's term of Lambda is L_k ||Y_h|| + 4 kappa_h R_k "
        f"||Y_h||; every number holds for every rotation of the shared rotary key, so at every relative "
        f"position{scales} (our derivation, docs/theory.md 3l)"
    )


def _has_experts(ctx: AssumptionContext) -> bool:
    return ctx.dims.moe is not None and ctx.dims.moe.layers != ()  # () : every layer dense (Llama 4, no experts)


def _moe_effect(ctx: AssumptionContext) -> str:
    moe = ctx.dims.moe
    shared = (
        " plus the shared expert's (its sigmoid gate <= 1)"
        if moe.shared_gate
        else " plus the shared expert's"
        if moe.shared_d_ff
        else ""
    )
    where = (
        ""
        if moe.layers is None
        else (f" in layers {_ranges(list(moe.layers))} (the other layers a dense block of width {moe.dense_d_ff})")
    )
    gates = (
        "the top-k gates are non-negative and sum to at most 1"
        if moe.gate_sum == 1
        else f"each chosen expert's gate is a sigmoid in (0, 1) and they multiply its input (x -> F_e(g_e x) has "
        f"constant g_e Lip(F_e)), so the routed part's factor is at most {moe.gate_sum} (top_k) times it"
    )
    if moe.gate_max != 1:  # DeepSeek, GLM: the chosen scores (renormalised or not) times routed_scaling_factor
        gates = (
            f"the top-k gates ({moe.scoring} scores times routed_scaling_factor) are non-negative, each at "
            f"most {moe.gate_max:g} and summing to at most {moe.gate_sum:g}: the routed part's factor is "
            f"{moe.gate_sum:g} times the largest expert's and each routed expert's sensitivities are "
            f"multiplied by {moe.gate_max:g}"
        )
    return (
        f"{moe.experts} routed experts (top-{moe.top_k}){' and a shared expert' if moe.shared_d_ff else ''}"
        f"{where}: every expert's matrices are terms of each bound (roles FF_*[eN], FF_*[shared]) with the "
        f"sensitivities of a dense block; the feed-forward Lipschitz factor is the largest routed "
        f"expert's{shared}, since {gates} (our derivation, docs/theory.md 3f)"
    )


def _note_entries(ctx: AssumptionContext) -> list[dict[str, Any]]:
    """The reader's notes, each a convention: the weights' own note first (what every number is of), then the
    others by name."""
    order = sorted(ctx.notes, key=lambda name: (name != WEIGHTS_NOTE, name))
    return [_entry(name, True, ctx.notes[name], "convention") for name in order]


def _ranges(layers: list[int]) -> str:
    """``[3, 7, 11]`` -> ``"3, 7, 11"``; a long list shortened to its first and last few."""
    return (
        ", ".join(map(str, layers))
        if len(layers) <= 8
        else ", ".join(map(str, layers[:4])) + f", ... ({len(layers)} layers), " + ", ".join(map(str, layers[-2:]))
    )


def _rope_entries(layouts: list[RotaryLayout]) -> list[dict[str, Any]]:
    """``mrope_positions`` (several position axes: which offsets count) and ``rope_scaling`` (which scaling,
    and the attention factor folded into every QK quantity)."""
    return _mrope_entries(layouts) + _scaling_entries(layouts)


def _mrope_entries(layouts: list[RotaryLayout]) -> list[dict[str, Any]]:
    multi = [r for r in layouts if r.axes is not None and r.shared_shift]  # a vision grid: _grid_entries
    if not multi:
        return []
    r = multi[0]
    within = (
        "every offset vector (no context length stated)"
        if r.max_positions == UNBOUNDED_POSITIONS
        else f"the offset vectors of components at most {r.max_positions - 1} in absolute value"
    )
    grid = "P per axis" if r.grid is None else "(" + ", ".join(str(g) for g in r.grid) + ")"
    return [
        _entry(
            "mrope_positions",
            True,
            f"M-RoPE: each rotary pair turns by one component of a (time, height, width) position vector "
            f"(axes {list(r.axes)}); the QK maxima run over {within} that text tokens (p, p, p) and image "
            f"blocks up to the largest grid ({grid}: config.json sets no pixel limit and an image's tokens "
            f"must fit the context) produce, text-text offsets (d, d, d) included: a superset of a real "
            f"sequence's offsets (docs/rotary.md section 7)",
            "convention",
        )
    ]


def _scaling_entries(layouts: list[RotaryLayout]) -> list[dict[str, Any]]:
    scaled = [r for r in layouts if r.scaling is not None]
    if not scaled:
        return []
    parts = []
    for r in scaled:
        text = f"{r.scaling}"
        if r.attention_factor != 1.0:
            text += (
                f" with attention factor a = {r.attention_factor:.6g} (cos and sin are multiplied by a, so "
                f"every QK quantity is that of a^2 W_Q^T M W_K, a^2 = {r.attention_factor**2:.6g})"
            )
        if r.scaling == "longrope":
            text += (
                "; its short and long factor sets (and a cache that mixes them) are covered by the bounds "
                "valid for every rotation"
            )
        if r.scaling == "dynamic":
            text += "; within max_position_embeddings the NTK frequencies are the default ones"
        parts.append(text)
    return [
        _entry(
            "rope_scaling",
            True,
            "rope scaling " + "; ".join(parts) + ": frequencies and attention factor as transformers' "
            "modeling_rope_utils computes them (docs/rotary.md section 5)",
            "convention",
        )
    ]


def _grid_entries(layouts: list[RotaryLayout]) -> list[dict[str, Any]]:
    """``rotary_grid``: a vision tower's 2D rotary positions, the grid whose offsets every QK number covers (a
    model with several grids: Qwen2.5-VL's window layers, the bounded ones, and its full-attention layers)."""
    grids = [r for r in layouts if r.axes is not None and not r.shared_shift]
    if not grids:
        return []
    parts = []
    for r in grids:
        rows, cols = r.grid
        if rows == UNBOUNDED_POSITIONS:
            parts.append(
                "the config bounds no grid (the model takes any; only the processor's max_pixels, outside "
                "config.json, limits an image), so these heads get the bounds valid for every rotation"
            )
        elif len(grids) > 1:
            parts.append(
                f"a layer of window attention attends within windows of {rows} x {cols} patches: the "
                f"offsets of that grid, exactly those it uses"
            )
        elif r.grid_origin:
            parts.append(
                f"every tile is {rows} x {cols} patches (image_size // patch_size) and a class token at "
                f"angle 0: exactly the offsets the model uses"
            )
        else:
            parts.append(
                f"at most {rows} x {cols} patches (image_size // patch_size: the processor's limit on an "
                f"image, not the model's, which takes any grid)"
            )
    return [
        _entry(
            "rotary_grid",
            True,
            "2D rotary positions over the patch grid: each rotated pair turns with the patch's row or its "
            "column, so the logit of two patches is x_t W_Q^T M(dy, dx) W_K x_s^T and every QK number holds at "
            "every offset (dy, dx) of the largest grid the config allows; "
            + "; ".join(parts)
            + " (docs/rotary.md section 9)",
            "convention",
        )
    ]


def _modules_effect(modules: list[dict[str, Any]]) -> str:
    """sentence-transformers' modules after the Transformer (modules.json): held fixed outside the chain, each named,
    a Dense layer with what it would add to a Lipschitz statement about the sentence embedding."""
    said = []
    for m in modules:
        if m["type"] == "Dense":
            lip = "" if m["activation_lipschitz"] is None else f", sup |phi'| = {m['activation_lipschitz']:g}"
            said.append(
                f"{m['path']} (Dense {m['in_features']} -> {m['out_features']}, {m['activation']}{lip}, "
                f"||W||_2 = {m['spectral_norm']:.6g})"
            )
        elif m["type"] == "Pooling":
            said.append(f"{m['path']} (Pooling: {', '.join(m['modes']) or 'no mode on'})")
        else:
            said.append(f"{m['path'] or '.'} ({m['type']})")
    dense = any(m["type"] == "Dense" for m in modules)
    return (
        f"modules.json puts after the analysed Transformer {', '.join(said)}: like the head "
        f"(fixed_embeddings_and_head) they are held fixed and are not in the complexity, so the bounds are "
        f"those of the Transformer's token outputs, not of the sentence embedding"
        + (
            "; a Dense layer is x -> phi(x W + b): a Lipschitz statement about the embedding would multiply "
            "the chain's constant by sup |phi'| ||W||_2 per Dense layer (pooling by mean or CLS is "
            "1-Lipschitz in the largest token row's norm; Normalize is not Lipschitz near 0), and a bound "
            "with the Dense matrices in the complexity would add a term for each; model.modules reports "
            "their norms"
            if dense
            else ""
        )
    )


def _qk_norm_entries(qk_norm: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not qk_norm:
        return []
    where = "each head's" if qk_norm["span"] == "head" else "the whole projection's"
    gain = {"one_plus_weight": "1 + w", "none": "1: a weightless L2 norm, x / sqrt(mean(x^2) + eps)"}.get(
        qk_norm["gain"], "w"
    )
    only = (
        " on the layers that rotate (the others' QK rows are plain bilinear matrices)"
        if qk_norm.get("layers") == "rotary"
        else ""
    )
    return [
        _entry(
            "qk_norm",
            True,
            f"RMSNorm over {where} queries and keys{only} (gain {gain}, eps = {qk_norm['eps']:g}) before the "
            f"rotation, so the logit is a function of the head's raw factors, not of one bilinear matrix: "
            f"each QK row is the stacked [W_Q^h; W_K^g] (norms, S_p and rank its own), covered with "
            f"sensitivity a^2 (||g_q||_inf R_k + R_q ||g_k||_inf) / sqrt(eps) per unit spectral change "
            f"(every head's, summed, for a norm over the whole projection), and its lipschitz_factor, read "
            f"by Lambda and the sensitivities, is the logit's Lipschitz constant kappa = a^2 max(L_q R_k, "
            f"R_q L_k), L = ||g||_inf ||W||_2 / sqrt(eps), finite because eps > 0 (largest "
            f"{qk_norm['max_factor']:.6g}, layer {qk_norm['layer']} head {qk_norm['head']}; our derivation, "
            f"docs/theory.md 3d)",
            "extension",
        )
    ]


# The structure entries that say one fixed text, in the order they are listed: (Structure field, the value
# that turns the entry on (None: any value but None), entry name, kind, text); ``{value}`` in the text is
# the field's value, ``{query_key}`` what a query/key norm (qk_norm) adds to the text (Gemma 3's gains).
_STRUCTURE_TEXTS = (
    (
        "attention_softcap",
        None,
        "logit_soft_capping",
        "extension",
        "attention logits are capped, cap tanh(l / cap) with cap = {value:g}: t -> cap tanh(t / cap) is 1-Lipschitz, "
        "so every Lipschitz factor of l holds for the capped logit; the bounds are not tightened by the cap",
    ),
    (
        "final_softcap",
        None,
        "final_logit_soft_capping",
        "convention",
        "the head's output logits are capped (cap = {value:g}), a 1-Lipschitz map after the fixed head: outside the "
        "analysed matrices, no factor changes",
    ),
    (
        "sliding_window",
        None,
        "sliding_window_attention",
        "convention",
        "some layers attend within a window of {value} tokens only: their offsets are a subset of all offsets, so the "
        "QK quantities (over every offset up to the context) are upper bounds for them; no weight matrix changes",
    ),
    (
        "attention_scalar",
        None,
        "attention_temperature",
        "convention",
        "logits are scaled by query_pre_attn_scalar^(-1/2) = {value:g}^(-1/2); like 1/sqrt(d_head) in every family, "
        "the temperature is left out of the QK matrices",
    ),
    (
        "embedding_scale",
        None,
        "embedding_scaling",
        "convention",
        "the embeddings are multiplied by sqrt(hidden_size): outside the complexity (fixed_embeddings_and_head) and "
        "without effect on any factor under normalisation_as_projection (every block normalises its input)",
    ),
    (
        "norm_gain",
        "one_plus_weight",
        "one_plus_weight_norms",
        "convention",
        "RMSNorm multiplies by (1 + w): the block norms' gains are ignored like every normalisation gain "
        "(normalisation_as_projection){query_key}",
    ),
    (
        "position_bias",
        "relative",
        "relative_position_bias",
        "convention",
        "a learned relative position bias is added to the attention logits (MPNet, T5): it does not depend on the "
        "input, so the logit differences the softmax argument uses, and with them every Lipschitz factor and "
        "sensitivity, are unchanged; the bias table is outside the complexity like every bias (docs/theory.md 3h)",
    ),
    (
        "key_selection",
        "indexer",
        "sparse_attention_fixed",
        "extension",
        "a top-k indexer chooses the keys each query attends to (DeepSeek-V3.2): the choice is held fixed, as the "
        "experts' routing is; the softmax over any subset of the keys is a probability vector, so every head's factors "
        "hold unchanged, and the indexer's weights (wq_b, wk, k_norm, weights_proj) only choose the subset, never "
        "enter "
        "a logit's value or an output: they are not matrices of the chain (docs/theory.md 3l)",
    ),
    (
        "layer_scale",
        "folded",
        "layer_scale_folded",
        "convention",
        "the LayerScale vectors lambda are folded exactly into the OV and FF_out matrices (W diag(lambda)): the bounds "
        "see the scaled matrices, and lambda is not counted as a parameter of its own",
    ),
    (
        "projector",
        "patch_merger",
        "projector_outside",
        "theorem",
        "the patch merger (merger.*: a norm, then a two-matrix MLP over 2 x 2 neighbouring patches into the text "
        "model's width) maps the tower's output to the text model's input, like a head: fixed, outside the tower's "
        "complexity, which is its chain's from the patch rows to the last layer (docs/rotary.md section 9)",
    ),
    (
        "projector",
        "deepstack",
        "projector_outside",
        "theorem",
        "the patch merger and the deepstack mergers (merger.*, deepstack_merger_list.*: a norm and a two-matrix MLP "
        "each, the deepstack ones reading the hidden states after the deepstack_visual_indexes layers and adding them "
        "to the text model's first layers) map the tower's outputs to the text model, like heads: fixed, outside the "
        "tower's complexity, which is its chain's from the patch rows to the last layer; a tap reads an intermediate "
        "output of that chain and adds no matrix to it (docs/rotary.md section 9)",
    ),
    (
        "projector",
        "pixel_shuffle",
        "projector_outside",
        "theorem",
        "the pixel-shuffle adapter (vision_adapter.*: 2 x 2 neighbouring patches regrouped into channels, then a "
        "two-matrix GELU MLP) maps the tower's output to the multimodal projector, like a head: fixed, outside the "
        "tower's complexity, which is its chain's from the patch rows to the last layer (docs/rotary.md section 9)",
    ),
    (
        "front_end",
        "convolutional",
        "front_end_as_embedding",
        "theorem",
        "the convolutional front-end (wav2vec2/HuBERT's feature extractor, projection and convolutional position "
        "embedding; Whisper's two convolutions) is the embedding, like a tokenizer: fixed, outside the complexity, the "
        "encoder's input rows are its output",
    ),
    (
        "residual_multiplier",
        None,
        "residual_multiplier_folded",
        "convention",
        "each sublayer's output is multiplied by residual_multiplier = {value:g} before the residual sum: folded "
        "exactly into every OV and FF_out matrix (r W), so Lambda, the sensitivities and every norm are those of the "
        "scaled matrices (docs/theory.md 3e)",
    ),
    (
        "attention_multiplier",
        None,
        "attention_multiplier_folded",
        "convention",
        "the logit is attention_multiplier q k^T with m = {value:g} instead of q k^T / sqrt(d_head): every family's QK "
        "leaves 1/sqrt(d_head) out, so m sqrt(d_head) is folded exactly into the query factors (docs/theory.md 3e)",
    ),
    (
        "embedding_multiplier",
        None,
        "embedding_multiplier",
        "convention",
        "the embeddings are multiplied by embedding_multiplier = {value:g}: outside the complexity "
        "(fixed_embeddings_and_head) and without effect on any factor under normalisation_as_projection",
    ),
    (
        "logit_divisor",
        None,
        "head_logit_scale",
        "convention",
        "the head's output logits are divided by logits_scaling = {value:g}: after the fixed head, outside the "
        "analysed matrices, no factor changes",
    ),
    (
        "logit_scale",
        None,
        "head_logit_scale",
        "convention",
        "the head's output logits are multiplied by logit_scale = {value:g}: after the fixed head, outside the "
        "analysed matrices, no factor changes",
    ),
    (
        "attention_chunk",
        None,
        "chunked_attention",
        "convention",
        "the rotating layers attend within chunks of {value:g} tokens: a mask, like a sliding window, whose offsets "
        "are "
        "a subset of every offset the QK quantities are taken over (the chunk a token falls in is fixed by positions, "
        "not by the input); no matrix changes (docs/theory.md 3n)",
    ),
    (
        "temperature",
        None,
        "attention_temperature_tuning",
        "extension",
        "the layers without rotary positions multiply their queries by tau(t) = 1 + attn_scale log(1 + floor((t + 1) / "
        "floor_scale)), a factor of the logit at position t: its largest size up to max_position_embeddings, "
        "{value:.6g}, is folded into their query factors, so every QK quantity bounds the logit's at every position "
        "(docs/theory.md 3n)",
    ),
    (
        "attention_sinks",
        None,
        "attention_sinks",
        "extension",
        "each head's softmax has a learned sink logit in its denominator and no value: the sink is an extra key whose "
        "logit does not depend on the input and whose value is 0, so the softmax step (||p - p'||_1 <= 2 max |l - l'| "
        "over the logits, the sink's difference 0) and the value step (weights summing to 1 - p_sink <= 1) of the "
        "head's bound hold unchanged: c(OV)(1 + 4 c(QK)) bounds a head with a sink, which never increases it; the sink "
        "logits are outside the complexity (our derivation, docs/theory.md 3n)",
    ),
)


# The names _structure_entries may give, in order: the fixed texts' and the two computed ones.
_STRUCTURE_NAMES = (*dict.fromkeys(row[2] for row in _STRUCTURE_TEXTS), "clamped_swiglu", "norm_after_sublayer")


def _structure_entries(st: Structure | None, qk_norm: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    if st is None:
        return []
    # Gemma 3's query/key norms, whose gains are 1 + w too (docs/theory.md 3d)
    query_key = (
        "; the query/key norms' 1 + w are folded into no matrix either: each QK row is the head's stacked "
        "raw factors [W_Q^h; W_K^g] (its norms, S_p and rank theirs), and those gains enter only its "
        "lipschitz_factor kappa and its sensitivity, through ||1 + w||_inf (qk_norm; docs/theory.md 3d)"
        if qk_norm
        else ""
    )
    out = []
    for attribute, on, name, kind, text in _STRUCTURE_TEXTS:
        value = getattr(st, attribute)
        if (value is not None) if on is None else value == on:
            out.append(_entry(name, True, text.format(value=value, query_key=query_key), kind))
    if st.swiglu_limit is not None:
        limit, alpha = st.swiglu_limit, st.swiglu_alpha or 1.702
        l_phi, c_phi = clamped_swiglu_constants(limit, alpha)
        out.append(
            _entry(
                "clamped_swiglu",
                True,
                f"the experts compute (clamp(u, -{limit:g}, {limit:g}) + 1) * phi(g), phi(t) = m sigmoid("
                f"{alpha:g} m), m = min(t, {limit:g}): sup |phi'| = {l_phi:.6g} and |phi(t)| <= "
                f"{c_phi:.6g} |t| (the clamps only lower SiLU's constants; the up clamp is 1-Lipschitz with "
                f"|clamp(u)| <= |u|), so (clamp(u) * phi(g)) W_d is within the gated block's (L_phi + "
                f"c_phi) c_g c_u c_d with the table's L_phi = 1.0999 and c_phi = 1; the + 1 is no bias but "
                f"a second path phi(g) W_d, of constant L_phi c_g c_d, which each expert's factor adds "
                f"(and the gate's sensitivity, (c_u + 1) c_d; docs/theory.md 3n)",
                "extension",
            )
        )
    if st.sublayer_norms != "before":
        out.append(
            _entry(
                "norm_after_sublayer",
                True,
                "each sublayer's output is normalised before the residual sum: under "
                "normalisation_as_projection that norm is 1-Lipschitz and its gain ignored, so Lambda is "
                "the one of the un-normalised sublayers (an upper bound)",
                "convention",
            )
        )
    return out


def _chain_shape_entries(dims: ModelDims, tower: str | None, wrapper: Any = None) -> list[dict[str, Any]]:
    """Disentangled attention (DeBERTa), an encoder-decoder's two stacks, a two-tower model's tower, one tower
    of a vision-language wrapper (``wrapper``: its spec, whose ``projector`` is named)."""
    out = []
    if dims.position_terms:
        n = dims.position_terms
        out.append(
            _entry(
                "disentangled_attention",
                True,
                f"DeBERTa's {n} position term(s) (content-to-position, position-to-content) reuse each head's QK "
                "matrix "
                f"on the relative position embeddings, of norm at most 1 under normalisation_as_projection: Lambda has "
                f"c(OV)(1 + {2 * (2 + n)} c(QK)) per head and gamma*_QK = {2 * (1 + n)} c(OV) times the feed-forward "
                f"factor (our derivation, docs/theory.md 3h); the position embeddings are outside the complexity",
                "extension",
            )
        )
    if dims.stacks is not None and any(part.cross for part in dims.stacks):
        out.append(
            _entry(
                "encoder_decoder_chain",
                True,
                "an encoder-decoder is read as two chains joined by cross-attention: a decoder layer's Lambda "
                "multiplies "
                "its self-attention, its cross-attention in the decoder's stream (2 sum_h c(OV) c(QK)) and its "
                "feed-forward; the encoder's output reaches the decoder's output through every cross-attention (keys "
                "and values: M_j = sum_h c(OV)(1 + 2 c(QK)) times the feed-forward), so an encoder layer's alpha "
                "carries Z = sum_j alpha_j M_j; every matrix of both stacks is one term of the bound over L_e + L_d "
                "layers (our derivation, docs/theory.md 3i)",
                "extension",
            )
        )
    if tower is not None and dims.latent is not None:  # Kimi-K2.5's text model beside its vision tower
        out.append(
            _entry(
                "text_model_of_multimodal",
                True,
                f"the {tower} model of a multimodal checkpoint (Kimi-K2.5), bounded as a chain of its own; the vision "
                f"tower and the projector that feed it image tokens are outside the bound, like an embedding "
                f"(fixed_embeddings_and_head)",
                "convention",
            )
        )
    elif tower is not None and wrapper is not None and wrapper.projector is not None:
        what = wrapper.projector["description"]
        feeds = (
            "its input embeddings at the image tokens come from the vision tower through the projector, "
            "like an embedding"
            if tower == "text"
            else "its output reaches the text tower only through the projector, like a classifier head"
        )
        out.append(
            _entry(
                "vision_language_tower",
                True,
                f"the {tower} tower of a vision-language model ({wrapper.family}), bounded as a chain of its own "
                "with its "
                f"own L, alphas and bound, the same numbers as the same weights saved alone as its family; {feeds}. "
                f"The projector ({what}) is outside both towers' bounds: no theorem here bounds the composed model "
                f"(vision tower, projector, text tower), so there is no whole-model number, only one per tower "
                f"(docs/theory.md 3j)",
                "convention",
            )
        )
    elif tower is not None:
        out.append(
            _entry(
                "two_tower",
                True,
                f"the {tower} tower of a two-tower model (CLIP, SigLIP), bounded as a chain of its own with its own L, "
                f"alphas and bound; the projection heads (SigLIP's attention-pooling head too) and the logit scale are "
                f"outside the bound like a classifier head, and the similarity score that couples the towers is "
                f"bounded by neither tower's number (docs/theory.md 3j)",
                "convention",
            )
        )
    return out


# Every assumption, in the order an analysis lists them; ``assumptions`` reads it in one loop.
ASSUMPTIONS: tuple[Assumption | Assumptions, ...] = (
    Assumption(
        "no_residual_connections",
        "theorem",
        _always,
        _text(
            "the theorem's network has no residual connections; Lambda and alpha are those of the "
            "residual-free chain of this checkpoint's matrices, so every bound is a proxy for it"
        ),
    ),
    Assumption(
        "normalisation_as_projection",
        "theorem",
        _always,
        _text(
            "LayerNorm/RMSNorm is taken as a projection onto the unit ball; its learned gains and biases "
            "are ignored (they can scale every Lipschitz factor)"
        ),
    ),
    Assumption(
        "unit_norm_inputs",
        "theorem",
        _always,
        _text("every matrix is assumed to see token rows of norm at most 1; the embeddings' norms are not measured"),
    ),
    Assumption(
        "fixed_embeddings_and_head",
        "theorem",
        _always,
        _text("embeddings, pooler and classifier head are treated as fixed and are not in the complexity"),
    ),
    Assumption(
        "biases_ignored",
        "convention",
        _always,
        _text("biases are outside the analysed matrices (as in the paper's experiment)"),
    ),
    Assumption("multi_head_layer_form", "convention", _always, _layer_form_effect),
    Assumption("activation_constant", "convention", lambda ctx: ctx.l_phi is not None, _activation_constant_effect),
    Assumption(
        "iid_samples",
        "condition",
        lambda ctx: ctx.gap,
        _text(
            "the generalisation-gap bound needs n i.i.d. training sequences and a margin fixed before "
            "seeing the data (the data-chosen margin's union is not paid; docs/bounds.md)"
        ),
    ),
    Assumption(
        "gap_forms",
        "extension",
        lambda ctx: ctx.gap,
        _text(
            "the gap forms are this project's proxies of the sources' theorems, not their statements: the "
            "spectrum-adaptive family's margin inside each term and entropy integral are derived in "
            "docs/bounds.md section 9; c_lead and c_conf are unstated constants (default 1)"
        ),
    ),
    Assumption(
        "gated_feed_forward",
        "extension",
        lambda ctx: ctx.gated,
        _text(
            "gated blocks down(phi(gate x) * up x): Lip <= (L_phi + c_phi) c_g c_u c_d and the sensitivities "
            "of docs/theory.md 3b are our derivation"
        ),
    ),
    Assumption(
        "parallel_block",
        "extension",
        lambda ctx: ctx.dims.block == "parallel",
        _text(
            "attention and feed-forward on the same input: Lambda = Lip(attn) + Lip(ff), no feed-forward "
            "factor on attention sensitivities (our derivation, docs/theory.md 3b); one shared normalisation "
            "(GPT-J, Phi, Falcon-7B) or one per branch (GPT-NeoX, Falcon-40B) give the same factor"
        ),
    ),
    Assumption(
        "grouped_query_attention",
        "extension",
        lambda ctx: ctx.dims.H_kv < ctx.dims.H,
        lambda ctx: (
            f"{ctx.dims.H // max(ctx.dims.H_kv, 1)} query heads share each key/value head; every query head is counted "
            f"as its own QK and OV matrix (our extension)"
        ),
    ),
    Assumption(
        "shared_weights",
        "extension",
        lambda ctx: ctx.dims.stored is not None,
        _text(
            "layers share stored weights (ALBERT): the headline counts every depth; the variant "
            "spectral_shared counts each stored matrix once (our reading of the theorem's error split)"
        ),
    ),
    Assumption("rotary_positions", "extension", lambda ctx: ctx.rotary, _rotary_effect),
    Assumption(
        "alibi_positions",
        "extension",
        lambda ctx: ctx.dims.alibi,
        _text(
            "ALiBi adds a fixed position bias m_h (s - t) to every logit: no weight matrix changes and the "
            "head's Lipschitz bound c(OV)(1 + 4 c(QK)) holds unchanged, since the bias does not depend on the "
            "input (docs/theory.md 3g)"
        ),
    ),
    Assumption(
        "nope_layers",
        "convention",
        lambda ctx: ctx.nope_layers,
        lambda ctx: (
            f"layers {_ranges(list(ctx.nope_layers))} have no rotary positions (NoPE): their QK rows are the "
            f"plain bilinear W_Q^h^T W_K^g of the theorem, exact, and rotary_positions concerns the "
            f"other layers (docs/theory.md 3e)"
        ),
        listed=False,
    ),
    Assumptions(("mrope_positions", "rope_scaling"), lambda ctx: _rope_entries(list(ctx.rope))),
    Assumptions(("rotary_grid",), lambda ctx: _grid_entries(list(ctx.rope))),
    Assumptions(("qk_norm",), lambda ctx: _qk_norm_entries(ctx.qk_norm)),
    Assumption("latent_attention", "extension", lambda ctx: ctx.dims.latent is not None, _latent_effect, listed=False),
    Assumptions(_STRUCTURE_NAMES, lambda ctx: _structure_entries(ctx.structure, ctx.qk_norm)),
    Assumption(
        "sentence_transformers_modules",
        "theorem",
        lambda ctx: ctx.modules,
        lambda ctx: _modules_effect(ctx.modules),
        listed=False,
    ),
    Assumption("mixture_of_experts", "extension", _has_experts, _moe_effect, listed=False),
    Assumption(
        "moe_routing_fixed",
        "extension",
        _has_experts,
        _text(
            "the router's choice of experts and its gate values are held fixed: top-k routing is "
            "discontinuous in the input, so the network has no finite Lipschitz constant through it; the "
            "router weights (and the shared expert's gate) are read and shape-checked but are not matrices "
            "of the chain, and every bound is of the network with its routing frozen"
            + "; a group limit on the choice or a score correction bias (DeepSeek's, GLM's and ERNIE's "
            "e_score_correction_bias) changes which experts are chosen, never a gate's value or bound, so the "
            "frozen network is the same"
        ),
        listed=False,
    ),
    Assumptions(
        (
            "disentangled_attention",
            "encoder_decoder_chain",
            "text_model_of_multimodal",
            "vision_language_tower",
            "two_tower",
        ),
        lambda ctx: _chain_shape_entries(ctx.dims, ctx.tower, ctx.wrapper),
    ),
    Assumptions((), _note_entries),
)


def declared_names() -> tuple[str, ...]:
    """Every name an entry of :data:`ASSUMPTIONS` may have, row by row in order (a name declared by two rows appears
    twice: a test holds that none is); the readers' notes (:class:`~specbound.io.base.ReaderFacts`) add names of
    their own (docs/theory.md section 6 lists both)."""
    return tuple(n for row in ASSUMPTIONS for n in ((row.name,) if isinstance(row, Assumption) else row.names))


def assumptions(ctx: AssumptionContext) -> list[dict[str, Any]]:
    """The list for one analysis: ``{"name", "applies", "kind", "effect"}`` per assumption (:data:`ASSUMPTIONS`).

    ``kind`` is ``"theorem"`` for an assumption of the theorem that a real checkpoint breaks (the
    numbers are then proxies), ``"condition"`` for one the theorem puts on the data and its use (i.i.d.
    samples, a margin fixed in advance), which no checkpoint breaks and no analysis can check,
    ``"extension"`` for a derivation of ours beyond the paper, and ``"convention"`` for a choice the
    sources leave open.
    """
    out: list[dict[str, Any]] = []
    for row in ASSUMPTIONS:
        out += row.entries(ctx)
    return out


def is_theorem(entries: list[dict[str, Any]]) -> bool:
    """Whether no assumption of the theorem is broken and no extension is used (never for a real
    checkpoint: residual connections alone make every number a proxy)."""
    return not any(e["applies"] and e["kind"] in ("theorem", "extension") for e in entries)
