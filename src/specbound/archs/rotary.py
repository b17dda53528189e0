"""A checkpoint's rotary layout: the family spec says whether (and how a head's dimensions pair up),
config.json says with which base, how many dimensions, over how many positions and with which rope
scaling (docs/rotary.md).

Every ``rope_type`` transformers knows is read as its ``modeling_rope_utils`` computes it: the
frequencies (``default``, ``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``) and the
attention factor ``a`` that multiplies ``cos`` and ``sin`` (YaRN, LongRoPE).  Any other type is
refused: its angles are not modelled, and analysing it as plain rope would be silently wrong.

The mathematics of rotary heads is :mod:`specbound.compute.rotary`; this module only reads settings.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import SpecboundError
from ..options import MAX_COUNT
from .model import MROPE_KINDS, PAIRINGS, UNBOUNDED_POSITIONS, RotaryLayout
from .spec import ArchSpec

# config.json keys stating the context length, in the order they are read
POSITION_KEYS = ("max_position_embeddings", "n_positions")
# HF's default rope_theta, used when the config names no base
DEFAULT_BASE = 10000.0
# The rope types whose angles and attention factor are modelled (transformers' ROPE_INIT_FUNCTIONS
# and its "default"); the config names one in rope_parameters["rope_type"] or rope_scaling["type"].
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# rope types that take the pretraining context from original_max_position_embeddings
_WITH_ORIGINAL_CONTEXT = ("yarn", "longrope", "llama3")


def rotary_layout(spec: ArchSpec, config: dict[str, Any], d_head: int, *, where: str) -> RotaryLayout | None:
    """The rotary layout of a family that declares one (``"rotary"`` in its spec, not switched off
    by its ``off_when`` config key: Falcon's ``alibi``), else None; for a model whose layers differ
    (Gemma 3's local and global layers), the first layer's (see :func:`rotary_layouts`).

    A config that states no context length (an ONNX export without config.json, say) gets
    ``max_positions = UNBOUNDED_POSITIONS``: every offset counts, so only the bounds valid for every
    rotation apply.  ``where`` names the checkpoint in the one-line error a bad setting raises.
    """
    layouts = rotary_layouts(spec, config, d_head, 1, where=where)
    return None if layouts is None else layouts[0]


def rotary_layouts(
    spec: ArchSpec, config: dict[str, Any], d_head: int, num_layers: int, *, where: str
) -> tuple[RotaryLayout | None, ...] | None:
    """Each layer's rotary layout, ``(L,)``, None at a layer without rotary positions (the spec's
    ``nope``: SmolLM3's and Llama 4's NoPE layers, Cohere2's and EXAONE 4's global layers), or None for
    a family without ``"rotary"`` (or whose ``off_when`` config key switches it off, or whose every
    layer is unrotated).

    Layers differ when config.json gives ``rope_parameters`` per layer type (transformers 5's
    ``{"full_attention": {...}, "sliding_attention": {...}}`` with ``layer_types``), or, for a family
    whose spec describes its ``legacy_layer_types`` (Gemma 3's ``rope_local_base_freq`` and
    ``sliding_window_pattern``), in the older flat form.
    """
    pairing = spec.rotary_for(config)
    if pairing is None:
        return None
    if "grid" in spec.rotary_options:  # 2D rotary over a vision tower's patch grid
        try:
            return grid_layouts(spec.rotary_options["grid"], config, d_head, pairing, num_layers)
        except ValueError as exc:
            raise SpecboundError(
                f"config.json of {where}: {exc}; fix the vision settings (image_size, patch_size, "
                f"rope_parameters, window_size, spatial_merge_size, fullatt_block_indexes)"
            ) from None
    try:
        configs = _per_layer_configs(config, num_layers, spec.rotary_options.get("legacy_layer_types"))
        aliases = spec.rotary_options.get("rope_type_aliases", {})
        parsed: dict[int, RotaryLayout] = {}
        out = []
        rotated = nope_flags(spec.rotary_options.get("nope"), config, num_layers)
        mrope = spec.rotary_options.get("mrope")
        for cfg, rope in zip(configs, rotated):
            key = id(cfg)
            if rope and key not in parsed:
                parsed[key] = parse_rotary(cfg, d_head, pairing, aliases=aliases, mrope=mrope)
            out.append(parsed[key] if rope else None)
        return None if all(r is None for r in out) else tuple(out)
    except ValueError as exc:
        raise SpecboundError(
            f"config.json of {where}: {exc}; fix the rotary settings (rope_theta, "
            f"rope_parameters / rope_scaling, max_position_embeddings, partial_rotary_factor / "
            f"rotary_pct)"
        ) from None


def nope_flags(rule: dict[str, Any] | None, config: dict[str, Any], num_layers: int) -> list[bool]:
    """Whether each layer rotates its queries and keys, by the spec's ``nope`` rule (every layer
    without one).  ``flags``: config.json's list of 0/1 (SmolLM3, Llama 4 ``no_rope_layers``: 0 = no
    rotation), or when absent every ``interval``-th layer unrotated, as the model's config builds it;
    ``layer_types``: the listed types unrotated (Cohere2, EXAONE 4: ``full_attention``), every layer or
    none (``without_window``) when the window key is null."""
    if rule is None:
        return [True] * num_layers
    if "flags" in rule:
        flags = config.get(rule["flags"])
        if flags is None or flags == []:  # absent or empty: the config builds it from the interval (Llama 4)
            interval = config.get(rule.get("interval_key", ""), rule.get("interval_default"))
            if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
                raise ValueError(
                    f"{rule['flags']} is missing and {rule.get('interval_key')}={interval!r} is not a "
                    f"positive integer: which layers rotate is unknown"
                )
            return [(i + 1) % interval != 0 for i in range(num_layers)]
        if (
            not isinstance(flags, list)
            or len(flags) < num_layers
            or not all(f in (0, 1) and not isinstance(f, float) for f in flags[:num_layers])
        ):
            raise ValueError(
                f"{rule['flags']} must list 0 or 1 (1: the layer rotates) for each of the {num_layers} "
                f"layers, got {flags!r}"
            )
        return [bool(f) for f in flags[:num_layers]]
    if config.get(rule["window_key"]) is None:
        return [rule["without_window"] == "rope"] * num_layers
    types = layer_types(config, num_layers)
    if types is None and "pattern_key" in rule:
        pattern = config.get(rule["pattern_key"], rule.get("pattern_default"))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ValueError(
                f"layer_types is missing and {rule['pattern_key']}={pattern!r} is not a positive integer: "
                f"which layers rotate is unknown"
            )
        return [(i + 1) % pattern != 0 for i in range(num_layers)]
    if types is None:
        raise ValueError(
            f"layer_types must name the type of each of the {num_layers} layers (the "
            f"{', '.join(rule['layer_types'])} layers have no rotary positions), got None"
        )
    return [t not in rule["layer_types"] for t in types]


def layer_types(config: dict, num_layers: int) -> list[str] | None:
    """config.json's ``layer_types``, its first ``num_layers`` entries, each a string (``"sliding_attention"``); None
    when absent or null; anything else (a list too short, an entry that is a list, a number or null) is refused
    before a type is looked up (a list entry is no key of ``rope_parameters``)."""
    types = config.get("layer_types")
    if types is None:
        return None
    if (
        not isinstance(types, list)
        or len(types) < num_layers
        or not all(isinstance(t, str) for t in types[:num_layers])
    ):
        shown = repr(types) if len(repr(types)) <= 200 else repr(types)[:200] + "..."
        raise ValueError(
            f'layer_types must list a type name (a string such as "full_attention") for each of the '
            f"{num_layers} layers, got {shown}"
        )
    return types[:num_layers]


def _nested(params: Any) -> bool:
    """Whether ``rope_parameters`` is given per layer type (every value a dict or None)."""
    return (
        isinstance(params, dict)
        and bool(params)
        and "rope_theta" not in params
        and "rope_type" not in params
        and all(isinstance(v, dict) or v is None for v in params.values())
    )


def _per_layer_configs(config: dict, num_layers: int, legacy: dict | None) -> list[dict]:
    """One config dict per layer whose ``rope_parameters`` is that layer's (the same object for
    layers of one type, so each type is parsed once)."""
    params = config.get("rope_parameters")
    types = layer_types(config, num_layers)
    if _nested(params):
        if types is None:
            raise ValueError(
                f"rope_parameters is given per layer type ({sorted(params)}) but layer_types is missing "
                f"for {num_layers} layers"
            )
        missing = sorted({t for t in types if not isinstance(params.get(t), dict)}, key=str)
        if missing:
            raise ValueError(
                f"layer_types names {missing}, which rope_parameters ({sorted(params)}) does not "
                f"describe (a layer without rotary positions is not supported)"
            )
        # each type's parameters are complete (transformers merges a flat rope_scaling into them)
        flat = {k: v for k, v in config.items() if k != "rope_scaling"}
        by_type = {t: {**flat, "rope_parameters": params[t]} for t in set(types)}
        return [by_type[t] for t in types]
    if legacy is None or params is not None:
        return [config] * num_layers
    pattern = config.get(legacy["pattern_key"], legacy["pattern_default"])
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ValueError(f"{legacy['pattern_key']} must be a positive integer, got {pattern!r}")
    local_theta = config.get(legacy["local_theta_key"], legacy["local_theta_default"])
    # HF's conversion of the older form: the top-level rope_theta and rope_scaling are the global
    # layers', the local layers rotate by rope_local_base_freq with no scaling
    global_cfg = {
        **config,
        "rope_theta": config.get(legacy.get("global_theta_key", "rope_theta"), legacy["global_theta_default"]),
    }
    local_cfg = {k: v for k, v in config.items() if k not in ("rope_scaling", "rope_theta")}
    local_cfg["rope_theta"] = local_theta
    if types is not None:
        pick = [t == legacy["global_type"] for t in types]
    else:
        first = legacy.get("global_layer", "last") == "first"
        pick = [(i if first else i + 1) % pattern == 0 for i in range(num_layers)]
    return [global_cfg if g else local_cfg for g in pick]


def _first(config: dict, *keys):
    for key in keys:
        if config.get(key) is not None:
            return key, config[key]
    return None, None


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    return float(value)


def _positive(params: dict, key: str, what: str, default=None) -> float:
    value = params.get(key, default)
    if value is None:
        raise ValueError(f"{what} needs {key} in rope_parameters")
    value = _number(value, f"rope_parameters {key}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"rope_parameters {key} must be a finite positive number, got {value!r}")
    return value


def rope_settings(config: dict, aliases: dict[str, str] | None = None) -> tuple[str, dict]:
    """``(rope_type, params)``: the rope scaling's type (one of :data:`ROPE_TYPES`) and its parameters,
    from ``rope_parameters`` (transformers 5) or ``rope_scaling`` (older configs), the former first.

    ``aliases`` map a family's own names to the types (Phi-3's ``"su"``).  Any other type raises.
    """
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be a dict, got {params!r}")
    if _nested(params):
        raise ValueError(
            "rope_parameters is given per layer type "
            f"({sorted(params)}): pass the sub-dict of the layer's type merged into the config"
        )
    scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict (with rope_type / type), got {scaling!r}")
    merged = {**(scaling or {}), **(params or {})}
    kind = merged.get("rope_type") or merged.get("type") or "default"
    if isinstance(params, dict) and params.get("rope_type") in (None, "default") and scaling:
        kind = scaling.get("rope_type") or scaling.get("type") or kind  # rope_scaling names the scaling
    kind = (aliases or {}).get(kind, kind)
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"rope type {kind!r} is not one specbound models ({', '.join(ROPE_TYPES)}): its angles "
            f"would be analysed as another type's"
        )
    return str(kind), merged


def _original_context(config: dict, params: dict, kind: str) -> int:
    """``original_max_position_embeddings`` as transformers' ``standardize_rope_params`` takes it: a
    top-level key wins (Phi-3), then the rope parameters', then ``max_position_embeddings``."""
    value = (
        config.get("original_max_position_embeddings")
        or params.get("original_max_position_embeddings")
        or config.get("max_position_embeddings")
    )
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(
            f"rope type {kind!r} needs a positive integer original_max_position_embeddings "
            f"(or max_position_embeddings), got {value!r}"
        )
    return int(value)


def rope_frequencies(
    kind: str, params: dict, config: dict, base: float, rot: int
) -> tuple[np.ndarray | None, float, np.ndarray | None]:
    """``(inv_freq, attention_factor, short_inv_freq)`` of one rope type, in float64, by the formulas
    of transformers' ``modeling_rope_utils`` (which evaluates them in float32).

    ``inv_freq`` is None for the default frequencies ``base^(-2i/rot)``; ``short_inv_freq`` is
    LongRoPE's set for sequences up to ``original_max_position_embeddings`` (``inv_freq`` is then
    the long set), else None.

    ``dynamic`` (NTK): transformers recomputes the base for a sequence of length
    ``seq_len > max_position_embeddings`` only (``base (factor seq_len / P - (factor - 1))^(rot /
    (rot - 2))``, which is ``base`` at ``seq_len = P``), so within the context every sequence uses
    the default frequencies.
    """
    exponents = np.arange(0, rot, 2, dtype=np.float64) / rot
    default = base**-exponents
    if kind in ("default", "dynamic"):
        return None, 1.0, None
    if kind == "linear":
        return default / _positive(params, "factor", "linear rope scaling"), 1.0, None
    mpe = config.get("max_position_embeddings")
    original = _original_context(config, params, kind)
    if kind == "llama3":
        factor = _positive(params, "factor", "llama3 rope scaling")
        low = _positive(params, "low_freq_factor", "llama3 rope scaling")
        high = _positive(params, "high_freq_factor", "llama3 rope scaling")
        wavelen = 2 * math.pi / default
        scaled = np.where(wavelen > original / low, default / factor, default)
        if high == low:  # Llama 4 Scout: no band to smooth over, a wavelength is scaled or not
            if np.any(wavelen == original / low):  # transformers' smoothing is 0/0 there (NaN)
                raise ValueError(
                    "llama3 rope scaling with high_freq_factor == low_freq_factor puts a rotary "
                    "wavelength exactly on the boundary, where the smoothing is undefined"
                )
            return scaled, 1.0, None
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original / high) & ~(wavelen > original / low)
        return np.where(medium, smoothed, scaled), 1.0, None
    factor = params.get("factor")
    if factor is None:  # DeepSeek-V3, Phi-3: the ratio of the context lengths
        if not isinstance(mpe, (int, np.integer)) or isinstance(mpe, bool):
            raise ValueError(f"rope type {kind!r} without a factor needs max_position_embeddings")
        factor = mpe / original
    factor = _number(factor, "rope_parameters factor")
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"rope_parameters factor must be a finite positive number, got {factor!r}")
    given = params.get("attention_factor")
    if given is not None:
        given = _positive(params, "attention_factor", f"{kind} rope scaling")
    if kind == "yarn":

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        if given is not None:
            attention = given
        elif m and m_all:
            attention = float(mscale(factor, _number(m, "mscale")) / mscale(factor, _number(m_all, "mscale_all_dim")))
        else:
            attention = mscale(factor)
        beta_fast = _number(params.get("beta_fast") or 32, "beta_fast")
        beta_slow = _number(params.get("beta_slow") or 1, "beta_slow")

        def correction_dim(rotations):
            return rot * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
        if params.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, rot - 1)
        if lo == hi:
            hi += 0.001  # transformers' guard against a zero-width ramp
        ramp = np.clip((np.arange(rot // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrapolation = 1 - ramp
        return (default / factor) * (1 - extrapolation) + default * extrapolation, attention, None
    # longrope
    if given is not None:
        attention = given
    else:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    sets = []
    for key in ("long_factor", "short_factor"):
        ext = params.get(key)
        if not isinstance(ext, (list, tuple)) or len(ext) != rot // 2:
            raise ValueError(
                f"longrope needs rope_parameters {key} with {rot // 2} numbers (one per rotary pair), got {ext!r}"
            )
        ext = np.array([_number(e, key) for e in ext])
        if not np.all(np.isfinite(ext)) or np.any(ext <= 0):
            raise ValueError(f"rope_parameters {key} must hold finite positive numbers")
        sets.append(default / ext)
    return sets[0], attention, sets[1]


def mrope_axes(sections, half: int, kind: str) -> tuple[int, ...]:
    """The position axis (0 time, 1 height, 2 width) of each of the ``half = rot/2`` frequencies under
    M-RoPE's ``mrope_section``, as transformers 5 recomposes them (``recomposition_frequencies``).

    ``"sections"`` (Qwen2-VL, Qwen2.5-VL): the frequencies split into consecutive runs of the sections'
    lengths, run ``j`` on axis ``j mod 3``; the lengths must add up to ``half``.  ``"interleaved"``
    (Qwen3-VL): frequency ``i`` is on the height axis when ``i = 1 mod 3`` and ``i < 3 sections[1]``, on
    the width axis when ``i = 2 mod 3`` and ``i < 3 sections[2]``, else on the time axis (``sections[0]``
    is not read).  Pair ``i`` of the head (dimensions ``i`` and ``i + rot/2``) turns with frequency ``i``.
    """
    if kind not in MROPE_KINDS:
        raise ValueError(f"M-RoPE kind must be one of {MROPE_KINDS}, got {kind!r}")
    if (
        not isinstance(sections, (list, tuple))
        or not sections
        or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in sections)
    ):
        raise ValueError(f"mrope_section must list non-negative integers, got {sections!r}")
    if kind == "sections":
        if sum(sections) != half:
            raise ValueError(
                f"mrope_section {list(sections)} adds up to {sum(sections)}, not to the {half} rotary "
                f"frequencies (head_dim / 2)"
            )
        return tuple(j % 3 for j, length in enumerate(sections) for _ in range(length))
    if len(sections) != 3:
        raise ValueError(f"interleaved mrope_section must give 3 lengths (time, height, width), got {sections!r}")
    axes = [0] * half
    for axis in (1, 2):
        for i in range(axis, min(3 * sections[axis], half), 3):
            axes[i] = axis
    return tuple(axes)


def parse_rotary(
    config: dict,
    d_head: int,
    pairing: str,
    *,
    aliases: dict[str, str] | None = None,
    mrope: dict[str, Any] | None = None,
) -> RotaryLayout:
    """The rotary layout of a HF-style ``config.json`` dict of a rotary family.

    Keys read: ``rope_theta`` / ``rotary_emb_base`` / ``rope_parameters["rope_theta"]`` (default
    10000); ``partial_rotary_factor`` / ``rotary_pct`` (fraction of ``d_head``, ``rot =
    int(d_head * f)`` as HF computes it) or ``rotary_dim`` (GPT-J, an absolute count);
    ``max_position_embeddings`` / ``n_positions`` (neither key: ``UNBOUNDED_POSITIONS``);
    ``head_dim`` (must equal ``d_head``); the rope type and its parameters from
    ``rope_parameters`` / ``rope_scaling`` (:func:`rope_settings`, :func:`rope_frequencies`);
    ``rope_freq_factors`` (llama.cpp's ``rope_freqs`` tensor, put there by the GGUF reader: each
    frequency divided by its factor).

    Parameters
    ----------
    config : dict
        The parsed ``config.json`` (or ``PretrainedConfig.to_dict()``).
    d_head : int
        The head dimension ``d_h``.
    pairing : {"half", "interleaved"}
        The family spec's pair layout (``"half"`` is HF's ``rotate_half``).
    aliases : dict, optional
        A family's own names for rope types (the spec's ``rope_type_aliases``).
    mrope : dict, optional
        The spec's ``mrope`` (``{"kind": "sections" | "interleaved", "default_section": [t, h, w]}``):
        the frequencies go to the position axes by the rope parameters' ``mrope_section`` (the default
        when absent, as transformers does), :func:`mrope_axes`; every offset vector of the context counts
        (``grid = None``, docs/rotary.md section 7).

    Raises
    ------
    ValueError
        One line naming the offending key for values that make no sense (non-positive base or
        positions, a fraction outside ``(0, 1]``, an odd or oversized rotary dimension, a
        ``head_dim`` that contradicts ``d_head``, an unknown pairing or rope type, a rope type's
        missing parameter, positions stated as ALiBi or absolute).
    """
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    if isinstance(d_head, bool) or not isinstance(d_head, (int, np.integer)) or d_head <= 0:
        raise ValueError(f"d_head must be a positive integer, got {d_head!r}")
    if pairing not in PAIRINGS:
        raise ValueError(f"rotary pairing must be one of {PAIRINGS}, got {pairing!r}")
    if config.get("alibi") or config.get("position_embedding_type") in ("absolute", "alibi", "learned"):
        stated = (
            "alibi: true" if config.get("alibi") else f"position_embedding_type={config['position_embedding_type']!r}"
        )
        raise ValueError(
            f"{stated} says the positions are not rotary, but the family spec declares rotary "
            f'position embeddings; pass a spec without "rotary" (--arch-spec FILE)'
        )
    kind, params = rope_settings(config, aliases)

    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != d_head:
        raise ValueError(f"config head_dim={head_dim!r} contradicts d_head={d_head}")

    key, base = _first(params, "rope_theta")
    if key is None:
        key, base = _first(config, "rope_theta", "rotary_emb_base")
    base = DEFAULT_BASE if key is None else _number(base, key)
    if not math.isfinite(base) or base <= 0:
        raise ValueError(f"{key} must be a finite positive number, got {base!r}")

    key, frac = _first(params, "partial_rotary_factor")
    if key is None:
        key, frac = _first(config, "partial_rotary_factor", "rotary_pct")
    explicit_dim = config.get("rotary_dim")
    if explicit_dim is not None:
        if isinstance(explicit_dim, bool) or not isinstance(explicit_dim, (int, np.integer)):
            raise ValueError(f"rotary_dim must be an integer, got {explicit_dim!r}")
        rot = int(explicit_dim)
        if key is not None and int(d_head * _number(frac, key)) != rot:
            raise ValueError(f"rotary_dim={rot} contradicts {key}={frac!r} with d_head={d_head}")
    elif key is not None:
        f = _number(frac, key)
        if not 0 < f <= 1:
            raise ValueError(f"{key} must lie in (0, 1], got {frac!r}")
        rot = int(d_head * f)
    else:
        rot = int(d_head)
    if rot <= 0 or rot % 2 or rot > d_head:
        raise ValueError(f"rotary dimension {rot} (d_head={d_head}) must be positive, even and <= d_head")

    if any(k in config for k in POSITION_KEYS):
        key, p = _first(config, *POSITION_KEYS)
        if key is None:
            raise ValueError(f"{' and '.join(POSITION_KEYS)} are null; give the context length or leave them out")
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p <= 0:
            raise ValueError(f"{key} must be a positive integer, got {p!r}")
    else:
        p = UNBOUNDED_POSITIONS

    inv_freq, attention, short = rope_frequencies(kind, params, config, base, rot)
    factors = config.get("rope_freq_factors")
    if factors is not None:
        if kind != "default":
            raise ValueError(f"rope_freq_factors and rope type {kind!r} both rescale the frequencies")
        factors = np.asarray(factors, dtype=np.float64)
        if factors.shape != (rot // 2,) or not np.all(np.isfinite(factors)) or np.any(factors <= 0):
            raise ValueError(f"rope_freq_factors must hold {rot // 2} finite positive numbers")
        inv_freq = (base ** -(np.arange(0, rot, 2, dtype=np.float64) / rot)) / factors
        kind = "rope_freqs"
    axes = None
    if mrope is not None:
        if short is not None:
            raise ValueError("M-RoPE with rope type 'longrope' (two frequency sets) is not modelled")
        axes = mrope_axes(params.get("mrope_section", mrope["default_section"]), rot // 2, mrope["kind"])
    return RotaryLayout(
        rot,
        pairing,
        base,
        int(p),
        None if kind == "default" else kind,
        inv_freq=None if inv_freq is None else tuple(float(x) for x in inv_freq),
        attention_factor=float(attention),
        offset_invariant=short is None,
        axes=axes,
    )


def _is_count(value) -> bool:
    """A positive integer of at most ``MAX_COUNT`` (2^53), the vocabulary's count (specbound.options)."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and 0 < value <= MAX_COUNT


def _grid_count(value, key: str) -> tuple[int, int]:
    """A config size given as one positive integer or as ``[rows, columns]``, as ``(rows, columns)``."""
    values = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(values) != 2 or not all(_is_count(v) for v in values):
        raise ValueError(
            f"{key} must be a positive integer of at most 2^53 or two of them (rows, columns), got {value!r}"
        )
    return int(values[0]), int(values[1])


def _positive_count(config: dict, key: str) -> int:
    value = config.get(key)
    if not _is_count(value):
        raise ValueError(f"{key} must be a positive integer of at most 2^53, got {value!r}")
    return int(value)


def grid_frequencies(kind: str, base: float, d_head: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """``(thetas, axes)`` of a 2D rotary head of ``d_head`` features (docs/rotary.md section 9), each
    ``(d_head/2,)``: pair ``i``'s angular frequency and the axis it turns with (0 row, 1 column).

    ``alternating`` (Pixtral): the text frequencies ``base^(-2j/d)``, ``j < d/2``, the even ``j`` on the rows
    then the odd ``j`` on the columns.  ``split`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Llama 4): ``base^(-4j/d)``,
    ``j < d/4``, on the rows then again on the columns (the caller swaps the axes for Llama 4)."""
    if kind == "alternating":
        text = base ** -(np.arange(0, d_head, 2, dtype=np.float64) / d_head)
        rows, cols = text[0::2], text[1::2]
    else:
        if d_head % 4:
            raise ValueError(
                f"the head dimension {d_head} must be a multiple of 4: the rows and the columns each "
                f"rotate d_head/4 pairs (the model's own tables do not fit otherwise)"
            )
        rows = cols = base ** -(np.arange(0, d_head // 2, 2, dtype=np.float64) / (d_head // 2))
    return np.concatenate([rows, cols]), (0,) * len(rows) + (1,) * len(cols)


def grid_layouts(
    rule: dict[str, Any], config: dict[str, Any], d_head: int, pairing: str, num_layers: int
) -> tuple[RotaryLayout, ...]:
    """Each layer's 2D rotary layout of a vision tower (docs/rotary.md section 9), by the spec's ``grid`` rule.

    The grid is the largest the config allows: ``image_size // patch_size`` patches on each side when the rule
    names both keys (Pixtral: the processor's longest edge; Llama 4: every tile is exactly that), else
    unbounded (Qwen: the model takes any grid, only the processor's ``max_pixels``, not in config.json, limits
    it), so that only the bounds valid for every rotation apply.  A layer of window attention (Qwen2.5-VL: every
    layer not in ``fullatt_block_indexes``) attends within windows of ``S = (window_size // spatial_merge_size
    // patch_size) spatial_merge_size`` patches a side, so its offsets are those of an ``S x S`` grid (within the
    image's).  ``class_token``: Llama 4's class token, at angle 0 before patches numbered from 1.  A key config.json
    leaves out takes the rule's ``defaults`` (the model's config class's: Qwen2.5-VL's full-attention layers 7, 15,
    23, 31)."""
    if isinstance(d_head, bool) or not isinstance(d_head, (int, np.integer)) or d_head <= 0 or d_head % 2:
        raise ValueError(f"the head dimension must be a positive even integer, got {d_head!r}")
    config = {**rule.get("defaults", {}), **config}  # a key left out: the config class's default (a null stays)
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != d_head:  # the rotary tables would be built for another head size
        raise ValueError(f"config head_dim={head_dim!r} contradicts the head size {d_head} (hidden size / heads)")
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be a dict, got {params!r}")
    params = params or {}
    kind = params.get("rope_type", "default" if "rope_types" not in rule else rule["rope_types"][0])
    if "rope_types" in rule and kind not in rule["rope_types"]:
        raise ValueError(
            f"rope_type {kind!r}: this vision tower's rotary embedding is "
            f"{' or '.join(rule['rope_types'])} only (the model refuses any other)"
        )
    key, base = _first(params, "rope_theta")
    if key is None:
        key, base = _first(config, "rope_theta")
    base = DEFAULT_BASE if key is None else _number(base, key)
    if not math.isfinite(base) or base <= 0:
        raise ValueError(f"{key} must be a finite positive number, got {base!r}")
    thetas, axes = grid_frequencies(rule["frequencies"], base, int(d_head))
    if rule.get("first_axis", "row") == "column":
        axes = tuple(1 - a for a in axes)
    if "image_size" in rule:
        image = _grid_count(config.get(rule["image_size"]), rule["image_size"])
        patch = _grid_count(config.get(rule["patch_size"]), rule["patch_size"])
        grid = (image[0] // patch[0], image[1] // patch[1])
        if min(grid) < 1:
            raise ValueError(
                f"{rule['image_size']}={config.get(rule['image_size'])!r} is smaller than "
                f"{rule['patch_size']}={config.get(rule['patch_size'])!r}: no patch fits"
            )
    else:
        grid = (UNBOUNDED_POSITIONS, UNBOUNDED_POSITIONS)
    grids = [grid] * num_layers
    window = rule.get("window")
    if window is not None:
        merge = _positive_count(config, window["merge"])
        merged = _positive_count(config, window["size"]) // merge // _positive_count(config, window["patch"])
        if merged < 1:
            raise ValueError(
                f"{window['size']}={config.get(window['size'])!r} holds no {window['merge']} x "
                f"{window['patch']} block of pixels: the model's windows would be empty (it divides by "
                f"their size)"
            )
        full = config.get(window["full_layers"], [])
        if not isinstance(full, list) or any(isinstance(l, bool) or not isinstance(l, int) for l in full):
            raise ValueError(f"{window['full_layers']} must list layer indices, got {full!r}")
        side = merged * merge
        grids = [grid if l in full else (min(side, grid[0]), min(side, grid[1])) for l in range(num_layers)]
    origin = bool(rule.get("class_token", False))
    by_grid = {
        g: RotaryLayout(
            int(d_head),
            pairing,
            base,
            max(g),
            inv_freq=tuple(float(t) for t in thetas),
            axes=axes,
            grid=g,
            shared_shift=False,
            grid_origin=origin,
        )
        for g in set(grids)
    }
    return tuple(by_grid[g] for g in grids)
