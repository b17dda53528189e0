"""From complexity proxies to generalisation-gap bounds, in this project's proxy forms (docs/spec.md
section 7, docs/bounds.md section 9).

For a sample of ``n`` sequences, a margin ``margin`` (never ``gamma``, which is the sensitivity
``gamma*``) and a confidence ``1 - delta``, every bound with a margin-bound form becomes

    gap = leading  +  c_conf * sqrt((ln(1/delta) + U) / n)

with ``U`` the union-bound cost of its post-hoc choices (for the spectrum-adaptive bound
``#matrices * ln(2m + 1)``: one of ``2m + 1`` Schatten indices per matrix).  The leading term is

* the spectrum-adaptive family: ``c_lead * B_margin * log_factor / sqrt(n)``, the margin inside each
  term and ``B_margin * log_factor`` the entropy integral of its covering terms, the error budget split
  over the ``T`` terms summed (:mod:`.covering`);
* every other bound: ``c_lead * B * log_factor(n) / (margin sqrt(n))``, ``B`` the bound's value.

The loss is the ramp loss at that margin, with values in ``[0, 1]``: the test error is at most the
empirical ramp loss plus ``gap``, so a ``gap >= 1`` says nothing and is marked vacuous.  These forms
are our readings of the sources' theorems (whose exact statements, for the spectrum-adaptive bound,
we could not read), not the theorems: no gap is a certified number.  ``c_lead`` and ``c_conf`` are
the absolute constants the sources do not state for these transformer forms; they default to 1 and
the output says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .base import BoundResult
from .covering import gap_complexity
from .registry import REGISTRY
from ..options import AnalysisOptions
from ..compute.measures import ModelMeasures

LOSS_RANGE = (0.0, 1.0)
ASSUMPTIONS = (
    "ramp loss at the given margin, values in [0, 1]; test error <= empirical ramp loss + gap; "
    "gap >= 1 is vacuous. These gap forms are this project's proxies of the sources' theorems, not their "
    "statements: the spectrum-adaptive family's margin placement and entropy integral are derived in "
    "docs/bounds.md section 9 from our reading of a theorem whose exact statement we could not read, and "
    "the baselines' forms are adapted to the transformer chain (docs/bounds.md sections 4-7). c_lead and "
    "c_conf are absolute constants the sources leave unstated (default 1, not the true values): no gap here "
    "is a theorem or a certified number."
)
# The kind of the gap forms in the analysis' assumptions list (docs/theory.md section 6).
KIND = "extension"
# Post-hoc choices whose union bound is not paid in the confidence term (docs/bounds.md section 9):
# each makes the gap optimistic by a union cost of order log log.
UNPAID_UNIONS = (
    "S_p and Frobenius radii: the observed S_p and ||W||_F of each matrix are used as the radii of its class "
    "(a union over a geometric grid of radii costs about ln ln per matrix)",
    "spectral radii: the observed spectral norms set alpha and the sensitivities (layerwise spectral-norm "
    "control after training; a union over norm levels is not paid)",
    "the margin: chosen after seeing the data (a union over a grid of margins is not paid)",
)


@dataclass(frozen=True)
class GapParameters:
    """Sample size, margin, confidence and the unstated constants of the gap bound.

    Parameters
    ----------
    n : int
        Number of training sequences, at least 2.
    margin : float
        The margin ``> 0`` of the ramp loss, in the units of the network's output (token rows
        in the unit ball).
    delta : float
        Failure probability, in (0, 1).
    lead_constant, confidence_constant : float
        ``c_lead`` and ``c_conf`` (default 1: unstated by the sources).
    """

    n: int
    margin: float
    delta: float = 0.05
    lead_constant: float = 1.0
    confidence_constant: float = 1.0

    def __post_init__(self):  # validated where every option is (options.AnalysisOptions)
        AnalysisOptions(
            n=self.n,
            margin=self.margin,
            delta=self.delta,
            lead_constant=self.lead_constant,
            confidence_constant=self.confidence_constant,
        )

    @classmethod
    def from_options(cls, options: AnalysisOptions) -> "GapParameters | None":
        """The gap parameters of ``options`` (None when no gap bound is asked for)."""
        if not options.gap_requested:
            return None
        return cls(
            n=options.n,
            margin=options.margin,
            delta=options.delta,
            lead_constant=options.lead_constant,
            confidence_constant=options.confidence_constant,
        )


def gap_terms(value: float, log_factor: float, union_cost: float, params: GapParameters) -> dict[str, float | bool]:
    """The leading and confidence terms, their sum and whether it is vacuous."""
    n = params.n
    leading = params.lead_constant * value * log_factor / (params.margin * math.sqrt(n)) if value else 0.0
    confidence = params.confidence_constant * math.sqrt((math.log(1 / params.delta) + union_cost) / n)
    gap = leading + confidence
    return {
        "complexity": value,
        "log_factor": log_factor,
        "union_cost": union_cost,
        "leading": leading,
        "confidence": confidence,
        "gap": gap,
        "vacuous": not gap < LOSS_RANGE[1] - LOSS_RANGE[0],
    }


def covering_gap_terms(terms: list, sqrt_l: float, union_cost: float, params: GapParameters) -> dict:
    """The spectrum-adaptive family's gap: the margin inside each covering term and each term's
    entropy integral (:func:`~.covering.gap_complexity`), no ``1 / margin`` outside."""
    form = gap_complexity(terms, sqrt_l, params.margin)
    leading = params.lead_constant * form["integral"] / math.sqrt(params.n) if form["complexity"] else 0.0
    confidence = params.confidence_constant * math.sqrt((math.log(1 / params.delta) + union_cost) / params.n)
    gap = leading + confidence
    return {
        "complexity": form["complexity"],
        "log_factor": form["log_factor"],
        "union_cost": union_cost,
        "leading": leading,
        "confidence": confidence,
        "gap": gap,
        "vacuous": not gap < LOSS_RANGE[1] - LOSS_RANGE[0],
        "margin_form": MARGIN_INSIDE,
    }


# How the margin enters each bound's leading term (the ``margin_form`` of every gap entry).
MARGIN_INSIDE = "inside each term: C(p; scale / margin), no 1 / margin outside"
MARGIN_OUTSIDE = "B / margin"


def gap_bounds(measures: ModelMeasures, results: dict[str, BoundResult], params: GapParameters) -> dict:
    """``{name: gap terms}`` for every computed bound that has a margin-bound form."""
    out = {}
    for name, result in results.items():
        bound = REGISTRY[name]
        if not bound.has_gap_form:
            continue
        union_cost = bound.union_cost(measures, params.n)
        if bound.covering_terms is not None:
            out[name] = covering_gap_terms(
                bound.covering_terms(measures), math.sqrt(measures.dims.L), union_cost, params
            )
        else:
            out[name] = {
                **gap_terms(result.value, bound.log_factor(measures, params.n), union_cost, params),
                "margin_form": MARGIN_OUTSIDE,
            }
    return out


def describe(params: GapParameters) -> dict:
    """The parameters and assumptions, for the output."""
    return {
        "parameters": asdict(params),
        "loss_range": list(LOSS_RANGE),
        "assumptions": ASSUMPTIONS,
        "kind": KIND,
        "unpaid_unions": list(UNPAID_UNIONS),
        "unstated_constants": {
            "lead_constant": params.lead_constant,
            "confidence_constant": params.confidence_constant,
        },
    }
