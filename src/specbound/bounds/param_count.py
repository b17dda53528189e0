"""Parameter counting: the number of stored weights in the analysed tensors.

    P = L (N H d_h [query] + 2 N H_kv d_h [key, value] + H d_h N [output] + k N d_ff [feed-forward])

with ``k = 2`` feed-forward matrices (in, out), or ``k = 3`` for a gated block (gate, up, down); a
mixture of experts counts ``k N d_ff`` for every routed expert and ``k N d_ff_shared`` for its shared
expert (the router's ``E x N`` weights are not analysed matrices and are not counted), a dense layer
between mixtures (DeepSeek's first layers) ``k N d_ff_dense``; an
encoder-decoder sums its stacks, a decoder layer's cross-attention counted like its self-attention.

Multi-head latent attention counts its stored projections (``q_a_proj``, ``q_b_proj`` or ``q_proj``,
``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``).  The stored factors are counted, not the ``N x N`` per-head
products (whose entries are not free
parameters).  Biases, normalisation parameters and embeddings are outside the analysed matrices and
are not counted.  Classical VC-type bounds scale as ``sqrt(P ln n / n)`` up to depth factors
(Bartlett et al., JMLR 2019, for piecewise-linear networks); softmax attention is outside their
scope, so no margin-bound form is attached: it is reported as a measure.
"""

from __future__ import annotations

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult


def parameter_count(measures: ModelMeasures) -> int:
    d = measures.dims
    if d.stacks is not None:  # an encoder-decoder: each stack's own, a decoder layer's cross-attention too
        return sum(_stack_count(part.dims, cross=part.cross) for part in d.stacks)
    return _stack_count(d)


def _stack_count(d, *, cross: bool = False) -> int:
    attention = d.N * d.H * d.d_head * 2 + d.N * d.H_kv * d.d_head * 2
    if d.latent is not None:  # multi-head latent attention: its stored projections (docs/theory.md 3l)
        attention = d.latent.attention_parameters(d.N, d.H)
    if d.moe is not None and d.moe.layers is not None:  # dense and expert layers (Llama 4)
        routed = sum(1 for l in set(d.moe.layers) if l < d.L)
        dense = next(l for l in range(d.L + 1) if l not in d.moe.layers)
        return (
            d.L * attention * (2 if cross else 1)
            + (routed and routed * d.layer_ff_parameters(d.moe.layers[0]))
            + (d.L - routed) * (0 if dense >= d.L else d.layer_ff_parameters(dense))
        )
    per_layer = attention * (2 if cross else 1) + d.ff_parameters
    return d.L * per_layer


def _compute(measures: ModelMeasures) -> BoundResult:
    return BoundResult(value=float(parameter_count(measures)))


BOUNDS = (
    Bound(
        name="param_count",
        title="Parameter count (analysed tensors)",
        reference="stored weights of the query/key/value/output and feed-forward tensors (measure only)",
        compute=_compute,
        group="baselines",
        needs=("dims",),
        distance=False,
    ),
)
