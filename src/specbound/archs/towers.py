"""One tower of a two-tower checkpoint (CLIP, SigLIP) or of a vision-language wrapper (Gemma 3, LLaVA): the
checkpoint seen with that tower's config, and a wrapper's tower resolved to the shipped family it names.

A two-tower config.json nests each tower's config (``text_config``, ``vision_config``); a tower is a
chain of its own (its spec, :class:`~.spec.TowerSpec`), bound to a view of the checkpoint whose
``config`` is the tower's section.  Both views share the one opened checkpoint: closing a view does
nothing, the opener closes the checkpoint once.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecboundError
from ..io import Checkpoint
from .registry import referenced_family
from .spec import ArchSpec, TowerSpec, as_tower


class TowerView:
    """``ckpt`` with ``config`` replaced by one tower's (every other attribute is the checkpoint's)."""

    def __init__(self, ckpt: Checkpoint, config: dict[str, Any], tower: str):
        self._ckpt = ckpt
        self.config = config
        self.tower = tower

    def __getattr__(self, name: str):
        return getattr(self._ckpt, name)

    @property
    def shared(self) -> Checkpoint:
        """The shared checkpoint, which the opener closes."""
        return self._ckpt

    def close(self) -> None:
        """Nothing: the shared checkpoint is closed once, by whoever opened it."""


def tower_views(spec: ArchSpec, ckpt: Checkpoint, tower: str | None) -> list[tuple[TowerSpec, TowerView]]:
    """``(tower spec, view)`` of the tower named ``tower``, or of every tower (None), in the spec's order."""
    towers = [t for t in spec.towers if tower is None or t.name == tower]
    return [(t, TowerView(ckpt, tower_config(t, ckpt.config), t.name)) for t in towers]


def tower_config(tower: TowerSpec, config: dict[str, Any]) -> dict[str, Any]:
    """The tower's config: its section of the wrapper's config.json, under a reference's ``defaults`` when the
    section is of the named family's own config class (its first model type, absent, or one of the tower's
    ``model_types``: LLaVA 1.5's text_config leaves LlamaConfig's defaults out; a Mistral section gets none)."""
    section = tower.config_of(config)
    if not tower.defaults:
        return section
    try:  # the defaults are those of the named family's own config class: its first model type
        own = referenced_family(tower.family, by_model_type=False, what="").model_types[:1]
    except SpecboundError:
        return section
    return {**tower.defaults, **section} if section.get("model_type") in (None, *own, *tower.model_types) else section


def tower_spec(tower: TowerSpec, config: dict[str, Any]) -> ArchSpec:
    """The tower's chain spec for its ``config`` (:func:`tower_config`), variants chosen: a two-tower family's
    own, or the family a wrapper's tower names (its section's model_type picking another shipped family),
    read under the wrapper's prefixes (:func:`.spec.as_tower`)."""
    if tower.spec is not None:
        return tower.spec.for_config(config)
    named = names_family(tower, config)
    found = referenced_family(
        tower.family if named else config["model_type"],
        by_model_type=not named,
        what=f"the {tower.name} tower of {tower.origin}",
    )
    return as_tower(found, tower).for_config(config)


def names_family(tower: TowerSpec, section: dict[str, Any]) -> bool:
    """Whether a reference's config section is of the family it names (its model_type absent, listed in the
    tower's ``model_types`` or the family's own), not of another one its model_type picks."""
    model_type = section.get("model_type")
    if model_type is None or model_type in tower.model_types:
        return True
    try:
        return model_type in referenced_family(tower.family, by_model_type=False, what="").model_types
    except SpecboundError:  # a family this specbound does not ship: said so when the tower is opened
        return True
