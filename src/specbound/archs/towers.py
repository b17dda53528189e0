"""One tower of a two-tower checkpoint (CLIP, SigLIP): the checkpoint seen with that tower's config.

A two-tower config.json nests each tower's config (``text_config``, ``vision_config``); a tower is a
chain of its own (its spec, :class:`~.spec.TowerSpec`), bound to a view of the checkpoint whose
``config`` is the tower's section.  Both views share the one opened checkpoint: closing a view does
nothing, the opener closes the checkpoint once.
"""

from __future__ import annotations

from typing import Any

from ..io import Checkpoint
from .spec import ArchSpec, TowerSpec


class TowerView:
    """``ckpt`` with ``config`` replaced by one tower's (every other attribute is the checkpoint's)."""

    def __init__(self, ckpt: Checkpoint, config: dict[str, Any], tower: str):
        self._ckpt = ckpt
        self.config = config
        self.tower = tower

    def __getattr__(self, name: str):
        return getattr(self._ckpt, name)

    @property
    def base(self) -> Checkpoint:
        """The shared checkpoint, which the opener closes."""
        return self._ckpt

    def close(self) -> None:
        """Nothing: the shared checkpoint is closed once, by whoever opened it."""


def tower_views(spec: ArchSpec, ckpt: Checkpoint, tower: str | None) -> list[tuple[TowerSpec, TowerView]]:
    """``(tower spec, view)`` of the tower named ``tower``, or of every tower (None), in the spec's order."""
    towers = [t for t in spec.towers if tower is None or t.name == tower]
    return [(t, TowerView(ckpt, t.config_of(ckpt.config), t.name)) for t in towers]
