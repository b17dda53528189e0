"""Bounds as small registered objects (one module each).

A bound has a name, a title, the reference it implements (paper and equation), the quantities it
reads, and one function from :class:`~specbound.measures.ModelMeasures` to a :class:`BoundResult`.
Bounds that have a margin-bound form also say which log factor multiplies their leading term and
what the post-hoc union bound costs (see :mod:`specbound.gap`).  Adding a baseline is adding a
module here and importing it below.

Groups (the keys of the JSON document): ``"bounds"`` (the paper's headline comparison,
spectrum-adaptive vs Edelman-style), ``"baselines"`` (other bounds from the literature, adapted to
the same matrices) and ``"adaptive_variants"`` (the spectrum-adaptive bound recomputed with a fixed
Schatten index or with the theory's three matrix types).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..measures import ModelMeasures

GROUPS = ("bounds", "baselines", "adaptive_variants")


@dataclass(frozen=True)
class BoundResult:
    """A bound's value plus its per-matrix / per-layer breakdown (arrays aligned with
    ``ModelMeasures.matrices`` and with the layers)."""

    value: float
    per_matrix: dict[str, np.ndarray] = field(default_factory=dict)
    per_layer: dict[str, np.ndarray] = field(default_factory=dict)


def no_union_cost(measures: ModelMeasures, n: int) -> float:
    return 0.0


@dataclass(frozen=True)
class Bound:
    """One registered bound.

    Attributes
    ----------
    name, title, reference : str
        Key in the output, a human title, and the paper + equation it implements.
    compute : callable(ModelMeasures) -> BoundResult
    group : {"bounds", "baselines", "adaptive_variants"}
    needs : tuple of str
        The quantities it reads (documentation; e.g. ``("spectral_norm", "norm_2_1", "Lambda")``).
    log_factor : callable(ModelMeasures, n) -> float, optional
        The log factor multiplying ``B / (margin sqrt(n))`` in its margin-bound form; None when the
        quantity has no such form (it is then reported as a measure only).
    union_cost : callable(ModelMeasures, n) -> float
        Log of the number of post-hoc choices a union bound must pay for (added to ``log(1/delta)``).
    distance : bool
        Whether measuring from initial weights changes it (False for quantities with no norm of
        ``W - W0`` in them, e.g. the spectral product or the parameter count).
    """

    name: str
    title: str
    reference: str
    compute: Callable[[ModelMeasures], BoundResult]
    group: str = "bounds"
    needs: tuple[str, ...] = ()
    log_factor: Callable[[ModelMeasures, int], float] | None = None
    union_cost: Callable[[ModelMeasures, int], float] = no_union_cost
    distance: bool = True

    def __post_init__(self):
        if self.group not in GROUPS:
            raise ValueError(f"bound {self.name!r}: group must be one of {GROUPS}, got {self.group!r}")


REGISTRY: dict[str, Bound] = {}


def register(bound: Bound) -> Bound:
    if bound.name in REGISTRY:
        raise ValueError(f"bound {bound.name!r} registered twice")
    REGISTRY[bound.name] = bound
    return bound


def compute_all(measures: ModelMeasures, *, only_distance: bool = False) -> dict[str, BoundResult]:
    """Every registered bound on ``measures`` (with ``only_distance``: those that measure ``W - W0``)."""
    return {name: bound.compute(measures) for name, bound in REGISTRY.items()
            if bound.distance or not only_distance}


def in_group(group: str) -> list[str]:
    return [name for name, bound in REGISTRY.items() if bound.group == group]


from . import adaptive, edelman  # noqa: E402,F401  (registration side effect)
from . import adaptive_fixed_p, adaptive_three_type, adaptive_shared  # noqa: E402,F401
from . import bft, nbs, trauger_tewari, frobenius_product, spectral_product, param_count  # noqa: E402,F401
