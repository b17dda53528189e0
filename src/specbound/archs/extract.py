"""From checkpoint tensors to the matrices the bounds see (docs/spec.md section 1), one layer at a time:
per-head factors in row-vector orientation, float64, fused QKV split, feed-forward matrices read
lazily.  The checkpoint has been accounted for already (:mod:`.binding`); the result is a
:class:`~.model.LayerWeights`, the compute stage's input.
"""

from __future__ import annotations

import numpy as np

from ..errors import SpecboundError
from ..io import Checkpoint
from .binding import qk_norm_eps
from .latent import latent_tensor_names, read_latent
from .model import LayerWeights, LazyMatrices, ModelDims, QKNorm
from .spec import BANK, ArchSpec
from .rotary import nope_flags
from .structure import folded_scales


def _row_oriented(array: np.ndarray, layout: str) -> np.ndarray:
    return array.T if layout == "linear" else array


def read_rule(
    rule, ckpt: Checkpoint, stored: int, prefix: str, expert: int | None = None, *, compact: bool = False
) -> np.ndarray:
    """The row-oriented matrix of one tensor rule at stored layer ``stored`` (of expert ``expert``),
    its output scale (LayerScale) folded in: ``(x W) diag(lambda)``.  ``compact``: in float32 where
    that holds the stored values exactly and the format reads them so (:meth:`Checkpoint.read`), and
    no scale is folded in; float64 otherwise."""
    name = rule.name_for(stored, prefix, expert)
    if rule.layout == BANK:  # every expert in one tensor, each stored (in, out): read expert ``expert`` alone
        return ckpt.read_part(name, expert)
    compact = compact and rule.output_scale is None
    # An ONNX weight knows its orientation from its MatMul/Gemm node; otherwise the spec's layout.
    w = _row_oriented(ckpt.read(name, compact=True) if compact else ckpt.read(name), ckpt.layout(name) or rule.layout)
    if rule.output_scale is not None:
        w = w * np.asarray(ckpt.read(rule.scale_for(stored, prefix)), dtype=np.float64).reshape(1, -1)
    return w


def head_columns(w: np.ndarray, heads: int, d_head: int) -> np.ndarray:
    """(N, heads*d_head) -> (heads, d_head, N): head h is ``w[:, h d : (h+1) d].T``."""
    n = w.shape[0]
    return np.ascontiguousarray(w.T.reshape(heads, d_head, n))


def split_fused_qkv(w: np.ndarray, fused: str, dims: ModelDims) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split a row-oriented fused ``(N, (H + 2 H_kv) d)`` matrix into ``q``, ``k``, ``v`` columns.

    ``concat``: columns ``[q | k | v]`` (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``).  ``per_head``: for each
    head ``h`` the columns ``[q_h | k_h | v_h]`` in turn (GPT-NeoX and BLOOM ``query_key_value``, i.e.
    the torch weight's rows viewed as ``(H, 3, d_h)``); it needs ``H_kv = H``.  ``per_group``: for each
    key/value head ``g`` its ``H / H_kv`` query heads, then its key, then its value (Falcon's
    ``query_key_value``, rows viewed as ``(H_kv, H / H_kv + 2, d_h)``).
    """
    hd, kvd = dims.H * dims.d_head, dims.H_kv * dims.d_head
    n = w.shape[0]  # N for a weight; the rank r for the right factor of a low-rank update (archs.low_rank)
    if fused == "concat":
        return w[:, :hd], w[:, hd : hd + kvd], w[:, hd + kvd :]
    if fused == "per_group":
        grouped = w.reshape(n, dims.H_kv, dims.H // dims.H_kv + 2, dims.d_head)
        return (
            grouped[:, :, :-2, :].reshape(n, hd),
            grouped[:, :, -2, :].reshape(n, kvd),
            grouped[:, :, -1, :].reshape(n, kvd),
        )
    if dims.H_kv != dims.H:
        raise SpecboundError("a per-head fused qkv layout needs as many key/value heads as query heads")
    per_head = w.reshape(n, dims.H, 3, dims.d_head)
    return tuple(per_head[:, :, i, :].reshape(n, hd) for i in range(3))


def fused_qkv_columns(fused: str, h: int, dims: ModelDims) -> tuple[int, int, int]:
    """First output feature of query head ``h``'s slice, and of its key's and value's, in a fused qkv
    (:func:`split_fused_qkv`'s layouts); each slice is ``d_h`` wide."""
    d, H, H_kv = dims.d_head, dims.H, dims.H_kv
    g = h // (H // H_kv)  # the key/value head query head h uses
    if fused == "per_head":
        return 3 * h * d, 3 * h * d + d, 3 * h * d + 2 * d
    if fused == "per_group":
        width = (H // H_kv + 2) * d  # one group: its query heads, its key, its value
        return g * width + (h - g * (H // H_kv)) * d, g * width + width - 2 * d, g * width + width - d
    return h * d, H * d + g * d, H * d + H_kv * d + g * d


FF_ROLES = ("ff_in", "ff_gate", "ff_up", "ff_out")


def ff_role_name(role: str, branch: str | None = None) -> str:
    """The analysed matrix's role: ``ff_gate`` -> ``FF_gate``; of expert 3 ``FF_gate[e3]``, of the
    shared expert ``FF_gate[shared]`` (``branch`` is a suffix of ``MixtureOfExperts.branches``)."""
    return "FF_" + role[3:] + ("" if branch is None else f"[{branch}]")


def gate_up_columns(fused: str, d_ff: int) -> tuple[slice, slice]:
    """The gate's and the up projection's columns of a fused ``ff_gate_up``: ``[gate | up]`` (``concat``)
    or alternating, gate first (``interleaved``: gpt-oss's ``gate_up[..., ::2]``, ``gate_up[..., 1::2]``)."""
    if fused == "interleaved":
        return slice(0, 2 * d_ff, 2), slice(1, 2 * d_ff, 2)
    return slice(0, d_ff), slice(d_ff, 2 * d_ff)


def _ff_loaders(rules: dict, read, branch: str | None, d_ff: int) -> dict:
    """Role -> loader of one feed-forward block's matrices; a fused ``ff_gate_up`` ``[gate | up]`` gives
    ``FF_gate`` and ``FF_up`` (each loader reads the fused tensor and keeps its half)."""
    loaders = {}
    for role in ("ff_in", "ff_gate", "ff_gate_up", "ff_up", "ff_out"):
        if role not in rules:
            continue
        if role == "ff_gate_up":
            gate, up = gate_up_columns(rules["ff_gate_up"].fused, d_ff)
            loaders[ff_role_name("ff_gate", branch)] = lambda: np.ascontiguousarray(read(rules["ff_gate_up"])[:, gate])
            loaders[ff_role_name("ff_up", branch)] = lambda: np.ascontiguousarray(read(rules["ff_gate_up"])[:, up])
        else:
            loaders[ff_role_name(role, branch)] = lambda rule=rules[role]: read(rule)
    return loaders


def layer_weights(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, layer: int) -> LayerWeights:
    """Read and slice one layer's attention tensors now and its feed-forward ones lazily (after
    :func:`account_for_tensors`).  Feed-forward matrices stay views of the read tensors (``W =
    weight.T`` for a Linear), not copies.  A mixture of experts lists every routed expert's
    matrices (``FF_gate[e0]``, ``FF_up[e0]``, ``FF_out[e0]``, ``FF_gate[e1]``, ...), then the shared
    expert's (``FF_gate[shared]``, ...)."""

    stored = dims.stored_layer(layer)

    def read(rule, expert: int | None = None, compact: bool = False) -> np.ndarray:
        """A rule's matrix, or a role's: ``read("q")``."""
        return read_rule(
            spec.tensors[rule] if isinstance(rule, str) else rule, ckpt, stored, prefix, expert, compact=compact
        )

    latent = None
    if spec.latent is not None:  # multi-head latent attention: its own factors (docs/theory.md 3l)
        latent = read_latent(spec, ckpt, dims, prefix, stored, read("o"))
    elif "qkv" in spec.tensors:
        q, k, v = split_fused_qkv(read("qkv"), spec.tensors["qkv"].fused, dims)
    else:
        q, k, v = read("q"), read("k"), read("v")
    compact = {}  # the same matrices as stored, for the spectra (LazyMatrices.compact)
    if spec.experts is None or not dims.routed(layer):  # dense, or a dense layer between layers of experts (Llama 4)
        rules, d_ff = (spec.tensors, dims.d_ff) if spec.experts is None else (spec.experts.dense, dims.moe.dense_d_ff)
        loaders = _ff_loaders(rules, read, None, d_ff)
        compact = _ff_loaders(rules, lambda rule: read(rule, compact=True), None, d_ff)
    else:
        loaders = {}
        for e in range(dims.moe.experts):
            loaders.update(_ff_loaders(spec.experts.tensors, lambda rule, e=e: read(rule, e), f"e{e}", dims.d_ff))
        if spec.experts.shared and dims.moe.shared_d_ff:
            loaders.update(_ff_loaders(spec.experts.shared, read, "shared", dims.moe.shared_d_ff))
    if latent is not None:
        return LayerWeights(
            layer=layer, q=None, k=None, v=None, o=None, ff=LazyMatrices(loaders, compact), latent=latent
        )
    rotates = nope_flags(spec.rotary_options.get("nope"), ckpt.config, dims.L)[layer] if spec.rotary else True
    # Granite's multipliers, Llama 4's query temperature on its NoPE layers
    q_scale, out_scale = folded_scales(spec.structure, ckpt.config, dims.d_head, rotates=rotates)
    o = read("o")
    if q_scale != 1.0:
        q = q * q_scale
    if out_scale != 1.0:
        o = o * out_scale
        loaders = {
            role: (lambda f=f: f() * out_scale) if role.startswith("FF_out") else f for role, f in loaders.items()
        }
        compact = {role: f for role, f in compact.items() if not role.startswith("FF_out")}  # scaled in float64
    return LayerWeights(
        layer=layer,
        q=head_columns(q, dims.H, dims.d_head),
        k=head_columns(k, dims.H_kv, dims.d_head),
        v=head_columns(v, dims.H_kv, dims.d_head),
        o=np.ascontiguousarray(o.reshape(dims.H, dims.d_head, dims.N)),
        ff=LazyMatrices(loaders, compact),
        qk_norm=qk_norm_gains(spec, ckpt, dims, prefix, stored) if normalises(spec, ckpt.config, dims, layer) else None,
    )


def normalises(spec: ArchSpec, config: dict, dims: ModelDims, layer: int) -> bool:
    """Whether layer ``layer`` normalises its queries and keys: a spec with ``qk_norm``, on every layer or
    (``layers: rotary``, Llama 4) on those that rotate."""
    rule = spec.qk_norm
    if rule is None:
        return False
    return rule.layers == "all" or nope_flags(spec.rotary_options.get("nope"), config, dims.L)[layer]


def qk_norm_gains(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, stored: int) -> QKNorm:
    """The query/key norm of stored layer ``stored``: gains per head ``(H, d_h)`` / ``(H_kv, d_h)`` in
    float64 (a per-head gain is shared by every head; Gemma's ``1 + w`` added)."""
    rule = spec.qk_norm
    if rule.gain == "none":  # a weightless norm (Llama 4's L2 norm): every gain 1
        return QKNorm(
            np.ones((dims.H, dims.d_head)), np.ones((dims.H_kv, dims.d_head)), qk_norm_eps(spec, ckpt.config), rule.span
        )
    gains = []
    for name, heads in zip(rule.names_for(stored, prefix), (dims.H, dims.H_kv)):
        w = np.asarray(ckpt.read(name), dtype=np.float64)
        # Gemma's RMSNorm computes 1 + w in float32 (``1.0 + self.weight.float()``), as llama.cpp's
        # converter does before storing it: the gain the model multiplies by is that float32 sum
        g = (np.float32(1.0) + w.astype(np.float32)).astype(np.float64) if rule.gain == "one_plus_weight" else w
        gains.append(
            np.broadcast_to(g, (heads, dims.d_head)).copy() if rule.span == "head" else g.reshape(heads, dims.d_head)
        )
    return QKNorm(gains[0], gains[1], qk_norm_eps(spec, ckpt.config), rule.span)


def matrix_tensor_names(spec: ArchSpec, dims: ModelDims, prefix: str) -> dict[tuple[int, int | None, str], str]:
    """Which checkpoint tensor(s) each analysed matrix is made of, by ``(layer, head, role)``.

    ``QK`` of head ``h`` is ``q[...]|k[...]`` (then ``|q_norm|k_norm`` gains for a QK-norm family, with
    the head's slice when the norm spans the projection), ``OV`` is ``v[...]|o[...]``: each tensor's name with the
    head's slice of its head axis in brackets (the output features of q, k, v; the input features
    of o; a fused qkv's slice of its output axis); a feed-forward matrix is its tensor's name (a
    fused gate_up's half in brackets).  A shared layer (ALBERT) names the stored layer it reads.

    Returns
    -------
    dict mapping ``(layer, head or None, role)`` to the names, ``|``-separated.
    """
    d, H, H_kv = dims.d_head, dims.H, dims.H_kv
    group = H // H_kv
    out: dict[tuple[int, int | None, str], str] = {}
    for layer in range(dims.L):
        stored = dims.stored_layer(layer)

        def name(role: str) -> str:
            return spec.tensors[role].name_for(stored, prefix)

        def scale(role: str) -> str:
            tensor = spec.tensors[role]
            return "" if tensor.output_scale is None else "|" + tensor.scale_for(stored, prefix)

        for h in range(H):
            g = h // group  # the key/value head query head h uses
            if spec.latent is not None:
                out[(layer, h, "QK")], out[(layer, h, "OV")] = latent_tensor_names(spec, dims, prefix, stored, h)
                continue
            if "qkv" in spec.tensors:
                fused = name("qkv")
                q, k, v = (f"{fused}[{a}:{a + d}]" for a in fused_qkv_columns(spec.tensors["qkv"].fused, h, dims))
            else:
                q = f"{name('q')}[{h * d}:{(h + 1) * d}]"
                k, v = (f"{name(r)}[{g * d}:{(g + 1) * d}]" for r in ("k", "v"))
            named = spec.qk_norm is not None and spec.qk_norm.gain != "none"  # a weightless norm has no tensors
            out[(layer, h, "QK")] = f"{q}|{k}" + (_norm_names(spec, prefix, stored, h, g, d) if named else "")
            out[(layer, h, "OV")] = f"{v}|{name('o')}[{h * d}:{(h + 1) * d}]" + scale("o")
        if spec.experts is None:
            out.update(_ff_names(spec.tensors, layer, stored, prefix, None, None, dims.d_ff))
            continue
        if not dims.routed(layer):
            out.update(_ff_names(spec.experts.dense, layer, stored, prefix, None, None, dims.moe.dense_d_ff))
            continue
        for e in range(dims.moe.experts):
            out.update(_ff_names(spec.experts.tensors, layer, stored, prefix, e, f"e{e}", dims.d_ff))
        if spec.experts.shared and dims.moe.shared_d_ff:
            out.update(_ff_names(spec.experts.shared, layer, stored, prefix, None, "shared", dims.moe.shared_d_ff))
    return out


def _ff_names(
    rules: dict, layer: int, stored: int, prefix: str, expert: int | None, branch: str | None, d_ff: int
) -> dict:
    out = {}
    for role in ("ff_in", "ff_gate", "ff_gate_up", "ff_up", "ff_out"):
        if role not in rules:
            continue
        name = rules[role].name_for(stored, prefix, expert)
        if rules[role].layout == BANK:
            name += f"[{expert}]"
        if role == "ff_gate_up":
            for half, cols in zip(("ff_gate", "ff_up"), gate_up_columns(rules[role].fused, d_ff)):
                step = "" if cols.step in (None, 1) else f":{cols.step}"
                out[(layer, None, ff_role_name(half, branch))] = f"{name}[{cols.start}:{cols.stop}{step}]"
        else:  # a LayerScale vector folded into the matrix is one of its tensors
            scale = rules[role].scale_for(stored, prefix)
            out[(layer, None, ff_role_name(role, branch))] = name + ("" if scale is None else f"|{scale}")
    return out


def _norm_names(spec: ArchSpec, prefix: str, stored: int, h: int, g: int, d: int) -> str:
    """``|q_norm|k_norm`` of query head ``h`` and its key head ``g`` (sliced over a whole-projection norm)."""
    qn, kn = spec.qk_norm.names_for(stored, prefix)
    if spec.qk_norm.span == "head":
        return f"|{qn}|{kn}"
    return f"|{qn}[{h * d}:{(h + 1) * d}]|{kn}[{g * d}:{(g + 1) * d}]"
