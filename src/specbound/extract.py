"""From checkpoint tensors to the matrices the bounds see (SPEC section 1), one layer at a time.

Every checkpoint tensor is accounted for before any number is computed: it is either a role
tensor of some layer or matched by one of the family's ignore patterns; anything else, and any
missing or mis-shaped role tensor, is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .archspec import ArchSpec
from .checkpoint import Checkpoint
from .errors import SpecboundError


@dataclass(frozen=True)
class ModelDims:
    """Dimensions read from config.json through the family's spec."""

    L: int
    N: int
    H: int
    H_kv: int
    d_head: int
    d_ff: int
    activation: str | None = None
    block: str = "sequential"
    feed_forward: str = "plain"


@dataclass
class LayerWeights:
    """One layer's weights in row-vector orientation, float64.

    Attributes
    ----------
    q, k, v : ndarray, shape (H, d_head, N) (k, v: (H_kv, d_head, N))
        Per-head factors ``W_Q^h``, ``W_K^h``, ``W_V^h``.
    o : ndarray, shape (H, d_head, N)
        Per-head ``W_O^h`` (rows of ``out.weight.T``).
    ff : dict[str, ndarray]
        Feed-forward matrices by role: ``FF_in`` (N, d_ff) and ``FF_out`` (d_ff, N), or
        ``FF_gate``, ``FF_up`` (N, d_ff) and ``FF_out``.
    """

    layer: int
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    ff: dict[str, np.ndarray]


def model_dims(spec: ArchSpec, config: dict) -> ModelDims:
    def need(field: str, optional: bool = False) -> int | None:
        value = spec.config_value(config, field)
        if optional and value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            keys = " or ".join(spec.config_keys[field])
            raise SpecboundError(
                f"config.json needs a positive integer {keys} for the {spec.family} family, found {value!r}"
            )
        return value

    L, N, H = need("num_layers"), need("hidden_size"), need("num_heads")
    if spec.ff_size_multiplier and spec.config_value(config, "ff_size") is None:
        d_ff = spec.ff_size_multiplier * N  # e.g. GPT-2's n_inner = None means 4 * n_embd
    else:
        d_ff = need("ff_size")
    head_dim = need("head_dim", optional=True)
    d_head = head_dim or (N // H)
    if not head_dim and N % H:
        raise SpecboundError(f"config.json: hidden_size={N} is not divisible by num_heads={H}, so the "
                             f"head size is undefined: fix the config to match the saved model")
    H_kv = need("num_kv_heads", optional=True) or H
    if H % H_kv:
        raise SpecboundError(f"config.json: {H} query heads cannot share {H_kv} key/value heads evenly")
    activation = spec.config_value(config, "activation")
    return ModelDims(L=L, N=N, H=H, H_kv=H_kv, d_head=int(d_head), d_ff=d_ff,
                     activation=activation if isinstance(activation, str) else None,
                     block=spec.block_for(config), feed_forward=spec.feed_forward)


def _expected_shapes(dims: ModelDims) -> dict[str, tuple[int, int]]:
    """Row-vector-orientation shape of each role's matrix."""
    hd, kvd = dims.H * dims.d_head, dims.H_kv * dims.d_head
    return {"q": (dims.N, hd), "k": (dims.N, kvd), "v": (dims.N, kvd), "qkv": (dims.N, hd + 2 * kvd),
            "o": (hd, dims.N), "ff_in": (dims.N, dims.d_ff), "ff_gate": (dims.N, dims.d_ff),
            "ff_up": (dims.N, dims.d_ff), "ff_out": (dims.d_ff, dims.N)}


def detect_prefix(spec: ArchSpec, ckpt: Checkpoint) -> str:
    """The name prefix (``""``, ``"bert."``, ...) under which this checkpoint stores layer 0."""
    names = set(ckpt.shards)
    probe = spec.tensors["qkv" if "qkv" in spec.tensors else "q"]
    for prefix in spec.prefixes:
        if probe.name_for(0, prefix) in names:
            return prefix
    tried = [probe.name_for(0, p) for p in spec.prefixes]
    raise SpecboundError(
        f"missing tensor: {ckpt.location} has none of {tried} (the {spec.family} family's layer-0 "
        f"query weight); is this checkpoint of another family? pass --arch-spec FILE to map its names"
    )


def account_for_tensors(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str) -> None:
    """Check that every role tensor exists with the right shape and every other tensor is ignored."""
    expected = _expected_shapes(dims)
    wanted = {}
    for layer in range(dims.L):
        for role, rule in spec.tensors.items():
            wanted[rule.name_for(layer, prefix)] = (role, rule.layout, layer)
    for name, (role, layout, layer) in wanted.items():
        if name not in ckpt.shards:
            raise SpecboundError(
                f"missing tensor {name!r} ({role} of layer {layer}): config.json says "
                f"{dims.L} layers; the checkpoint is incomplete or its config does not match it"
            )
        stored = ckpt.shape(name)
        rows, cols = expected[role]
        want = (cols, rows) if layout == "linear" else (rows, cols)
        if stored != want:
            raise SpecboundError(
                f"tensor {name!r} has shape {stored}, but config.json (hidden_size={dims.N}, "
                f"heads={dims.H}, head_dim={dims.d_head}, ff_size={dims.d_ff}) implies {want} for a "
                f"{layout} {role} weight: the config does not describe these weights"
            )
    stray = [n for n in ckpt.shards if n not in wanted and not spec.is_ignored(n, prefix)]
    if stray:
        shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
        raise SpecboundError(
            f"unaccounted tensors in {ckpt.location}: {shown} are neither a {spec.family} role tensor "
            f"nor ignored by its spec ({spec.origin}); add them to the spec's ignore list or use "
            f"--arch-spec FILE"
        )


def _row_oriented(array: np.ndarray, layout: str) -> np.ndarray:
    return array.T if layout == "linear" else array


def _head_columns(w: np.ndarray, heads: int, d_head: int) -> np.ndarray:
    """(N, heads*d_head) -> (heads, d_head, N): head h is ``w[:, h d : (h+1) d].T``."""
    n = w.shape[0]
    return np.ascontiguousarray(w.T.reshape(heads, d_head, n))


def split_fused_qkv(w: np.ndarray, fused: str, dims: ModelDims) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split a row-oriented fused ``(N, (H + 2 H_kv) d)`` matrix into ``q``, ``k``, ``v`` columns.

    ``concat``: columns ``[q | k | v]`` (GPT-2 ``c_attn``).  ``per_head``: for each head ``h`` the
    columns ``[q_h | k_h | v_h]`` in turn (GPT-NeoX ``query_key_value``, i.e. the torch weight's
    rows viewed as ``(H, 3, d_h)``); it needs ``H_kv = H``.
    """
    hd, kvd = dims.H * dims.d_head, dims.H_kv * dims.d_head
    if fused == "concat":
        return w[:, :hd], w[:, hd:hd + kvd], w[:, hd + kvd:]
    if dims.H_kv != dims.H:
        raise SpecboundError("a per-head fused qkv layout needs as many key/value heads as query heads")
    per_head = w.reshape(dims.N, dims.H, 3, dims.d_head)
    return tuple(per_head[:, :, i, :].reshape(dims.N, hd) for i in range(3))


def layer_weights(spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, layer: int) -> LayerWeights:
    """Read and slice one layer's role tensors (after :func:`account_for_tensors`)."""
    mats = {
        role: _row_oriented(ckpt.read(rule.name_for(layer, prefix)), rule.layout)
        for role, rule in spec.tensors.items()
    }
    if "qkv" in mats:
        mats["q"], mats["k"], mats["v"] = split_fused_qkv(mats.pop("qkv"), spec.tensors["qkv"].fused, dims)
    ff_roles = [r for r in ("ff_in", "ff_gate", "ff_up", "ff_out") if r in mats]
    return LayerWeights(
        layer=layer,
        q=_head_columns(mats["q"], dims.H, dims.d_head),
        k=_head_columns(mats["k"], dims.H_kv, dims.d_head),
        v=_head_columns(mats["v"], dims.H_kv, dims.d_head),
        o=np.ascontiguousarray(mats["o"].reshape(dims.H, dims.d_head, dims.N)),
        # Feed-forward matrices stay transposed views of the stored weights: BLAS reads either order,
        # and a transposing copy of a 768 x 3072 matrix costs as much as its Gram product.
        ff={"FF_" + r[3:]: mats[r] for r in ff_roles},
    )
