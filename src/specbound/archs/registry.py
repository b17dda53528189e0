"""The registry of shipped families: ``specbound/archs/data/*.json``, keyed by ``model_type``.

Each file is read and validated once per process, at the first lookup.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

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


def spec_for_config(config: dict[str, Any]) -> ArchSpec:
    """The shipped spec whose ``model_types`` contains the config's ``model_type``."""
    model_type = config.get("model_type")
    for spec in _served():
        if model_type in spec.model_types:
            return spec
    refuse_hybrid(config)  # a hybrid's refusal names its linear-attention or state-space layers
    raise SpecboundError(
        f"unsupported model family: config.json has model_type={model_type!r}; supported model "
        f"types: {', '.join(supported_model_types())}. For another family, write a spec file "
        f"(see docs/architectures.md) and pass it with --arch-spec FILE; `specbound arch infer SOURCE` "
        f"drafts one from the checkpoint's tensor names and says what it guessed"
    )


def referenced_family(name: str, *, by_model_type: bool, what: str) -> ArchSpec:
    """The shipped one-chain spec a wrapper's tower references (:class:`~.spec.TowerSpec`): the family
    ``name`` (``FAMILY.TOWER``: that tower of a two-tower family), or with ``by_model_type`` the family
    serving the model type ``name`` (the tower's section names another one, LLaVA's ``mistral``)."""
    if by_model_type:
        found = next((s for s in _served() if name in s.model_types and s.towers is None), None)
        if found is None:
            raise SpecboundError(f"{what}: its config names model_type={name!r}, which specbound does not analyse as "
                                 f"one chain (docs/families.md lists the families); analyse another tower with --tower")
        return found
    family, _, tower = name.partition(".")
    spec = builtin_specs().get(family)
    found = None if spec is None else spec if not tower else next(
        (t.spec for t in spec.towers or () if t.name == tower and t.spec is not None), None)
    if found is None:
        raise SpecboundError(f"{what} is the family {name!r}, which this specbound does not ship "
                             f"({'no such family' if spec is None else f'{family} has no tower {tower!r}'}); "
                             f"analyse another tower with --tower, or update specbound")
    return found
