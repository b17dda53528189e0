"""Bounds as small registered objects (one module each).

A bound has a name, a title, the reference it implements (paper and equation) and one function
from :class:`~specbound.measures.ModelMeasures` to a :class:`BoundResult`.  Adding a baseline is
adding a module here and importing it below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..measures import ModelMeasures


@dataclass(frozen=True)
class BoundResult:
    """A bound's value plus its per-matrix / per-layer breakdown (arrays aligned with
    ``ModelMeasures.matrices`` and with the layers)."""

    value: float
    per_matrix: dict[str, np.ndarray] = field(default_factory=dict)
    per_layer: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Bound:
    name: str
    title: str
    reference: str
    compute: Callable[[ModelMeasures], BoundResult]


REGISTRY: dict[str, Bound] = {}


def register(bound: Bound) -> Bound:
    if bound.name in REGISTRY:
        raise ValueError(f"bound {bound.name!r} registered twice")
    REGISTRY[bound.name] = bound
    return bound


def compute_all(measures: ModelMeasures) -> dict[str, BoundResult]:
    return {name: bound.compute(measures) for name, bound in REGISTRY.items()}


from . import adaptive, edelman  # noqa: E402,F401  (registration side effect)
