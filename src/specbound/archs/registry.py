"""The registry of shipped families: ``specbound/archs/data/*.json``, keyed by ``model_type``.

Each file is read and validated once per process, at the first lookup.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import regex

from ..errors import SpecboundError
from .hybrids import refuse_hybrid
from .spec import ArchSpec, parse_spec


@lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[str, ArchSpec], ...]:
    """``(family, spec)`` of every shipped file, in file-name order, parsed once."""
    specs = []
    for entry in sorted((resources.files("specbound.archs") / "data").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            spec = parse_spec(json.loads(entry.read_text()), f"specbound/archs/data/{entry.name}")
            specs.append((spec.family, spec))
    return tuple(specs)


def builtin_specs() -> dict[str, ArchSpec]:
    """The shipped families, keyed by family name (a new dict each call; the specs are shared)."""
    return dict(_shipped())


def _served() -> list[ArchSpec]:
    """Every shipped spec and, after a two-tower family's, each of its towers' (a checkpoint of one
    tower alone, CLIPTextModel, has that tower's model type)."""
    return [x for _, s in _shipped() for x in (s, *(t.spec for t in s.towers or () if t.spec is not None))]


def supported_model_types() -> list[str]:
    return sorted({t for s in _served() for t in s.model_types})


def spec_for_config(config: dict[str, Any], tower: str | None = None) -> ArchSpec:
    """The shipped spec whose ``model_types`` contains the config's ``model_type``; for a multimodal wrapper
    specbound does not read as a whole, its text tower alone when ``tower`` is ``text`` and the text model's
    family is shipped (:func:`unknown_wrapper`), else a one-line refusal naming what is missing."""
    model_type = config.get("model_type")
    for spec in _served():
        if model_type in spec.model_types:
            return spec
    refuse_hybrid(config)  # a hybrid's refusal names its linear-attention or state-space layers
    wrapper = unknown_wrapper(config, tower)
    if wrapper is not None:
        return wrapper
    raise SpecboundError(
        f"unsupported model family: config.json has model_type={model_type!r}; supported model "
        f"types: {', '.join(supported_model_types())}. For another family, write a spec file "
        f"(see docs/architectures.md) and pass it with --arch-spec FILE; `specbound arch infer SOURCE` "
        f"drafts one from the checkpoint's tensor names and says what it guessed"
    )


def _one_chain_serving(model_type: Any) -> ArchSpec | None:
    """The shipped one-chain spec (a family, or one tower of a two-tower family) serving ``model_type``."""
    return next((s for s in _served() if model_type in s.model_types and s.towers is None), None)


def referenced_family(name: str, *, by_model_type: bool, what: str) -> ArchSpec:
    """The shipped one-chain spec a wrapper's tower references (:class:`~.spec.TowerSpec`): the family
    ``name`` (``FAMILY.TOWER``: that tower of a two-tower family), or with ``by_model_type`` the family
    serving the model type ``name`` (the tower's section names another one, LLaVA's ``mistral``)."""
    if by_model_type:
        found = _one_chain_serving(name)
        if found is None:
            raise SpecboundError(
                f"{what}: its config names model_type={name!r}, which specbound does not analyse as "
                f"one chain (docs/families.md lists the families); analyse another tower with --tower"
            )
        return found
    family, _, tower = name.partition(".")
    spec = builtin_specs().get(family)
    found = (
        None
        if spec is None
        else spec
        if not tower
        else next((t.spec for t in spec.towers or () if t.name == tower and t.spec is not None), None)
    )
    if found is None:
        raise SpecboundError(
            f"{what} is the family {name!r}, which this specbound does not ship "
            f"({'no such family' if spec is None else f'{family} has no tower {tower!r}'}); "
            f"analyse another tower with --tower, or update specbound"
        )
    return found


# where a multimodal wrapper's text model sits (transformers 5's names, then the saved and older hub ones)
TEXT_PREFIXES = (
    "model.language_model.",
    "language_model.model.",
    "language_model.",
    "model.text_model.",
    "text_model.",
)
_SECTIONS = ("text_config", "vision_config", "audio_config", "speech_config", "thinker_config", "talker_config")


def unknown_wrapper(config: dict[str, Any], tower: str | None) -> ArchSpec | None:
    """A multimodal wrapper no shipped family reads (Gemma 3n, an audio-language model, a remote-code model):
    with ``tower == "text"`` and a shipped family for its ``text_config``, a spec of that text tower alone
    (under :data:`TEXT_PREFIXES`, everything outside them ignored); None for a config with no sub-config
    sections; otherwise a one-line refusal naming each section and what is missing."""
    sections = {k: config[k] for k in _SECTIONS if isinstance(config.get(k), dict)}
    if not sections:
        return None
    model_type = config.get("model_type")
    text = sections.get("text_config", {}).get("model_type")
    family = _one_chain_serving(text) if text else None
    if tower == "text" and family is not None:
        outside = "|".join(regex.escape(p[:-1]) for p in TEXT_PREFIXES)
        return parse_spec(
            {
                "family": str(model_type),
                "model_types": [str(model_type)],
                "description": f"the text model of a {model_type} checkpoint, read as the {family.family} family",
                "towers": {
                    "text": {
                        "family": family.family,
                        "config_section": ["text_config"],
                        "prefixes": list(TEXT_PREFIXES),
                    }
                },
                "projector": {
                    "prefixes": [],
                    "description": "the other towers and whatever maps their outputs into "
                    "the text model's input, not read",
                },
                "ignore": [f"^(?!({outside})\\.)", "^(model\\.)?language_model\\.lm_head\\."],
            },
            f"the text tower of config.json's model_type={model_type!r}",
        )
    said = "; ".join(
        f"{key} model_type={section.get('model_type')!r}"
        + (" (audio towers are not analysed)" if key in ("audio_config", "speech_config") else "")
        for key, section in sections.items()
    )
    remote = " It needs remote code (auto_map), which specbound never runs." if "auto_map" in config else ""
    hint = (
        f"Pass --tower text to analyse its text tower alone (the {family.family} family)"
        if family is not None
        else "No section names a family specbound analyses alone; `specbound arch infer SOURCE` drafts a spec"
    )
    raise SpecboundError(
        f"unsupported model family: config.json has model_type={model_type!r}, a multimodal model "
        f"specbound does not read as a whole ({said}).{remote} {hint}"
    )
