"""Run records -> one tidy table: a row per run with its hyper-parameters, its measured
generalisation and every bound and measure that ``analyze`` reported.

Measure columns, by kind (``MEASURE_KINDS``):

* ``complexity``: each bound's value ``B`` (``Analysis.all_bounds()``), column ``<bound>``;
* ``from_init``: the same on ``W - W0`` (``Analysis.from_init``), column ``<bound>[W-W0]``;
* ``gap_bound``: the generalisation-gap bound for the run's ``n`` and margin
  (``gap_bound.bounds``), column ``gap:<bound>``, with ``vacuous:<bound>``;
* ``gap_bound_from_init``: the gap bound from ``W - W0``, column ``gap:<bound>[W-W0]``.

The generalisation gaps: ``error_gap = test error - train error`` (primary: the quantity the
margin bounds bound, in [0, 1] up to sign) and ``loss_gap = test - train cross-entropy``.
"""

from __future__ import annotations

import math

import pandas as pd

from .grid import HPARAMS

GAPS = ("error_gap", "loss_gap")
PRIMARY_GAP = "error_gap"
MEASURE_KINDS = ("complexity", "from_init", "gap_bound", "gap_bound_from_init")
METRICS = ("train_loss", "test_loss", "train_error", "test_error", "error_gap", "loss_gap", "margin",
           "margin_logit", "head_lipschitz", "train_ramp_loss", "steps", "parameters", "n_test",
           "train_seconds", "eval_seconds", "run_seconds")
INIT_SUFFIX = "[W-W0]"


def runs_table(records: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, measures)``: one row per analysed run, and the measure columns' catalogue
    (``column, kind, bound``) in a stable order."""
    rows, catalogue = [], {}
    for rec in records:
        analysis = rec["analysis"]
        if analysis is None:
            continue
        cfg, metrics = rec["config"], rec["metrics"]
        row = {"run": rec["path"].rsplit("/", 1)[-1], "key": rec["key"], "task": cfg["task"],
               **{h: cfg[h] for h in HPARAMS}, "seed": cfg["seed"],
               **{m: metrics.get(m, math.nan) for m in METRICS}}
        values = {**analysis["bounds"], **analysis["adaptive_variants"], **analysis["baselines"]}
        for bound, value in values.items():
            _put(row, catalogue, bound, "complexity", bound, value)
        for bound, value in (analysis.get("from_init") or {}).items():
            _put(row, catalogue, f"{bound}{INIT_SUFFIX}", "from_init", bound, value)
        gap = analysis.get("gap_bound") or {}
        for section, kind, suffix in (("bounds", "gap_bound", ""), ("from_init", "gap_bound_from_init", INIT_SUFFIX)):
            for bound, terms in (gap.get(section) or {}).items():
                _put(row, catalogue, f"gap:{bound}{suffix}", kind, bound, terms["gap"])
                row[f"vacuous:{bound}{suffix}"] = bool(terms["vacuous"])
        rows.append(row)
    runs = pd.DataFrame(rows)
    order = {k: i for i, k in enumerate(MEASURE_KINDS)}
    measures = pd.DataFrame([{"column": c, "kind": k, "bound": b} for c, (k, b) in catalogue.items()],
                            columns=["column", "kind", "bound"])
    if len(measures):
        measures = measures.sort_values("kind", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    return runs, measures


def _put(row: dict, catalogue: dict, column: str, kind: str, bound: str, value) -> None:
    row[column] = float(value)  # JSON keeps non-finite values as strings ("inf")
    catalogue.setdefault(column, (kind, bound))
