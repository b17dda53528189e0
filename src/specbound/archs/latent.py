"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; docs/theory.md 3l): its dimensions from
config.json, its tensors accounted for, and one layer's factors read (:class:`~.model.LatentWeights`).

The latent norms' gains and epsilons and the logit's scale (YaRN's ``mscale^2``, the rope scaling's
attention factor on the shared rotary key) are read here; what they do to the bounds is
:mod:`specbound.compute.latent`'s.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import SpecboundError
from ..io import Checkpoint
from .model import LatentDims, LatentWeights, ModelDims
from .rotary import parse_rotary, rope_settings
from .spec import ArchSpec, TensorRule


def _yarn_mscale(scale: float, mscale: float) -> float:
    """DeepSeek's ``yarn_get_mscale``: ``0.1 mscale ln(scale) + 1`` for ``scale > 1``, else 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def latent_dims(spec: ArchSpec, config: dict) -> LatentDims:
    """The latent attention's dimensions, epsilons and logit scales (:class:`LatentDims`)."""
    rule = spec.latent

    def value(field: str, optional: bool = False) -> int | None:
        keys = rule.config[field]
        v = next((config[k] for k in keys if config.get(k) is not None), None)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SpecboundError(
                f"config.json needs a positive integer {' or '.join(keys)} for the {spec.family} "
                f"family's latent attention, found {v!r}"
            )
        return v

    q_rank = value("q_rank", optional=True)
    kv_rank, d_nope, d_rope, d_v = value("kv_rank"), value("d_nope"), value("d_rope"), value("d_v")
    if d_rope % 2:
        raise SpecboundError(f"config.json: the rotary key has {d_rope} features; rotary pairs need an even number")
    eps = next((config[k] for k in rule.eps if config.get(k) is not None), rule.eps_default)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        raise SpecboundError(
            f"config.json: the latent norms' epsilon {eps!r} must be positive: without it the "
            f"normalised latent has no Lipschitz constant (docs/theory.md 3l)"
        )
    try:
        kind, params = rope_settings(config, spec.rotary_options.get("rope_type_aliases"))
        layout = parse_rotary(
            {**config, "head_dim": d_rope, "partial_rotary_factor": None},
            d_rope,
            spec.rotary or "interleaved",
            aliases=spec.rotary_options.get("rope_type_aliases"),
        )
    except ValueError as exc:
        raise SpecboundError(f"config.json: the rotary key's settings cannot be read: {exc}") from None
    scale = 1.0
    if kind != "default" and params.get("mscale_all_dim"):
        factor = params.get("factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            raise SpecboundError(f"config.json: the rope scaling's factor {factor!r} must be a positive number")
        scale = _yarn_mscale(float(factor), float(params["mscale_all_dim"])) ** 2
    return LatentDims(
        q_rank=q_rank,
        kv_rank=kv_rank,
        d_nope=d_nope,
        d_rope=d_rope,
        d_v=d_v,
        q_eps=float(eps),
        kv_eps=float(eps),
        logit_scale=scale,
        rope_factor=float(layout.attention_factor),
    )


def _rule(spec: ArchSpec, which: str) -> TensorRule:
    return TensorRule(which, spec.latent.names[which], "linear")


def latent_tensors(spec: ArchSpec, dims: ModelDims) -> dict[str, tuple[int, ...]]:
    """Each latent tensor's stored shape (``Linear`` ``(out, in)``; a norm's gain ``(n,)``), by name key."""
    lat, N, H = dims.latent, dims.N, dims.H
    shapes = {
        "kv_a": (lat.kv_rank + lat.d_rope, N),
        "kv_a_norm": (lat.kv_rank,),
        "kv_b": (H * (lat.d_nope + lat.d_v), lat.kv_rank),
    }
    if lat.q_rank is None:
        shapes["q"] = (H * lat.d_qk, N)
    else:
        shapes.update({"q_a": (lat.q_rank, N), "q_a_norm": (lat.q_rank,), "q_b": (H * lat.d_qk, lat.q_rank)})
    return shapes


def latent_rules(spec: ArchSpec, dims: ModelDims, layer: int, prefix: str = "") -> list:
    """The latent projections of stored layer ``layer`` as :func:`~.binding.layer_rules` entries ``(name,
    what, rule, row-oriented shape)`` (the norms' gains: :func:`latent_gain_shapes`)."""
    return [
        (_rule(spec, which).name_for(layer, prefix), f"the latent attention's {which}", _rule(spec, which), shape[::-1])
        for which, shape in latent_tensors(spec, dims).items()
        if len(shape) == 2
    ]


def latent_config_said(spec: ArchSpec, dims: ModelDims) -> str:
    """The latent dimensions as config.json states them, for messages: ``q_lora_rank=12, kv_lora_rank=10, ...``."""
    lat = dims.latent
    values = {"q_rank": lat.q_rank, "kv_rank": lat.kv_rank, "d_nope": lat.d_nope, "d_rope": lat.d_rope, "d_v": lat.d_v}
    return ", ".join(f"{spec.latent.config[field][0]}={value}" for field, value in values.items())


def latent_gain_shapes(spec: ArchSpec, dims: ModelDims, prefix: str, layers) -> dict[str, tuple]:
    """Every stored layer's latent norm gains: name -> (what, layer, expected shape)."""
    return {
        spec.latent.name_for(which, layer, prefix): (f"the latent attention's {which} gain", layer, shape)
        for layer in layers
        for which, shape in latent_tensors(spec, dims).items()
        if len(shape) == 1
    }


def read_latent(
    spec: ArchSpec, ckpt: Checkpoint, dims: ModelDims, prefix: str, stored: int, o: np.ndarray
) -> LatentWeights:
    """Stored layer ``stored``'s latent attention factors; ``o`` its ``(H d_v, N)`` row-oriented output."""
    lat, H = dims.latent, dims.H

    def read(which: str) -> np.ndarray:
        return np.asarray(ckpt.read(spec.latent.name_for(which, stored, prefix)), dtype=np.float64)

    q_a = q_gain = None
    if lat.q_rank is None:
        q_b = read("q").reshape(H, lat.d_qk, dims.N)
    else:
        q_a, q_gain = read("q_a"), read("q_a_norm").reshape(-1)
        q_b = read("q_b").reshape(H, lat.d_qk, lat.q_rank)
    return LatentWeights(
        q_a=q_a,
        q_gain=q_gain,
        q_b=q_b,
        kv_a=read("kv_a"),
        kv_gain=read("kv_a_norm").reshape(-1),
        kv_b=read("kv_b").reshape(H, lat.d_nope + lat.d_v, lat.kv_rank),
        o=np.ascontiguousarray(o.reshape(H, lat.d_v, dims.N)),
        dims=lat,
    )


def latent_tensor_names(spec: ArchSpec, dims: ModelDims, prefix: str, stored: int, h: int) -> tuple[str, str]:
    """``(QK, OV)`` tensor names of head ``h`` (:func:`~.extract.matrix_tensor_names`): the shared latent
    projections and norms whole, the head's slices of ``q_b`` (``q``), ``kv_b`` and ``o_proj``."""
    lat = dims.latent
    name = lambda which: spec.latent.name_for(which, stored, prefix)  # noqa: E731
    kv_b = lat.d_nope + lat.d_v
    if lat.q_rank is None:
        query = f"{name('q')}[{h * lat.d_qk}:{(h + 1) * lat.d_qk}]"
    else:
        query = f"{name('q_a')}|{name('q_a_norm')}|{name('q_b')}[{h * lat.d_qk}:{(h + 1) * lat.d_qk}]"
    qk = f"{query}|{name('kv_a')}|{name('kv_a_norm')}|{name('kv_b')}[{h * kv_b}:{h * kv_b + lat.d_nope}]"
    o = spec.tensors["o"].name_for(stored, prefix)
    ov = (
        f"{name('kv_a')}[0:{lat.kv_rank}]|{name('kv_a_norm')}|{name('kv_b')}[{h * kv_b + lat.d_nope}:{(h + 1) * kv_b}]"
        f"|{o}[{h * lat.d_v}:{(h + 1) * lat.d_v}]"
    )
    return qk, ov
