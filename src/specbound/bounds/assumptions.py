"""Where an analysed model departs from the model the theorem is proven for, said in every output.

Sakai & Imaizumi's Theorem 3.1 is proven for a network without residual connections, with
normalisation acting as a projection onto the unit ball, unit-norm inputs to every matrix, fixed
embeddings and head, and (for its gap form) i.i.d. samples.  Real checkpoints break some of that, and the extensions to
gated, parallel, grouped-query, shared-weight and rotary models are this project's derivations.  Each
entry says whether it applies to this analysis and what it does to the numbers, so a reader can tell
which numbers are theorems and which are proxies under named assumptions (docs/theory.md, section 6).
"""

from __future__ import annotations

from typing import Any

from ..archs.model import ModelDims


def _entry(name: str, applies: bool, effect: str, kind: str) -> dict[str, Any]:
    return {"name": name, "applies": bool(applies), "kind": kind, "effect": effect}


def layer_form(dims: ModelDims, *, rotary: bool = False) -> str:
    """The ``Lambda`` this family's layers get (docs/spec.md section 3, docs/theory.md 3b), as text."""
    qk = "c*(QK_h)" if rotary else "c(QK_h)"
    attention = f"sum_h c(OV_h)(1 + 4 {qk})"
    ff = ("(L_phi + c_phi) c(FF_gate) c(FF_up) c(FF_out)" if dims.feed_forward == "gated"
          else "L_phi c(FF_in) c(FF_out)")
    return f"Lambda = {attention} + {ff}" if dims.block == "parallel" else f"Lambda = {ff} {attention}"


def _activation_effect(l_phi: float | None, source: str | None, gated: bool) -> str:
    constant = "L_phi" + (" (and c_phi = 1, |phi(t)| <= |t|)" if gated else "")
    if source == "user":
        return (f"{constant}: L_phi = {l_phi:g} as given (--l-phi); specbound does not check it against the "
                f"activation")
    if source is not None and source.startswith("default"):
        return (f"{constant}: config.json names no activation; L_phi = {l_phi:g}, GELU's, is assumed (pass --l-phi "
                f"if the model's activation is another)")
    return f"{constant}: L_phi = {l_phi:g} for {source} (its sup |phi'| rounded up: the table of compute/propagation.py)"


def assumptions(dims: ModelDims, family: str, *, rotary: bool, init: bool, gap: bool,
                weights_note: str | None = None, l_phi: float | None = None, l_phi_source: str | None = None,
                rotary_methods: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The list for one analysis: ``{"name", "applies", "kind", "effect"}`` per assumption.

    ``kind`` is ``"theorem"`` for an assumption of the theorem that a real checkpoint breaks (the
    numbers are then proxies), ``"condition"`` for one the theorem puts on the data and its use (i.i.d.
    samples, a margin fixed in advance), which no checkpoint breaks and no analysis can check,
    ``"extension"`` for a derivation of ours beyond the paper, and ``"convention"`` for a choice the
    sources leave open.  ``l_phi``, ``l_phi_source``: the activation constant used and where it came
    from; ``rotary_methods``: how many rotary QK heads got the exact maximum over offsets and how many
    the product bound.
    """
    gated = dims.feed_forward == "gated"
    methods = rotary_methods or {}
    out = [
        _entry("no_residual_connections", True,
               "the theorem's network has no residual connections; Lambda and alpha are those of the "
               "residual-free chain of this checkpoint's matrices, so every bound is a proxy for it", "theorem"),
        _entry("normalisation_as_projection", True,
               "LayerNorm/RMSNorm is taken as a projection onto the unit ball; its learned gains and biases "
               "are ignored (they can scale every Lipschitz factor)", "theorem"),
        _entry("unit_norm_inputs", True,
               "every matrix is assumed to see token rows of norm at most 1; the embeddings' norms are not "
               "measured", "theorem"),
        _entry("fixed_embeddings_and_head", True,
               "embeddings, pooler and classifier head are treated as fixed and are not in the complexity",
               "theorem"),
        _entry("biases_ignored", True, "biases are outside the analysed matrices (as in the paper's experiment)",
               "convention"),
        _entry("multi_head_layer_form", True,
               f"{layer_form(dims, rotary=rotary)} and the sensitivities gamma*: the multi-head form of the paper's "
               f"BERT experiment" + (", with this family's blocks as derived in docs/theory.md 3b"
                                     if gated or dims.block == "parallel" else "")
               + "; L_phi enters Lambda but not gamma* (the reference code's convention)", "convention"),
        _entry("activation_constant", l_phi is not None, _activation_effect(l_phi, l_phi_source, gated)
               if l_phi is not None else "L_phi from the activation table of compute/propagation.py or --l-phi",
               "convention"),
        _entry("iid_samples", gap,
               "the generalisation-gap bound needs n i.i.d. training sequences and a margin fixed before "
               "seeing the data (the data-chosen margin's union is not paid; docs/bounds.md)", "condition"),
        _entry("gap_forms", gap,
               "the gap forms are this project's proxies of the sources' theorems, not their statements: the "
               "spectrum-adaptive family's margin inside each term and entropy integral are derived in "
               "docs/bounds.md section 9; c_lead and c_conf are unstated constants (default 1)", "extension"),
        _entry("gated_feed_forward", gated,
               "gated blocks down(phi(gate x) * up x): Lip <= (L_phi + c_phi) c_g c_u c_d and the sensitivities "
               "of docs/theory.md 3b are our derivation", "extension"),
        _entry("parallel_block", dims.block == "parallel",
               "attention and feed-forward on the same input: Lambda = Lip(attn) + Lip(ff), no feed-forward "
               "factor on attention sensitivities (our derivation, docs/theory.md 3b)", "extension"),
        _entry("grouped_query_attention", dims.H_kv < dims.H,
               f"{dims.H // max(dims.H_kv, 1)} query heads share each key/value head; every query head is counted "
               f"as its own QK and OV matrix (our extension)", "extension"),
        _entry("shared_weights", dims.stored is not None,
               "layers share stored weights (ALBERT): the headline counts every depth; the variant "
               "spectral_shared counts each stored matrix once (our reading of the theorem's error split)",
               "extension"),
        _entry("rotary_positions", rotary,
               "every QK number bounds its value at every relative position (docs/rotary.md): c*(QK) is the exact "
               f"maximum over offsets for {methods.get('exact_over_offsets', 0)} heads and the product "
               f"||W_Q|| ||W_K|| for {methods.get('product_bound', 0)} (columns sv_method, argmax_offset); S_p "
               "and the rank come from the Horn envelope (singular_values rows of kind horn_envelope, not "
               "singular values); the theorem's covering argument is not proven for rotary heads, so these "
               "bounds are proxies; the *_rotation_blind variants ignore the rotation", "extension"),
        _entry("rotary_distance_from_init", rotary and init,
               "W - W0 of rotary QK heads is measured as if unrotated (rotation-blind)", "extension"),
    ]
    if weights_note:
        out.append(_entry("quantized_weights", True, weights_note, "convention"))
    return out


def is_theorem(entries: list[dict[str, Any]]) -> bool:
    """Whether no assumption of the theorem is broken and no extension is used (never for a real
    checkpoint: residual connections alone make every number a proxy)."""
    return not any(e["applies"] and e["kind"] in ("theorem", "extension") for e in entries)
