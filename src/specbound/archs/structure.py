"""What a family does beyond the matrices the bounds see, read from its spec's ``structure`` object
and config.json, so that every analysis can name it (``assumptions``; docs/theory.md section 3e).

None of these change a weight matrix: soft-capping, sliding windows, Gemma's attention temperature,
embedding scaling, ``(1 + w)`` norm gains, norms after each sublayer, a relative position bias and a
convolutional front-end; LayerScale is folded into the matrices it scales (exactly).  Each is either harmless
under the theorem's assumptions or covered by a bound that is not tightened by it; the entries say
which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# spec "structure" keys: those naming a config.json key (its value is read) and those naming a fact
CONFIG_VALUED = ("attention_softcap", "final_softcap", "sliding_window", "attention_scalar")
FIXED = {"embedding_scale": ("sqrt_hidden",), "norm_gain": ("weight", "one_plus_weight"),
         "sublayer_norms": ("before", "after", "before_and_after"), "position_bias": ("relative",),
         "layer_scale": ("folded",), "front_end": ("convolutional",)}


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


def validate_structure(raw: Any) -> dict[str, str] | None:
    """The spec's ``structure`` object checked, or a message saying what is wrong (raised by the
    caller with the spec's origin)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not set(raw) <= set(CONFIG_VALUED) | set(FIXED):
        raise ValueError(f"'structure' must be an object with keys among {sorted(set(CONFIG_VALUED) | set(FIXED))}, "
                         f"found {raw!r}")
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
    from ..options import check_read

    if not key:
        return None
    return check_read(key, config.get(key), None, constraint, where=where, fix=_FIX)


def model_structure(declared: dict[str, str] | None, config: dict[str, Any], where: str = "config.json") -> Structure:
    """The :class:`Structure` of one checkpoint: the spec's declared facts, and the config values its
    declared keys hold (a null or absent value: not used by this model; any other value must be a
    positive, finite, bounded number, an integer for the window)."""
    from ..options import COUNT, SCALE

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
    )
