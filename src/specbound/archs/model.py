"""What the architecture stage hands to the compute stage: a model's dimensions, its rotary layout
and one layer's weights.  Plain data, shapes in the docstrings; nothing here reads a file or a
config (that is :mod:`.binding`, :mod:`.rotary` and :mod:`.extract`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

PAIRINGS = ("half", "interleaved")  # rotary: dims (i, i + rot/2) as HF's rotate_half, or (2i, 2i + 1)
# M-RoPE's assignment of the frequencies to the (time, height, width) axes: Qwen2-VL / Qwen2.5-VL's contiguous
# sections, Qwen3-VL's interleaved ones (archs.rotary.mrope_axes, docs/rotary.md section 7)
MROPE_KINDS = ("sections", "interleaved")
# ``max_positions`` of a rotary model whose config states no context length: every offset counts, so
# the exact maximum over offsets is never attempted and only the bounds valid for every rotation apply.
UNBOUNDED_POSITIONS = 1 << 62


@dataclass(frozen=True)
class MixtureOfExperts:
    """A sparse feed-forward block: ``experts`` routed experts of width ``d_ff`` each (the model's
    ``d_ff``), ``top_k`` of them chosen per token by a router, and optionally one always-on shared
    expert of width ``shared_d_ff`` (with a sigmoid gate when ``shared_gate``); docs/theory.md 3f."""

    experts: int
    top_k: int
    shared_d_ff: int | None = None
    shared_gate: bool = False
    # the layers holding the experts when not every layer does (Llama 4's interleaved dense and sparse
    # layers: the others a dense block of width ``dense_d_ff``); None: every layer
    layers: tuple[int, ...] | None = None
    dense_d_ff: int | None = None
    # a bound on the sum of the chosen experts' gates: 1 for a softmax over the top k (Mixtral, gpt-oss),
    # k for a sigmoid per chosen expert (Llama 4), times routed_scaling_factor (DeepSeek), docs/theory.md 3f;
    # and on one gate: 1, or routed_scaling_factor
    gate_sum: float = 1
    gate_max: float = 1.0
    scoring: str = "softmax"  # how the router scores experts: "softmax" or "sigmoid"

    def routed(self, layer: int) -> bool:
        """Whether layer ``layer`` holds the experts (else a dense block)."""
        return self.layers is None or layer in self.layers

    @property
    def branches(self) -> tuple[str, ...]:
        """The role suffix of each expert, in the order the matrices are listed: ``e0 .. e{E-1}``,
        then ``shared``."""
        return tuple(f"e{e}" for e in range(self.experts)) + (("shared",) if self.shared_d_ff else ())


@dataclass(frozen=True)
class LatentDims:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; docs/theory.md 3l): queries through the
    rank-``q_rank`` latent ``q_a_proj -> RMSNorm -> q_b_proj`` (or one ``q_proj`` when ``q_rank`` is
    None), keys and values through the shared rank-``kv_rank`` latent ``kv_a_proj_with_mqa -> RMSNorm ->
    kv_b_proj``, each head's key ``d_nope`` non-rotary features from the latent and ``d_rope`` rotary
    ones shared by every head straight from ``kv_a_proj_with_mqa``, values of ``d_v`` features.

    ``logit_scale``: YaRN's ``mscale^2`` multiplying the softmax scale beyond ``qk_head_dim^(-1/2)``
    (1 without it); ``rope_factor``: the rope scaling's attention factor ``a`` on ``cos`` and ``sin``
    (the rotary part of the logit times ``a^2``); ``q_eps``, ``kv_eps``: the latent norms' epsilons."""

    q_rank: int | None
    kv_rank: int
    d_nope: int
    d_rope: int
    d_v: int
    q_eps: float
    kv_eps: float
    logit_scale: float = 1.0
    rope_factor: float = 1.0

    @property
    def d_qk(self) -> int:
        return self.d_nope + self.d_rope

    def attention_parameters(self, N: int, H: int) -> int:
        """Stored weights of one layer's attention projections (the norms' gains not counted)."""
        query = N * H * self.d_qk if self.q_rank is None else N * self.q_rank + self.q_rank * H * self.d_qk
        return query + N * (self.kv_rank + self.d_rope) + self.kv_rank * H * (self.d_nope + self.d_v) + H * self.d_v * N


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
    stored: tuple[int, ...] | None = None  # stored layer used at each depth (shared layers); None: l
    # DeBERTa's disentangled attention: how many of the content-to-position and position-to-content
    # logit terms (0, 1 or 2) reuse each head's QK matrix against the relative position embeddings
    position_terms: int = 0
    # An encoder-decoder: its stacks in order (encoder, then decoder), their layers numbered on through
    # both (``L`` is their sum); None for one chain of layers
    stacks: "tuple[StackDims, ...] | None" = None
    moe: MixtureOfExperts | None = None  # a mixture-of-experts feed-forward block in every layer
    alibi: bool = False  # attention logits carry ALiBi's position biases (no change to any matrix)
    latent: LatentDims | None = None  # multi-head latent attention (d_head is then v_head_dim)
    # a constant added to a gated block's up branch before the product: gpt-oss's clamped SwiGLU computes
    # (clamp(u) + 1) * phi(g), whose ``+ 1`` is a path phi(g) W_d of its own (docs/theory.md 3n); 0: none
    up_offset: float = 0.0

    def stored_layer(self, layer: int) -> int:
        return layer if self.stored is None else self.stored[layer]

    def routed(self, layer: int) -> bool:
        """Whether layer ``layer``'s feed-forward block is the mixture of experts."""
        return self.moe is not None and self.moe.routed(layer)

    def layer_ff_matrices(self, layer: int) -> int:
        """Feed-forward matrices of layer ``layer`` (every expert's in a layer of experts)."""
        per_branch = 3 if self.feed_forward == "gated" else 2
        return per_branch * (len(self.moe.branches) if self.routed(layer) else 1)

    @property
    def ff_matrices(self) -> int:
        """Feed-forward matrices per layer (every expert's, with a mixture of experts); the most of any layer."""
        return max(self.layer_ff_matrices(layer) for layer in self._kinds())

    def layer_ff_parameters(self, layer: int) -> int:
        """Stored feed-forward weights of layer ``layer``: ``k N d_ff`` per expert (``k`` = 2 or 3)."""
        per_branch = 3 if self.feed_forward == "gated" else 2
        if not self.routed(layer):
            d_ff = self.d_ff if self.moe is None or self.moe.dense_d_ff is None else self.moe.dense_d_ff
            return per_branch * self.N * d_ff
        return per_branch * self.N * (self.moe.experts * self.d_ff + (self.moe.shared_d_ff or 0))

    @property
    def ff_parameters(self) -> int:
        """Stored feed-forward weights per layer (the most of any layer: a mixture's layers of experts)."""
        return max(self.layer_ff_parameters(layer) for layer in self._kinds())

    def _kinds(self) -> list[int]:
        """One layer of each kind (a layer of experts and a dense one), not all ``L``: L may be huge."""
        if self.moe is None or self.moe.layers is None:
            return [0]
        dense = next((l for l in range(min(self.L, len(self.moe.layers) + 1)) if l not in self.moe.layers), None)
        return ([self.moe.layers[0]] if self.moe.layers else []) + ([] if dense is None else [dense])

    def matrix_count(self) -> int:
        """How many matrices the analysis reports: per layer ``H`` QK and ``H`` OV heads (a decoder
        layer's cross-attention ``2 H`` more) and its feed-forward matrices."""
        if self.stacks is not None:
            return sum(p.dims.matrix_count() + (2 * p.dims.H * p.dims.L if p.cross else 0) for p in self.stacks)
        if self.moe is None or self.moe.layers is None:
            return self.L * (2 * self.H + self.ff_matrices)
        routed = sum(1 for l in set(self.moe.layers) if l < self.L)
        return (
            self.L * 2 * self.H
            + (routed and routed * self.layer_ff_matrices(self.moe.layers[0]))
            + (self.L - routed) * (3 if self.feed_forward == "gated" else 2)
        )

    def locate(self, layer: int) -> "tuple[StackDims | None, int]":
        """``(stack, index within it)`` of layer ``layer`` (``(None, layer)`` for one chain)."""
        if self.stacks is None:
            return None, layer
        for stack in self.stacks:
            if stack.first <= layer < stack.first + stack.dims.L:
                return stack, layer - stack.first
        raise IndexError(f"layer {layer} is outside the {self.L} layers of the stacks")


@dataclass(frozen=True)
class StackDims:
    """One stack of an encoder-decoder: its name, where its layers start in the model's numbering, its
    own dimensions (``dims.L`` its layers) and whether its layers hold cross-attention (the decoder:
    queries from its own stream, keys and values from the encoder's output)."""

    name: str
    first: int
    dims: ModelDims
    cross: bool = False


@dataclass(frozen=True)
class RotaryLayout:
    """Where and how fast a head's dimensions rotate.

    Attributes
    ----------
    rotary_dim : int
        Number of rotated dimensions ``rot`` (even, ``<= d_h``); the first ``rot`` dimensions of each
        head rotate, dimensions ``rot .. d_h - 1`` are left as they are (GPT-NeoX, GPT-J, Phi).
    pairing : {"half", "interleaved"}
        ``"half"``: dimensions ``i`` and ``i + rot/2`` form pair ``i`` (HF ``rotate_half``: LLaMA,
        Mistral, Qwen2, GPT-NeoX).  ``"interleaved"``: dimensions ``2i`` and ``2i + 1`` (GPT-J,
        llama.cpp's original layout).
    base : float
        ``rope_theta``; pair ``i`` turns by ``theta_i = base^(-2i/rot)`` per position.
    max_positions : int
        ``P``; offsets ``delta = t - s`` range over ``[-(P - 1), P - 1]``.
    scaling : str or None
        The config's ``rope_type`` when it is not the default (``linear``, ``dynamic``, ``yarn``,
        ``longrope``, ``llama3``; :mod:`.rotary` reads each as transformers computes it).
    inv_freq : tuple of float, optional
        The angular frequencies the model uses, ``(rot/2,)`` (a rope scaling's); None: the default
        ``base^(-2i/rot)``.
    attention_factor : float
        ``a``: the model multiplies ``cos`` and ``sin`` by it (YaRN, LongRoPE), so every logit
        matrix is ``a^2 W_Q^T M(delta) W_K``; 1 for the other types.  The compute stage folds it into
        the query and key factors (``a W_Q``, ``a W_K``).
    offset_invariant : bool
        Whether a query-key pair's rotation depends on its offset alone (so the exact maximum over
        offsets is the maximum over every pair).  False for LongRoPE: a cache filled with the short
        factor set and read with the long one rotates a pair by ``t theta_long - s theta_short``;
        only the bounds valid for every rotation are then reported.
    axes : tuple of int, optional
        Several position axes (M-RoPE's time, height and width; a vision tower's 2D patch rows and
        columns): ``axes[i]`` is the axis whose position rotates pair ``i``, ``(rot/2,)``, so an offset
        is an integer vector ``delta`` of ``n_axes`` components and pair ``i`` turns by
        ``delta[axes[i]] theta_i``.  None: one axis, an offset is the integer ``t - s`` (every model
        but those).
    grid : tuple of int, optional
        With ``axes``: the largest extent, in positions, of a block of tokens whose positions differ per
        axis (an image's ``(T, H, W)`` grid), ``(n_axes,)``; None: ``max_positions`` on every axis.
    shared_shift : bool
        With ``axes``: whether blocks also sit at a common shift ``d (1, ..., 1)`` of every axis (M-RoPE:
        a text token's position is ``(p, p, p)``, an image's grid starts at one), so the offsets are
        :attr:`offsets`' ``d 1 + e``; False: a single block (a vision tower's patch grid), offsets ``e``.
    grid_origin : bool
        With ``axes`` and no shared shift: one more token at angle 0, one position before the grid's first on
        every axis (Llama 4's class token, whose patches sit at positions ``1 .. g``): its offsets to the
        patches, ``+-p`` for ``1 <= p_a <= g_a``, join the grid's (docs/rotary.md section 9).
    """

    rotary_dim: int
    pairing: str
    base: float
    max_positions: int
    scaling: str | None = None
    inv_freq: tuple[float, ...] | None = None
    attention_factor: float = 1.0
    offset_invariant: bool = True
    axes: tuple[int, ...] | None = None
    grid: tuple[int, ...] | None = None
    shared_shift: bool = True
    grid_origin: bool = False

    def __post_init__(self):
        rot, p = self.rotary_dim, self.max_positions
        if isinstance(rot, bool) or not isinstance(rot, (int, np.integer)) or rot <= 0 or rot % 2:
            raise ValueError(f"rotary_dim must be a positive even integer, got {rot!r}")
        if self.pairing not in PAIRINGS:
            raise ValueError(f"rotary pairing must be one of {PAIRINGS}, got {self.pairing!r}")
        if (
            not isinstance(self.base, (int, float, np.floating, np.integer))
            or isinstance(self.base, bool)
            or not math.isfinite(self.base)
            or self.base <= 0
        ):
            raise ValueError(f"rotary base (rope_theta) must be a finite positive number, got {self.base!r}")
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p <= 0:
            raise ValueError(f"max_positions must be a positive integer, got {p!r}")
        if self.inv_freq is not None:
            freq = np.asarray(self.inv_freq, dtype=np.float64)
            if freq.shape != (rot // 2,) or not np.all(np.isfinite(freq)) or np.any(freq < 0):
                raise ValueError(
                    f"inv_freq must hold {rot // 2} finite non-negative frequencies, got {self.inv_freq!r}"
                )
        a = self.attention_factor
        if (
            isinstance(a, bool)
            or not isinstance(a, (int, float, np.floating, np.integer))
            or not math.isfinite(a)
            or a <= 0
        ):
            raise ValueError(f"attention_factor must be a finite positive number, got {a!r}")
        if self.axes is None:
            if self.grid is not None or self.grid_origin:
                raise ValueError("a rotary grid needs the pairs' axes (axes), got axes=None")
            return
        if self.grid_origin and (self.shared_shift or self.grid is None):
            raise ValueError("a class token before the grid (grid_origin) needs a grid without a shared shift")
        if len(self.axes) != rot // 2 or not all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in self.axes
        ):
            raise ValueError(
                f"axes must give a non-negative axis for each of the {rot // 2} rotary pairs, got {self.axes!r}"
            )
        if self.grid is not None and (
            len(self.grid) <= max(self.axes)
            or not all(isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g > 0 for g in self.grid)
        ):
            raise ValueError(
                f"grid must give a positive extent for each of at least {max(self.axes) + 1} axes, got {self.grid!r}"
            )
        if not self.offset_invariant:
            raise ValueError("several position axes with an offset-dependent rope type (LongRoPE) are not modelled")

    @property
    def thetas(self) -> np.ndarray:
        """Angular frequencies, shape ``(rot/2,)``: ``inv_freq`` when given, else ``base^(-2i/rot)``."""
        if self.inv_freq is not None:
            return np.asarray(self.inv_freq, dtype=np.float64)
        return float(self.base) ** (-np.arange(0, self.rotary_dim, 2, dtype=np.float64) / self.rotary_dim)

    @property
    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Index arrays ``(u, v)``, each of shape ``(rot/2,)``: dimensions ``u[i], v[i]`` form pair ``i``."""
        half = self.rotary_dim // 2
        i = np.arange(half)
        return (i, i + half) if self.pairing == "half" else (2 * i, 2 * i + 1)

    @property
    def n_axes(self) -> int:
        """Number of position axes: 1, or ``len(grid)`` (``max(axes) + 1`` without a grid)."""
        if self.axes is None:
            return 1
        return len(self.grid) if self.grid is not None else max(self.axes) + 1

    @property
    def extents(self) -> np.ndarray:
        """Per axis, the largest position difference plus one within a block: ``min(grid, P)``, shape
        ``(n_axes,)`` (``(P,)`` for one axis)."""
        p = self.max_positions
        if self.grid is None:
            return np.full(self.n_axes, p, dtype=np.int64)
        return np.minimum(np.asarray(self.grid, dtype=np.int64), p)

    @property
    def max_offset_count(self) -> int:
        """An upper bound on ``len(offsets)`` without building them (the exact-path budget): ``2P - 1`` for one
        axis (exact); with ``axes``, ``prod(2 g - 1)`` (``g`` the :attr:`extents`) without a shared shift, else
        ``min((2P - 1)^A, (2P - 1) prod(2 g - 1))``, exact when the grid spans the context; a class token adds
        ``2 (prod g - prod(g - 1))``."""
        p = int(self.max_positions)
        if self.axes is None:
            return 2 * p - 1
        box = math.prod(2 * int(g) - 1 for g in self.extents)
        if self.grid_origin:  # the class token's offsets +-p with some p_a = g_a (the others lie in the box)
            box += 2 * (math.prod(int(g) for g in self.extents) - math.prod(int(g) - 1 for g in self.extents))
        return min((2 * p - 1) ** self.n_axes, (2 * p - 1) * box) if self.shared_shift else box

    @property
    def offsets(self) -> np.ndarray:
        """All relative offsets.  One axis: ``delta = t - s``, ``-(P-1) .. P-1``, shape ``(2P - 1,)``.

        With ``axes``, integer vectors, shape ``(K, n_axes)``, lexicographically sorted: ``e`` with
        ``|e_a| <= g_a - 1`` (``g`` the :attr:`extents`: two tokens of one block, or of two blocks each
        within the grid), and with ``shared_shift`` every ``delta = d (1, ..., 1) + e`` with ``|delta_a| <=
        P - 1`` (docs/rotary.md section 7).  Build them only when :attr:`max_offset_count` is affordable."""
        p = int(self.max_positions)
        if self.axes is None:
            return np.arange(-(p - 1), p)
        g = self.extents
        if not self.shared_shift:
            if not self.grid_origin:
                return _integer_box(g - 1)
            corner = _integer_box(g - 1) + g  # every p with 1 <= p_a <= 2 g_a - 1: keep p_a <= g_a, some equal
            corner = corner[np.all(corner >= 1, axis=1) & np.all(corner <= g, axis=1) & np.any(corner == g, axis=1)]
            return np.unique(np.concatenate([_integer_box(g - 1), corner, -corner]), axis=0)
        if (2 * p - 1) ** (self.n_axes - 1) <= math.prod(2 * int(x) - 1 for x in g):
            # the cube is the smaller enumeration: delta = d 1 + e for some integer d iff the intervals
            # [delta_a - g_a + 1, delta_a + g_a - 1] meet
            cube = _integer_box(np.full(self.n_axes, p - 1, dtype=np.int64))
            return cube[np.max(cube - g + 1, axis=1) <= np.min(cube + g - 1, axis=1)]
        shifted = (np.arange(-(p - 1), p)[:, None, None] + _integer_box(g - 1)[None]).reshape(-1, self.n_axes)
        return np.unique(shifted[np.all(np.abs(shifted) <= p - 1, axis=1)], axis=0)

    def check_head_dim(self, d_head: int) -> None:
        if self.rotary_dim > d_head:
            raise ValueError(f"rotary_dim {self.rotary_dim} exceeds the head dimension {d_head}")


def _integer_box(radius: np.ndarray) -> np.ndarray:
    """Every integer vector ``e`` with ``|e_a| <= radius[a]``, lexicographically sorted, ``(prod(2 r + 1), A)``."""
    ranges = [np.arange(-int(r), int(r) + 1) for r in radius]
    return np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1).reshape(-1, len(ranges))


QK_NORM_SPANS = ("head", "all_heads")  # RMSNorm over each head's d_h features, or over the whole projection


@dataclass(frozen=True)
class QKNorm:
    """RMSNorm on the queries and keys before the rotation (Qwen3, Gemma 3: per head; OLMo2: over
    the whole projection): ``nu(u) = g * u / sqrt(mean(u^2) + eps)`` (docs/theory.md section 3d).

    Attributes
    ----------
    q_gain : ndarray, shape (H, d_head)
        The effective gain ``g`` of each query head's features (Gemma's ``1 + w`` already added).
    k_gain : ndarray, shape (H_kv, d_head)
    eps : float
        The norm's ``eps`` (> 0: it is what makes the logit Lipschitz).
    span : {"head", "all_heads"}
        ``head``: the mean runs over one head's ``d_h`` features; ``all_heads``: over all ``H d_h``
        (``H_kv d_h`` for keys) features of the projection.
    """

    q_gain: np.ndarray
    k_gain: np.ndarray
    eps: float
    span: str = "head"

    def __post_init__(self):
        if self.span not in QK_NORM_SPANS:
            raise ValueError(f"qk-norm span must be one of {QK_NORM_SPANS}, got {self.span!r}")
        if not (isinstance(self.eps, (int, float, np.floating)) and math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"qk-norm eps must be a finite positive number, got {self.eps!r}")


@dataclass
class LayerWeights:
    """One layer's weights in row-vector orientation, float64.

    Attributes
    ----------
    q, k, v : ndarray, shape (H, d_head, N) (k, v: (H_kv, d_head, N))
        Per-head factors ``W_Q^h``, ``W_K^h``, ``W_V^h``.
    o : ndarray, shape (H, d_head, N)
        Per-head ``W_O^h`` (rows of ``out.weight.T``).
    ff : mapping of str to ndarray
        Feed-forward matrices by role: ``FF_in`` (N, d_ff) and ``FF_out`` (d_ff, N), or
        ``FF_gate``, ``FF_up`` (N, d_ff) and ``FF_out``; from a checkpoint, a :class:`LazyMatrices`.
    cross : CrossWeights, optional
        A decoder layer's cross-attention (encoder-decoder models), else None.
    qk_norm : QKNorm, optional
        The normalisation of queries and keys (QK-norm families); None: the logit is ``q k^T``.
    """

    layer: int
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    ff: Mapping[str, np.ndarray]
    cross: "CrossWeights | None" = None
    qk_norm: QKNorm | None = None
    # multi-head latent attention's factors (``q``, ``k``, ``v``, ``o`` are then None)
    latent: "LatentWeights | None" = None


@dataclass
class LatentWeights:
    """One layer's multi-head latent attention factors (:class:`LatentDims`), float64, each as the
    model's ``Linear`` stores it (``out x in``; docs/theory.md 3l).

    Attributes
    ----------
    q_a : ndarray, shape (q_rank, N), or None without a query latent
    q_gain : ndarray, shape (q_rank,), or None
    q_b : ndarray, shape (H, d_nope + d_rope, q_rank), or (H, d_nope + d_rope, N) without a query latent
        Each head's query rows: its ``d_nope`` non-rotary ones, then its ``d_rope`` rotary ones.
    kv_a : ndarray, shape (kv_rank + d_rope, N)
        The latent's rows, then the shared rotary key's.
    kv_gain : ndarray, shape (kv_rank,)
    kv_b : ndarray, shape (H, d_nope + d_v, kv_rank)
        Each head's key rows, then its value rows.
    o : ndarray, shape (H, d_v, N)
        Each head's output rows (row-vector orientation, rows of ``o_proj.weight.T``).
    dims : LatentDims
    """

    q_a: np.ndarray | None
    q_gain: np.ndarray | None
    q_b: np.ndarray
    kv_a: np.ndarray
    kv_gain: np.ndarray
    kv_b: np.ndarray
    o: np.ndarray
    dims: LatentDims


@dataclass
class CrossWeights:
    """A decoder layer's cross-attention factors, shapes as :class:`LayerWeights`' ``q, k, v, o``:
    ``q`` acts on the decoder's stream, ``k`` and ``v`` on the encoder's output."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray


class LazyMatrices(Mapping):
    """Role -> matrix, each read from the checkpoint when accessed and never cached, so a layer's
    wide feed-forward matrices are held one at a time (a LLaMA-7B layer's three are 1 GB in float64).

    ``compact``: loaders of the same matrices as stored where that is exact in float32 (bf16, fp16,
    fp32 weights of a safetensors file): half the memory, for :func:`~specbound.compute.spectra.dense_spectrum`,
    which upcasts a block at a time; indexing always gives float64."""

    def __init__(
        self, loaders: dict[str, Callable[[], np.ndarray]], compact: dict[str, Callable[[], np.ndarray]] | None = None
    ):
        self._loaders = loaders
        self._compact = compact or {}

    def __getitem__(self, role: str) -> np.ndarray:
        return self._loaders[role]()

    def compact(self, role: str) -> np.ndarray:
        """The matrix of ``role`` in float32 where that holds it exactly, else in float64 (its values are
        those of ``self[role]`` either way)."""
        return self._compact.get(role, self._loaders[role])()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


@dataclass
class HeadUpdate:
    """The low-rank update of one role's per-head factors (a LoRA adapter, :mod:`.low_rank`):
    ``X^h - X0^h = u[h] @ v[h]``.

    Attributes
    ----------
    u : ndarray, shape (H, d_head, r)
    v : ndarray, shape (H, r, N)
    """

    u: np.ndarray
    v: np.ndarray

    def repeated(self, group: int) -> "HeadUpdate":
        """Each key/value head's update once per query head it serves (grouped-query attention)."""
        return self if group == 1 else HeadUpdate(np.repeat(self.u, group, axis=0), np.repeat(self.v, group, axis=0))


@dataclass
class LayerUpdates:
    """One layer's updates: per role (``q``, ``k``, ``v``, ``o``; a decoder layer's ``cross_q`` ...) a
    :class:`HeadUpdate` or None (unchanged), per feed-forward role (``FF_in``, ...) ``(L, R)`` with
    ``W - W0 = L @ R`` (row-vector orientation) or None."""

    heads: dict[str, HeadUpdate | None]
    ff: dict[str, tuple[np.ndarray, np.ndarray] | None]
    ff_shapes: dict[str, tuple[int, int]]  # each feed-forward matrix's (row-oriented) shape
