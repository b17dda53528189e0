"""One layer's low-rank weight updates ``W - W0`` (a LoRA adapter, :mod:`specbound.io.lora`) as
factors of the matrices the bounds see, never multiplied out (docs/theory.md section 3k).

A stored tensor's update is ``P @ Q`` (:meth:`~specbound.io.lora.LoraCheckpoint.delta_factors`); in
row-vector orientation (``W_row = T^T`` for a Linear, ``T`` for a Conv1D) it is ``L @ R`` with
``L`` ``(in, r)`` and ``R`` ``(r, out)``.  Everything a family does to a tensor on the way to a head
or a feed-forward matrix selects or scales its output columns (a head's slice, a fused qkv's split, a
fused gate/up's half, a LayerScale vector), which act on ``R`` alone, or, for the output projection,
selects its input rows, which act on ``L`` alone.  So each head factor's update is ``u[h] @ v[h]``
with ``u[h]`` ``(d_h, r)`` and ``v[h]`` ``(r, N)``, and each feed-forward matrix's is ``L @ R``.
"""

from __future__ import annotations

import numpy as np

from ..errors import SpecboundError
from ..io import Checkpoint
from .extract import ff_role_name, head_columns, split_fused_qkv
from .model import HeadUpdate, LayerUpdates, ModelDims
from .spec import BANK, ArchSpec
from .structure import folded_scales


class DenseUpdate(Exception):
    """A tensor of the layer is replaced whole (``modules_to_save``): its update is not low rank, and the
    layer's differences are taken from the weights themselves."""


def _rule_factors(rule, ckpt, stored: int, prefix: str, expert: int | None = None):
    """``(L, R)`` of one tensor rule's row-oriented update (its output scale folded into ``R``), None
    when the tensor is unchanged; :class:`DenseUpdate` when it (or its scale) is replaced whole."""
    name = rule.name_for(stored, prefix, expert)
    scale = rule.scale_for(stored, prefix)
    if ckpt.replaced(name) or (scale is not None and ckpt.replaced(scale)):
        raise DenseUpdate(name)
    factors = ckpt.delta_factors(name)
    if factors is None:
        return None
    p, q = factors
    left, right = (q.T, p.T) if (ckpt.layout(name) or rule.layout) == "linear" else (p, q)
    if scale is not None:
        right = right * np.asarray(ckpt.read(scale), dtype=np.float64).reshape(1, -1)
    return np.ascontiguousarray(left), np.ascontiguousarray(right)


def _columns_update(factors, heads: int, d_head: int) -> HeadUpdate | None:
    """Heads from output columns: ``(W_row)[:, h d:(h+1) d].T = R_h^T L^T``."""
    if factors is None:
        return None
    left, right = factors
    return HeadUpdate(head_columns(right, heads, d_head), np.broadcast_to(left.T, (heads, *left.T.shape)))


def _rows_update(factors, heads: int, d_head: int) -> HeadUpdate | None:
    """Heads from input rows (the output projection): ``W_row[h d:(h+1) d] = L_h R``."""
    if factors is None:
        return None
    left, right = factors
    return HeadUpdate(
        np.ascontiguousarray(left.reshape(heads, d_head, left.shape[1])), np.broadcast_to(right, (heads, *right.shape))
    )


def layer_updates(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, layer: int) -> LayerUpdates:
    """Layer ``layer``'s updates as factors (``ckpt``: a :class:`~specbound.io.lora.LoraCheckpoint`);
    :class:`DenseUpdate` when a tensor of the layer is replaced whole."""
    if spec.latent is not None:
        raise SpecboundError(
            f"a LoRA adapter on a {spec.family} model (multi-head latent attention) is not supported: "
            f"merge the adapter into the base and pass the base with --init"
        )
    stored = dims.stored_layer(layer)
    rules = spec.tensors
    if folded_scales(spec.structure, ckpt.config, dims.d_head) != (1.0, 1.0):
        raise DenseUpdate("multipliers folded into the matrices")  # Granite: the differences of the weights
    if spec.experts is not None and any(r.layout == BANK for r in spec.experts.tensors.values()):
        raise DenseUpdate("expert banks")  # one adapter factor pair for every expert: the weights' differences
    if any(r.fused == "interleaved" for r in spec.tensors.values()):
        raise DenseUpdate("interleaved gate and up")

    def factors(role, expert=None):
        return _rule_factors(rules[role] if isinstance(role, str) else role, ckpt, stored, prefix, expert)

    d = dims.d_head
    if "qkv" in rules:
        fused = factors("qkv")
        if fused is None:
            q = k = v = None
        else:
            left, right = fused
            parts = split_fused_qkv(right, rules["qkv"].fused, dims)
            q, k, v = ((left, np.ascontiguousarray(part)) for part in parts)
    else:
        q, k, v = factors("q"), factors("k"), factors("v")
    heads = {
        "q": _columns_update(q, dims.H, d),
        "k": _columns_update(k, dims.H_kv, d),
        "v": _columns_update(v, dims.H_kv, d),
        "o": _rows_update(factors("o"), dims.H, d),
    }
    ff: dict = {}
    shapes: dict = {}
    if spec.experts is None:
        blocks = [(spec.tensors, None, None, dims.d_ff)]
    elif not dims.moe.routed(layer):  # a dense layer between the mixtures
        blocks = [(spec.experts.dense, None, None, dims.moe.dense_d_ff)]
    else:
        blocks = [(spec.experts.tensors, e, f"e{e}", dims.d_ff) for e in range(dims.moe.experts)] + (
            [(spec.experts.shared, None, "shared", dims.moe.shared_d_ff)]
            if spec.experts.shared and dims.moe.shared_d_ff
            else []
        )
    for block_rules, expert, branch, d_ff in blocks:
        for role in ("ff_in", "ff_gate", "ff_gate_up", "ff_up", "ff_out"):
            if role not in block_rules:
                continue
            rule = block_rules[role]
            f = _rule_factors(rule, ckpt, stored, prefix, expert)
            name = rule.name_for(stored, prefix, expert)
            shape = (
                tuple(ckpt.shape(name))[::-1]
                if (ckpt.layout(name) or rule.layout) == "linear"
                else tuple(ckpt.shape(name))
            )
            if role == "ff_gate_up":
                halves = (
                    (None, None)
                    if f is None
                    else ((f[0], np.ascontiguousarray(f[1][:, :d_ff])), (f[0], np.ascontiguousarray(f[1][:, d_ff:])))
                )
                for half, part in zip(("ff_gate", "ff_up"), halves):
                    ff[ff_role_name(half, branch)] = part
                    shapes[ff_role_name(half, branch)] = (shape[0], d_ff)
            else:
                ff[ff_role_name(role, branch)] = f
                shapes[ff_role_name(role, branch)] = shape
    return LayerUpdates(heads, ff, shapes)


def cross_updates(
    rules: dict, ckpt: Checkpoint, dims: ModelDims, prefix: str, layer: int
) -> dict[str, HeadUpdate | None]:
    """A decoder layer's cross-attention updates (``cross_q``, ``cross_k``, ``cross_v``, ``cross_o``; one
    key/value head per query head)."""
    f = {role: _rule_factors(rule, ckpt, layer, prefix) for role, rule in rules.items()}
    d = dims.d_head
    return {
        "cross_q": _columns_update(f["q"], dims.H, d),
        "cross_k": _columns_update(f["k"], dims.H, d),
        "cross_v": _columns_update(f["v"], dims.H, d),
        "cross_o": _rows_update(f["o"], dims.H, d),
    }


def read_layer_updates(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, layer: int) -> LayerUpdates:
    """:func:`layer_updates` by the model's layer numbering, a decoder layer's cross-attention
    included (as :func:`~.stacks.read_layer_weights` reads the weights)."""
    if dims.stacks is None:
        return layer_updates(spec, ckpt, dims, prefix, layer)
    part, local = dims.locate(layer)
    st = spec.stack(part.name)
    updates = layer_updates(st.spec, ckpt, part.dims, prefix, local)
    if part.cross:
        updates.heads.update(cross_updates(st.cross, ckpt, part.dims, prefix, local))
    return updates
