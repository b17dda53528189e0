"""What a bound is: a small object with a name, a title, the reference it implements, the quantities
it reads and one function from :class:`~specbound.compute.measures.ModelMeasures` to a
:class:`BoundResult` (the explicit list of bounds is :mod:`.registry`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..compute.measures import ModelMeasures

GROUPS = ("bounds", "baselines", "adaptive_variants")


@dataclass(frozen=True)
class BoundResult:
    """A bound's value plus its per-matrix / per-layer breakdown (arrays aligned with
    ``ModelMeasures.matrices`` and with the layers) and ``log_value``, its natural log, exact even
    where ``value`` overflows float64 (then ``inf``)."""

    value: float
    per_matrix: dict[str, np.ndarray] = field(default_factory=dict)
    per_layer: dict[str, np.ndarray] = field(default_factory=dict)
    log_value: float | None = None

    def __post_init__(self):
        # ln of the value, always finite for a positive bound: where ``value`` overflows float64 the
        # bound computes it in logs and ``value`` is ``inf``; otherwise it is ``ln value``.
        if self.log_value is None:
            v = self.value
            object.__setattr__(
                self, "log_value", math.log(v) if 0 < v < math.inf else (-math.inf if v == 0 else math.inf)
            )
        elif not self.value < math.inf and math.isfinite(self.log_value):
            object.__setattr__(self, "value", math.inf)

    @property
    def log10_value(self) -> float:
        """``log10`` of the bound (finite whenever the bound is positive, however large)."""
        return self.log_value / math.log(10)


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
        quantity has no such form (it is then reported as a measure only) or has ``covering_terms``.
    union_cost : callable(ModelMeasures, n) -> float
        Log of the number of post-hoc choices a union bound must pay for (added to ``log(1/delta)``).
    covering_terms : callable(ModelMeasures) -> list of CoveringTerm, optional
        The spectrum-adaptive family's terms: its gap form puts the margin inside each term and
        integrates each term's entropy (:mod:`.covering`) instead of ``log_factor``.
    applies : callable(ModelMeasures) -> bool, optional
        Whether the bound means anything for this model (None: always); a bound that does not apply
        is not computed and not reported (e.g. the rotation-blind variants of a model without rotary).
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
    covering_terms: Callable[[ModelMeasures], list] | None = None
    applies: Callable[[ModelMeasures], bool] | None = None

    def __post_init__(self):
        if self.group not in GROUPS:
            raise ValueError(f"bound {self.name!r}: group must be one of {GROUPS}, got {self.group!r}")
        if self.log_factor is not None and self.covering_terms is not None:
            raise ValueError(f"bound {self.name!r}: a gap form has either a log factor or covering terms")

    @property
    def has_gap_form(self) -> bool:
        """Whether the bound becomes a generalisation-gap bound (``--n``, ``--margin``)."""
        return self.log_factor is not None or self.covering_terms is not None
