"""A family spec bound to a checkpoint, one chain of layers or an encoder-decoder's two stacks.

An encoder-decoder (``"stacks"`` in its spec) is read as its encoder's layers followed by its
decoder's, numbered on through both (T5 with 6 + 6 layers: 0..5 the encoder, 6..11 the decoder);
every decoder layer also holds a cross-attention, whose queries act on the decoder's stream and whose
keys and values act on the encoder's output.  Each stack is a chain of its own for its dimensions,
tensor names and extraction (:mod:`.binding`, :mod:`.extract`); this module joins them: dimensions
with :class:`~.model.StackDims`, every tensor accounted for once, layer ``l``'s weights and each
matrix's tensor names by the model's numbering.  An encoder-only export of an encoder-decoder family
(T5EncoderModel: no decoder tensor at all) is read as its encoder.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import SpecboundError
from ..io import Checkpoint
from .binding import account_for_tensors, check_strays, detect_prefix, infer_from_shapes, model_dims, role_tensors
from .extract import head_columns, layer_weights, matrix_tensor_names, read_rule
from .model import CrossWeights, LayerWeights, ModelDims, StackDims
from .spec import ArchSpec, StackSpec


def bind(spec: ArchSpec, ckpt: Checkpoint) -> tuple[ModelDims, str]:
    """``(dims, prefix)`` of ``ckpt`` read through ``spec``, every tensor accounted for (a role tensor
    of some layer with the right shape, or ignored); only config.json and the tensor headers are read."""
    if spec.stacks is None:
        dims = model_dims(spec, ckpt.config)
        prefix = detect_prefix(spec, ckpt)
        dims = infer_from_shapes(spec, ckpt, dims, prefix)
        account_for_tensors(spec, ckpt, dims, prefix)
        return dims, prefix
    encoder = spec.stacks[0]
    prefix = detect_prefix(encoder.spec, ckpt)
    stacks = [st for st in spec.stacks if st.name == "encoder" or _present(st, ckpt, prefix)]
    parts, first, accounted = [], 0, set()
    for st in stacks:
        dims = infer_from_shapes(st.spec, ckpt, model_dims(st.spec, ckpt.config), prefix)
        parts.append(StackDims(st.name, first, dims, cross=bool(st.cross) and len(stacks) > 1))
        first += dims.L
        accounted |= role_tensors(st.spec, ckpt, dims, prefix)
        if st.cross:
            accounted |= role_tensors(st.spec, ckpt, dims, prefix, rules=st.cross, suffix="_cross")
    check_strays(spec, ckpt, prefix, accounted)
    widths = {p.dims.N for p in parts}
    if len(widths) != 1:
        raise SpecboundError(
            f"config.json gives the stacks of {ckpt.location} different widths ({sorted(widths)}): "
            f"a decoder's cross-attention reads the encoder's output, so they must agree"
        )
    enc = parts[0].dims
    return replace(
        enc,
        L=first,
        H=max(p.dims.H for p in parts),
        H_kv=max(p.dims.H_kv for p in parts),
        d_ff=max(p.dims.d_ff for p in parts),
        stacks=tuple(parts),
    ), prefix


def _present(stack: StackSpec, ckpt: Checkpoint, prefix: str) -> bool:
    """Whether the checkpoint holds any of the stack's layer-0 weights (an encoder-only export of an
    encoder-decoder holds none of its decoder's)."""
    names = set(ckpt.names)
    rules = list(stack.spec.tensors.values()) + list(stack.cross.values())
    return any(rule.name_for(0, prefix) in names for rule in rules)


def read_layer_weights(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, layer: int) -> LayerWeights:
    """Layer ``layer``'s weights (the model's numbering), a decoder layer's cross-attention included."""
    if dims.stacks is None:
        return layer_weights(spec, ckpt, dims, prefix, layer)
    part, local = dims.locate(layer)
    st = spec.stack(part.name)
    weights = layer_weights(st.spec, ckpt, part.dims, prefix, local)
    weights.layer = layer
    if part.cross:
        d = part.dims
        read = {role: read_rule(rule, ckpt, local, prefix) for role, rule in st.cross.items()}
        weights.cross = CrossWeights(
            q=head_columns(read["q"], d.H, d.d_head),
            k=head_columns(read["k"], d.H, d.d_head),
            v=head_columns(read["v"], d.H, d.d_head),
            o=np.ascontiguousarray(read["o"].reshape(d.H, d.d_head, d.N)),
        )
    return weights


def tensor_names(spec: ArchSpec, dims: ModelDims, prefix: str) -> dict[tuple[int, int | None, str], str]:
    """:func:`~.extract.matrix_tensor_names` by the model's layer numbering; a decoder layer's
    cross-attention heads are ``QK_cross`` and ``OV_cross``."""
    if dims.stacks is None:
        return matrix_tensor_names(spec, dims, prefix)
    out = {}
    for part in dims.stacks:
        st = spec.stack(part.name)
        for (layer, head, role), names in matrix_tensor_names(st.spec, part.dims, prefix).items():
            out[(part.first + layer, head, role)] = names
        if part.cross:
            d = part.dims.d_head
            for layer in range(part.dims.L):
                name = {role: rule.name_for(layer, prefix) for role, rule in st.cross.items()}
                for h in range(part.dims.H):
                    cols = f"[{h * d}:{(h + 1) * d}]"
                    out[(part.first + layer, h, "QK_cross")] = f"{name['q']}{cols}|{name['k']}{cols}"
                    out[(part.first + layer, h, "OV_cross")] = f"{name['v']}{cols}|{name['o']}{cols}"
    return out


def stacks_record(dims: ModelDims) -> list[dict] | None:
    """The JSON ``model.stacks`` of an encoder-decoder: each stack's name, first layer and dimensions."""
    if dims.stacks is None:
        return None
    return [
        {
            "stack": p.name,
            "first_layer": p.first,
            "L": p.dims.L,
            "H": p.dims.H,
            "H_kv": p.dims.H_kv,
            "d_head": p.dims.d_head,
            "d_ff": p.dims.d_ff,
            "cross_attention": p.cross,
        }
        for p in dims.stacks
    ]
