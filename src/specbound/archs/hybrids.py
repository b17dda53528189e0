"""Families refused as a whole, in one line that names their layers that are not softmax attention.

Hybrid decoders (Qwen3-Next, Qwen3.5, Kimi-Linear, Nemotron-H, Granite 4.0-H, Falcon-H1, Jamba,
Bamba, Zamba, LFM2, OLMo hybrid, MiniMax, RecurrentGemma) put linear-attention, state-space or
recurrent layers between, or beside, their softmax layers (Mamba, Mamba-2 and RWKV have no softmax
layer at all).  Those layers
carry a state across the whole sequence through input-dependent decays and gates: specbound derives
neither their matrices as terms of the bound nor a Lipschitz factor over the sequences for them
(docs/families.md), and a bound over the softmax layers alone would leave them out silently.  So
such a model is refused, with the indices of those layers and their block type.

Each family is a data file ``archs/data/refused/<family>.json``::

    {"family": ..., "description": ..., "model_types": [...],
     "block": "gated DeltaNet linear-attention", "tensors": "layers.N.linear_attn.*: ...",
     "layers": [RULE, ...], "reason": ...}

``layers`` are tried in order; the first whose config.json key is present gives the refused layer
indices (0-based):

* ``{"types": KEY, "refused": [values]}``: ``config[KEY]`` is a list of layer types (``layer_types``);
* ``{"cycle": KEY, "refused": [values], "default": [values]}``: layer ``i`` has the type
  ``config[KEY][i % len]``, a pattern repeated over the depth (RecurrentGemma's ``block_types``);
* ``{"pattern": KEY, "refused": CHARS}``: a string of one character per layer (Nemotron-H's
  ``hybrid_override_pattern``, ``M`` a Mamba-2 layer);
* ``{"one_based": KEY}``: a list of 1-based layer numbers (Kimi-Linear's ``linear_attn_config.kda_layers``);
* ``{"kept": KEY}``: a list of the 0-based softmax layers, every other layer refused (LFM2's ``full_attn_idxs``);
* ``{"period": KEY, "offset": KEY, "defaults": [P, O]}``: layer ``i`` is softmax attention when
  ``i % P == O``, refused otherwise (Jamba);
* ``{"interval": KEY, "default": K}``: layer ``i`` is softmax attention when ``(i + 1) % K == 0`` (Qwen3-Next's
  ``full_attention_interval``);
* ``{"all": true}``: every layer (Falcon-H1's state-space mixer runs beside attention in each layer).

A key may be dotted (``linear_attn_config.kda_layers``) to read inside an object of config.json.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import SpecboundError
from ..errors import index_ranges as ranges

# The weights of a linear-attention or state-space block, by their last name (a decay, a time step, a
# fused projection no softmax head has): never analysed, so never ignored either (binding.check_strays,
# infer.refuse_unmodelled)
RECURRENT_WEIGHT = (
    r"(?:^|\.)(?:A_log|dt_bias|time_decay|time_first|in_proj_qkvz|in_proj_ba|slope_rate|recurrent_param)$"
    r"|(?:^|\.)(?:x_proj|dt_proj)\.weight$"
)
RECURRENT_WHAT = (
    "a weight of a linear-attention or state-space block (Mamba's A_log, dt_bias, x_proj, dt_proj; gated "
    "DeltaNet's in_proj_qkvz, in_proj_ba; RWKV's time_decay; lightning attention's slope_rate; RG-LRU's "
    "recurrent_param)"
)
RECURRENT_WHY = (
    "its state carries every earlier token through input-dependent decays and gates, and specbound "
    "derives neither its matrices as terms of the bound nor a Lipschitz factor over sequences for it"
)
RULE_KINDS = ("types", "cycle", "pattern", "one_based", "kept", "period", "interval", "all")
# each kind's other keys
_RULE_KEYS = {
    "types": {"refused"},
    "cycle": {"refused", "default"},
    "pattern": {"refused"},
    "one_based": set(),
    "kept": set(),
    "period": {"offset", "defaults"},
    "interval": {"default"},
    "all": set(),
}
_FIELDS = {"family", "description", "model_types", "block", "tensors", "layers", "reason"}
_MISSING = object()
MAX_DEPTH = 100_000  # a num_hidden_layers beyond it is not read (as spec.MAX_SHARED_DEPTH: no model is that deep)


@dataclass(frozen=True)
class RefusedFamily:
    """One refused family: its model types, the block type of its refused layers (and where their
    tensors are), how config.json says which layers have it, and why it is refused."""

    family: str
    description: str
    model_types: tuple[str, ...]
    block: str
    tensors: str
    layers: tuple[dict[str, Any], ...]
    reason: str
    origin: str

    def refused_layers(self, config: dict[str, Any]) -> tuple[list[int] | None, int | None]:
        """The 0-based indices of the layers with the refused block, from the first ``layers`` rule
        whose key config.json has (None when none has: the message then says config.json does not
        say), and the depth (the length of a per-layer list, else ``num_hidden_layers``, else None)."""
        depth = _get(config, "num_hidden_layers")
        depth = depth if _int(depth) and 0 <= depth <= MAX_DEPTH else None
        for rule in self.layers:
            found = _apply(rule, config, depth)
            if found is not None:
                return found
        return None, depth

    def message(self, config: dict[str, Any]) -> str:
        """The one-line refusal."""
        model_type = config.get("model_type")
        layers, depth = self.refused_layers(config)
        of = "" if depth is None else f" of {depth}"
        if layers is not None and any(not 0 <= i < (depth or MAX_DEPTH) for i in layers):
            layers = None  # numbers outside the model: config.json does not say which layers
        head = f"unsupported model family: config.json has model_type={model_type!r} ({self.description})"
        if layers is not None and not layers:
            return (
                f"{head}: this config.json has none of the family's {self.block} layers ({self.tensors}), but "
                f"specbound ships no spec for its other layers (docs/families.md)"
            )
        if layers is None:
            which = f"its {self.block} layers ({self.tensors}; config.json does not say which layers)"
        else:
            noun = "layer" if len(layers) == 1 else "layers"
            which = f"{noun} {ranges(layers)}{of} are {self.block} layers ({self.tensors})"
        return (
            f"{head}, refused as a whole: {which}; {self.reason} (docs/families.md), and a bound over the "
            f"softmax attention alone would leave them out silently"
        )


def _get(config: dict[str, Any], key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _apply(rule: dict[str, Any], config: dict[str, Any], depth: int | None) -> tuple[list[int], int | None] | None:
    """One rule's refused layers and the depth, or None when its key is absent or its value unusable."""
    if rule.get("all"):
        return None if depth is None else (list(range(depth)), depth)
    if "types" in rule:
        types = _get(config, rule["types"])
        if not isinstance(types, list):
            return None
        return [i for i, t in enumerate(types) if t in rule["refused"]], len(types)
    if "cycle" in rule:
        pattern = _get(config, rule["cycle"])
        pattern = rule["default"] if pattern is _MISSING else pattern
        if depth is None or not isinstance(pattern, list) or not pattern:
            return None
        return [i for i in range(depth) if pattern[i % len(pattern)] in rule["refused"]], depth
    if "pattern" in rule:
        pattern = _get(config, rule["pattern"])
        if not isinstance(pattern, str):
            return None
        return [i for i, c in enumerate(pattern) if c in rule["refused"]], len(pattern)
    if "one_based" in rule:
        numbers = _get(config, rule["one_based"])
        if not isinstance(numbers, list) or not all(_int(n) and n >= 1 for n in numbers):
            return None
        return sorted({n - 1 for n in numbers}), depth
    if "kept" in rule:
        kept = _get(config, rule["kept"])
        if depth is None or not isinstance(kept, list):
            return None
        return [i for i in range(depth) if i not in kept], depth
    if "period" in rule:
        period, offset = (_get(config, rule[k]) for k in ("period", "offset"))
        period = rule["defaults"][0] if period is _MISSING else period
        offset = rule["defaults"][1] if offset is _MISSING else offset
        if depth is None or not (_int(period) and _int(offset) and period >= 1):
            return None
        return [i for i in range(depth) if i % period != offset], depth
    if "interval" in rule:
        interval = _get(config, rule["interval"])
        interval = rule["default"] if interval is _MISSING else interval
        if depth is None or not _int(interval) or interval < 1:
            return None
        return [i for i in range(depth) if (i + 1) % interval], depth
    return None


def _parse(raw: Any, origin: str) -> RefusedFamily:
    def fail(why: str) -> SpecboundError:
        return SpecboundError(f"{origin}: {why}")

    if not isinstance(raw, dict) or set(raw) != _FIELDS:
        raise fail(f"a refused family must be an object with exactly the keys {sorted(_FIELDS)}")
    text = ("family", "description", "block", "tensors", "reason")
    if not all(isinstance(raw[k], str) and raw[k] for k in text):
        raise fail(f"{', '.join(text)} must be non-empty strings")
    if (
        not isinstance(raw["model_types"], list)
        or not raw["model_types"]
        or not all(isinstance(t, str) for t in raw["model_types"])
    ):
        raise fail("'model_types' must be a non-empty list of strings")
    rules = raw["layers"]
    if not isinstance(rules, list) or not rules:
        raise fail("'layers' must be a non-empty list of rules")
    for rule in rules:
        kinds = [k for k in RULE_KINDS if isinstance(rule, dict) and k in rule]
        if len(kinds) != 1 or set(rule) != {kinds[0], *_RULE_KEYS[kinds[0]]}:
            raise fail(
                f"each 'layers' rule names exactly one of {list(RULE_KINDS)} with its keys "
                f"({ {k: sorted(v) for k, v in _RULE_KEYS.items()} }), found {rule!r}"
            )
    return RefusedFamily(
        raw["family"],
        raw["description"],
        tuple(raw["model_types"]),
        raw["block"],
        raw["tensors"],
        tuple(rules),
        raw["reason"],
        origin,
    )


@lru_cache(maxsize=1)
def refused_families() -> tuple[RefusedFamily, ...]:
    """Every ``archs/data/refused/*.json``, in file-name order, parsed once."""
    folder = resources.files("specbound.archs") / "data" / "refused"
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            out.append(_parse(json.loads(entry.read_text()), f"specbound/archs/data/refused/{entry.name}"))
    return tuple(out)


def refuse_ignored_recurrent(names, accounted: set[str], family: str, origin: str) -> None:
    """A spec that ignores a linear-attention or state-space weight (a user's ``--arch-spec`` for a
    hybrid) is refused in one line naming it and the layers holding such weights: the bound would
    leave those layers out silently."""
    pattern = re.compile(RECURRENT_WEIGHT)
    hits = [n for n in names if n not in accounted and pattern.search(n)]
    if hits:
        layers = sorted({int(m[1]) for n in hits if (m := re.search(r"\.(\d+)\.", n))})
        where = f", in layers {ranges(layers)}" if len(layers) > 1 else f", in layer {layers[0]}" if layers else ""
        raise SpecboundError(
            f"{hits[0]} is {RECURRENT_WHAT}{where}, and the {family} spec ({origin}) ignores it: "
            f"{RECURRENT_WHY}, so a bound over the other layers would leave it out silently "
            f"(docs/families.md)"
        )


def refused_family(model_type: Any) -> RefusedFamily | None:
    return next((f for f in refused_families() if model_type in f.model_types), None)


def refuse_hybrid(config: dict[str, Any]) -> None:
    """Raise the family's one-line refusal when config.json's ``model_type`` is a refused family."""
    family = refused_family(config.get("model_type"))
    if family is not None:
        raise SpecboundError(family.message(config))
