"""The registry: every bound the tool computes, in output order.  Adding a baseline is adding a
module that declares ``BOUNDS = (Bound(...), ...)`` and naming it here."""

from __future__ import annotations

from . import (
    adaptive,
    adaptive_fixed_p,
    adaptive_shared,
    adaptive_three_type,
    bft,
    edelman,
    frobenius_product,
    nbs,
    param_count,
    rotation_blind,
    spectral_product,
    trauger_tewari,
)
from .base import Bound, BoundResult
from ..compute.measures import ModelMeasures

# Output order: the headline comparison first, then the variants and the baselines.
MODULES = (
    adaptive,
    edelman,
    adaptive_fixed_p,
    adaptive_three_type,
    adaptive_shared,
    bft,
    nbs,
    trauger_tewari,
    frobenius_product,
    spectral_product,
    param_count,
    rotation_blind,
)


def _registry() -> dict[str, Bound]:
    registry: dict[str, Bound] = {}
    for module in MODULES:
        for bound in module.BOUNDS:
            if bound.name in registry:
                raise ValueError(f"bound {bound.name!r} declared twice ({module.__name__})")
            registry[bound.name] = bound
    return registry


REGISTRY: dict[str, Bound] = _registry()


def compute_all(measures: ModelMeasures, *, only_distance: bool = False) -> dict[str, BoundResult]:
    """Every registered bound on ``measures`` (with ``only_distance``: those that measure ``W - W0``)."""
    return {
        name: bound.compute(measures)
        for name, bound in REGISTRY.items()
        if (bound.distance or not only_distance) and (bound.applies is None or bound.applies(measures))
    }


def in_group(group: str) -> list[str]:
    """Names of the registered bounds of one group (``bounds``, ``baselines``, ``adaptive_variants``)."""
    return [name for name, bound in REGISTRY.items() if bound.group == group]
