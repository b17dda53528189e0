"""Stage 4, bounds: small registered objects (one module each), functions of the ``compute`` measures.

A bound has a name, a title, the reference it implements (paper and equation), the quantities it
reads, and one function from :class:`~specbound.compute.measures.ModelMeasures` to a :class:`BoundResult`.
Bounds that have a margin-bound form also say which log factor multiplies their leading term and
what the post-hoc union bound costs (see :mod:`specbound.bounds.gap`).  Adding a baseline is adding a
module here and naming it in :mod:`.registry`.

Groups (the keys of the JSON document): ``"bounds"`` (the paper's headline comparison,
spectrum-adaptive vs Edelman-style), ``"baselines"`` (other bounds from the literature, adapted to
the same matrices) and ``"adaptive_variants"`` (the spectrum-adaptive bound recomputed with a fixed
Schatten index or with the theory's three matrix types).
"""

from __future__ import annotations

from .base import GROUPS, Bound, BoundResult
from .registry import REGISTRY, compute_all, in_group

__all__ = ["Bound", "BoundResult", "GROUPS", "REGISTRY", "compute_all", "in_group"]
