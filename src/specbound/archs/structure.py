"""What a family does beyond the matrices the bounds see, read from its spec's ``structure`` object
and config.json, so that every analysis can name it (``assumptions``; docs/theory.md section 3e).

None of these change a weight matrix: soft-capping, sliding windows, Gemma's attention temperature,
embedding scaling, ``(1 + w)`` norm gains, norms after each sublayer, a relative position bias and a
convolutional front-end; LayerScale is folded into the matrices it scales (exactly).  Each is either harmless
under the theorem's assumptions or covered by a bound that is not tightened by it; the entries say
which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import SpecboundError
from ..options import COUNT, SCALE, check_read

# spec "structure" keys: those naming a config.json key (its value is read) and those naming a fact
CONFIG_VALUED = (
    "attention_softcap",
    "final_softcap",
    "sliding_window",
    "attention_scalar",
    # Granite's multipliers (residual and attention folded into the matrices they scale), the
    # head's logit scale (Granite divides by logits_scaling, Cohere multiplies by logit_scale)
    "residual_multiplier",
    "attention_multiplier",
    "embedding_multiplier",
    "logit_divisor",
    "logit_scale",
    # gpt-oss's clamped SwiGLU: (clamp(u, -l, l) + 1) * g sigmoid(alpha g), g = min(gate, l)
    "swiglu_limit",
    "swiglu_alpha",
    # Llama 4's chunked attention: queries attend within their chunk of this many tokens
    "attention_chunk",
)
FIXED = {
    "embedding_scale": ("sqrt_hidden",),
    "norm_gain": ("weight", "one_plus_weight"),
    "sublayer_norms": ("before", "after", "before_and_after"),
    "position_bias": ("relative",),
    "layer_scale": ("folded",),
    "front_end": ("convolutional",),
    "attention_sinks": ("learned",),  # gpt-oss: a learned logit per head in the softmax's denominator
    # Llama 4: the NoPE layers' queries times 1 + attn_scale log(1 + floor((t + 1) / floor_scale))
    "temperature_tuning": ("llama4",),
    "key_selection": ("indexer",),  # DeepSeek-V3.2: a top-k indexer picks each query's keys
    # a vision tower's projector after its chain (docs/rotary.md section 9): Qwen's patch merger, Qwen3-VL's
    # merger and deepstack taps, Llama 4's pixel-shuffle adapter
    "projector": ("patch_merger", "deepstack", "pixel_shuffle"),
}


@dataclass(frozen=True)
class Structure:
    """One model's departures from a plain pre-norm block (each None / default when absent).

    Attributes
    ----------
    attention_softcap : float or None
        Gemma 2: attention logits become ``cap tanh(l / cap)``.
    final_softcap : float or None
        Gemma 2/3: the head's logits are capped the same way.
    sliding_window : int or None
        Some layers attend to the last ``W`` tokens only.
    attention_scalar : float or None
        Gemma: logits are scaled by ``query_pre_attn_scalar^(-1/2)`` instead of ``d_h^(-1/2)``.
    embedding_scale : str or None
        ``"sqrt_hidden"``: the embeddings are multiplied by ``sqrt(N)`` (Gemma).
    norm_gain : str
        ``"one_plus_weight"``: RMSNorm multiplies by ``1 + w`` (Gemma), else ``"weight"``.
    sublayer_norms : str
        Where each block normalises: ``before`` each sublayer (LLaMA), ``after`` it, before the
        residual sum (OLMo2), or both (Gemma 2/3).
    position_bias : str or None
        ``"relative"``: a learned relative position bias is added to the logits (MPNet, T5).
    layer_scale : str or None
        ``"folded"``: LayerScale vectors, folded into the OV and FF_out matrices (DINOv2).
    front_end : str or None
        ``"convolutional"``: a convolutional front-end makes the encoder's input rows (wav2vec2,
        HuBERT, Whisper).
    residual_multiplier : float or None
        Granite: each sublayer's output is multiplied by ``r`` before the residual sum; folded into
        the OV and FF_out matrices (:func:`folded_scales`).
    attention_multiplier : float or None
        Granite: the logit is ``m q k^T`` instead of ``q k^T / sqrt(d_h)``; ``m sqrt(d_h)`` is folded
        into the query factors (:func:`folded_scales`).
    embedding_multiplier : float or None
        Granite: the embeddings are multiplied by it (outside the complexity).
    logit_divisor, logit_scale : float or None
        The head's logits divided by ``logits_scaling`` (Granite) or multiplied by ``logit_scale``
        (Cohere): after the fixed head, outside the complexity.
    swiglu_limit, swiglu_alpha : float or None
        gpt-oss's clamped SwiGLU: the gate clamped above at ``l``, the up projection to ``[-l, l]``, the
        activation ``g sigmoid(alpha g)`` and the up branch offset by 1 (docs/theory.md 3n).
    attention_sinks : str or None
        ``"learned"``: each head has a learned logit in its softmax's denominator (gpt-oss; docs/theory.md 3n).
    attention_chunk : float or None
        Llama 4: the rotating layers attend within chunks of this many tokens (a mask).
    projector : str or None
        A vision tower's projector after the chain, outside the bound (``patch_merger``, ``deepstack``,
        ``pixel_shuffle``).
    temperature : float or None
        Llama 4 with ``attn_temperature_tuning``: the largest factor ``tau(t)`` its NoPE layers' queries are
        multiplied by at a position up to ``max_position_embeddings`` (:func:`temperature_max`).
    """

    attention_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    attention_scalar: float | None = None
    embedding_scale: str | None = None
    norm_gain: str = "weight"
    sublayer_norms: str = "before"
    position_bias: str | None = None
    layer_scale: str | None = None
    front_end: str | None = None
    key_selection: str | None = None  # "indexer": DeepSeek-V3.2's top-k indexer picks the keys (theory 3l)
    projector: str | None = None  # a vision tower's projector, outside the bound (docs/rotary.md section 9)
    residual_multiplier: float | None = None
    attention_multiplier: float | None = None
    embedding_multiplier: float | None = None
    logit_divisor: float | None = None
    logit_scale: float | None = None
    swiglu_limit: float | None = None
    swiglu_alpha: float | None = None
    attention_sinks: str | None = None
    attention_chunk: float | None = None
    temperature: float | None = None


def validate_structure(raw: Any) -> dict[str, str] | None:
    """The spec's ``structure`` object checked, or a message saying what is wrong (raised by the
    caller with the spec's origin)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not set(raw) <= set(CONFIG_VALUED) | set(FIXED):
        raise ValueError(
            f"'structure' must be an object with keys among {sorted(set(CONFIG_VALUED) | set(FIXED))}, found {raw!r}"
        )
    for key, value in raw.items():
        if key in FIXED and value not in FIXED[key]:
            raise ValueError(f"'structure' {key} must be one of {list(FIXED[key])}, found {value!r}")
        if key in CONFIG_VALUED and not isinstance(value, str):
            raise ValueError(f"'structure' {key} must name a config.json key, found {value!r}")
    return dict(raw)


_FIX = "fix the value in config.json (null or absent: not used by this model)"


def _read(config: dict, key: str | None, constraint, where: str):
    """The config value ``key`` holds, checked (:func:`~specbound.options.check_read`): None when the
    key is absent or null; a positive finite, bounded number (an integer for a count) otherwise, and
    one line for anything else (1e400 or Infinity, which JSON decodes to inf; true; a string)."""
    if not key:
        return None
    return check_read(key, config.get(key), None, constraint, where=where, fix=_FIX)


def model_structure(declared: dict[str, str] | None, config: dict[str, Any], where: str = "config.json") -> Structure:
    """The :class:`Structure` of one checkpoint: the spec's declared facts, and the config values its
    declared keys hold (a null or absent value: not used by this model; any other value must be a
    positive, finite, bounded number, an integer for the window)."""
    declared = declared or {}
    window = _read(config, declared.get("sliding_window"), COUNT, where)
    if window is not None and config.get("use_sliding_window") is False:
        window = None  # Qwen-style configs state a window they do not use
    return Structure(
        attention_softcap=_read(config, declared.get("attention_softcap"), SCALE, where),
        final_softcap=_read(config, declared.get("final_softcap"), SCALE, where),
        sliding_window=None if window is None else int(window),
        attention_scalar=_read(config, declared.get("attention_scalar"), SCALE, where),
        embedding_scale=declared.get("embedding_scale"),
        norm_gain=declared.get("norm_gain", "weight"),
        sublayer_norms=declared.get("sublayer_norms", "before"),
        position_bias=declared.get("position_bias"),
        layer_scale=declared.get("layer_scale"),
        front_end=declared.get("front_end"),
        key_selection=declared.get("key_selection"),
        projector=declared.get("projector"),
        attention_sinks=declared.get("attention_sinks"),
        temperature=temperature_max(config) if declared.get("temperature_tuning") else None,
        **{
            key: _read(config, declared.get(key), COUNT if key == "attention_chunk" else SCALE, where)
            for key in CONFIG_VALUED[4:]
        },
    )


def temperature_max(config: dict[str, Any]) -> float | None:
    """Llama 4's query temperature: at position ``t`` its NoPE layers multiply the queries by ``tau(t) = 1 +
    attn_scale log(1 + floor((t + 1) / floor_scale))``, monotone in ``t``, so its largest size over the
    positions ``0 .. P - 1`` (``P = max_position_embeddings``) is at an end (docs/theory.md 3n); None when
    ``attn_temperature_tuning`` is off."""
    if not config.get("attn_temperature_tuning"):
        return None
    scale, floor, positions = (config.get(k) for k in ("attn_scale", "floor_scale", "max_position_embeddings"))
    for key, value in (("attn_scale", scale), ("floor_scale", floor), ("max_position_embeddings", positions)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or (key != "attn_scale" and value <= 0)
        ):
            raise SpecboundError(
                f"config.json: {key}={value!r}: attn_temperature_tuning needs a finite attn_scale and "
                f"positive floor_scale and max_position_embeddings (the query temperature's size)"
            )
    ends = [1.0 + scale * math.log1p(math.floor((t + 1) / floor)) for t in (0, int(positions) - 1)]
    return max(abs(e) for e in ends)


def folded_scales(
    declared: dict[str, str] | None, config: dict[str, Any], d_head: int, *, rotates: bool = True
) -> tuple[float, float]:
    """``(q_scale, out_scale)``: the scalars folded exactly into the matrices they scale (docs/theory.md
    3e).  Granite's residual multiplier ``r`` multiplies each sublayer's output, so every OV and FF_out
    matrix becomes ``r W``; its attention multiplier ``m`` replaces the ``1/sqrt(d_h)`` that every family's
    QK leaves out (docs/spec.md section 1), so the query factors become ``m sqrt(d_h) W_Q``.  ``(1, 1)``
    for every other family.  Llama 4's query temperature (a NoPE layer's, ``rotates`` False) at its largest,
    ``max_t |tau(t)|``, scales the query factors: every QK quantity then bounds the logit's at every
    position up to the context."""
    st = model_structure(declared, config)
    q_scale = 1.0 if st.attention_multiplier is None else st.attention_multiplier * d_head**0.5
    if st.temperature is not None and not rotates:
        q_scale *= st.temperature
    return q_scale, 1.0 if st.residual_multiplier is None else st.residual_multiplier
