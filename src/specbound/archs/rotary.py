"""A checkpoint's rotary layout: the family spec says whether (and how a head's dimensions pair up),
config.json says with which base, how many dimensions and over how many positions (docs/rotary.md).

The mathematics of rotary heads is :mod:`specbound.compute.rotary`; this module only reads settings.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import SpecboundError
from .model import PAIRINGS, UNBOUNDED_POSITIONS, RotaryLayout
from .spec import ArchSpec

# config.json keys stating the context length, in the order they are read
POSITION_KEYS = ("max_position_embeddings", "n_positions")
# HF's default rope_theta, used when the config names no base
DEFAULT_BASE = 10000.0


def rotary_layout(spec: ArchSpec, config: dict[str, Any], d_head: int, *, where: str) -> RotaryLayout | None:
    """The rotary layout of a family that declares one (``"rotary"`` in its spec, not switched off
    by its ``off_when`` config key: Falcon's ``alibi``), else None.

    A config that states no context length (an ONNX export without config.json, say) gets
    ``max_positions = UNBOUNDED_POSITIONS``: every offset counts, so only the bounds valid for every
    rotation apply.  ``where`` names the checkpoint in the one-line error a bad setting raises.
    """
    pairing = spec.rotary_for(config)
    if pairing is None:
        return None
    try:
        return parse_rotary(config, d_head, pairing)
    except ValueError as exc:
        raise SpecboundError(f"config.json of {where}: {exc}; fix the rotary settings (rope_theta, "
                             f"max_position_embeddings, partial_rotary_factor / rotary_pct)") from None


def _first(config: dict, *keys):
    for key in keys:
        if config.get(key) is not None:
            return key, config[key]
    return None, None


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    return float(value)


def parse_rotary(config: dict, d_head: int, pairing: str) -> RotaryLayout:
    """The rotary layout of a HF-style ``config.json`` dict of a rotary family.

    Keys read: ``rope_theta`` / ``rotary_emb_base`` / ``rope_parameters["rope_theta"]`` (default
    10000); ``partial_rotary_factor`` / ``rotary_pct`` (fraction of ``d_head``, ``rot =
    int(d_head * f)`` as HF computes it) or ``rotary_dim`` (GPT-J, an absolute count);
    ``max_position_embeddings`` / ``n_positions`` (neither key: ``UNBOUNDED_POSITIONS``);
    ``head_dim`` (must equal ``d_head``); ``rope_scaling`` / ``rope_parameters["rope_type"]``
    (recorded only).

    Parameters
    ----------
    config : dict
        The parsed ``config.json`` (or ``PretrainedConfig.to_dict()``).
    d_head : int
        The head dimension ``d_h``.
    pairing : {"half", "interleaved"}
        The family spec's pair layout (``"half"`` is HF's ``rotate_half``).

    Raises
    ------
    ValueError
        One line naming the offending key for values that make no sense (non-positive base or
        positions, a fraction outside ``(0, 1]``, an odd or oversized rotary dimension, a
        ``head_dim`` that contradicts ``d_head``, an unknown pairing, positions stated as ALiBi or
        absolute).
    """
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    if isinstance(d_head, bool) or not isinstance(d_head, (int, np.integer)) or d_head <= 0:
        raise ValueError(f"d_head must be a positive integer, got {d_head!r}")
    if pairing not in PAIRINGS:
        raise ValueError(f"rotary pairing must be one of {PAIRINGS}, got {pairing!r}")
    if config.get("alibi") or config.get("position_embedding_type") in ("absolute", "alibi", "learned"):
        stated = "alibi: true" if config.get("alibi") else f"position_embedding_type={config['position_embedding_type']!r}"
        raise ValueError(f"{stated} says the positions are not rotary, but the family spec declares rotary "
                         f"position embeddings; pass a spec without \"rotary\" (--arch-spec FILE)")
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be a dict, got {params!r}")
    if params and "rope_theta" not in params and "rope_type" not in params \
            and all(isinstance(v, dict) for v in params.values()):
        raise ValueError("rope_parameters is given per layer type "
                         f"({sorted(params)}): pass the sub-dict of the layer's type merged into the config")
    params = params or {}
    scaling_cfg = config.get("rope_scaling")

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

    scaling = params.get("rope_type") or params.get("type")
    if scaling in (None, "default") and isinstance(scaling_cfg, dict):
        scaling = scaling_cfg.get("rope_type") or scaling_cfg.get("type")
    elif scaling in (None, "default") and scaling_cfg is not None:
        scaling = str(scaling_cfg)
    scaling = None if scaling in (None, "default") else str(scaling)
    return RotaryLayout(rot, pairing, base, int(p), scaling)
