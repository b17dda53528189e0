"""Run records -> tidy tables: a row per run with its hyper-parameters, its measured
generalisation, whether it met the training criterion, and every bound and measure; and a row per
analysed matrix with its chosen Schatten index ``p*``.

Measure columns, by kind (``MEASURE_KINDS``):

* ``complexity``: each bound's value ``B`` (``Analysis.all_bounds()``), column ``<bound>``;
* ``from_init``: the same on ``W - W0`` (``Analysis.from_init``), column ``<bound>[W-W0]``;
* ``gap_bound``: the generalisation-gap bound for the run's ``n`` and margin
  (``gap_bound.bounds``), column ``gap:<bound>``, with ``vacuous:<bound>``;
* ``gap_bound_from_init``: the gap bound from ``W - W0``, column ``gap:<bound>[W-W0]``;
* ``reference``: the data-dependent predictors measured after training (:mod:`.train`):
  ``pacbayes_flatness``, ``pacbayes_init``, ``inverse_margin``.

The generalisation gaps: ``error_gap = test error - train error`` (primary) and ``loss_gap``.
"""

from __future__ import annotations

import math

import pandas as pd

from .grid import HPARAMS

GAPS = ("error_gap", "loss_gap")
PRIMARY_GAP = "error_gap"
MEASURE_KINDS = ("complexity", "from_init", "gap_bound", "gap_bound_from_init", "reference")
REFERENCE = ("pacbayes_flatness", "pacbayes_init", "inverse_margin")
METRICS = (
    "converged",
    "train_loss",
    "test_loss",
    "train_error",
    "test_error",
    "error_gap",
    "loss_gap",
    "margin",
    "margin_logit",
    "head_lipschitz",
    "row_norm_max",
    "row_norm_median",
    "train_ramp_loss",
    "sigma_flat",
    "sigma_censored",
    "distance_from_init",
    "steps",
    "epochs",
    "parameters",
    "n_test",
    "train_seconds",
    "eval_seconds",
    "flat_seconds",
    "cpu_seconds",
    "run_seconds",
)
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
        row = {
            "run": rec["path"].rsplit("/", 1)[-1],
            "key": rec["key"],
            "task": cfg["task"],
            **{h: cfg[h] for h in HPARAMS},
            "seed": cfg["seed"],
            "max_steps": cfg["max_steps"],
            **{m: metrics.get(m, math.nan) for m in METRICS},
        }
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
        for name in REFERENCE:
            _put(row, catalogue, name, "reference", name, metrics.get(name, math.nan))
        rows.append(row)
    runs = pd.DataFrame(rows)
    order = {k: i for i, k in enumerate(MEASURE_KINDS)}
    measures = pd.DataFrame(
        [{"column": c, "kind": k, "bound": b} for c, (k, b) in catalogue.items()], columns=["column", "kind", "bound"]
    )
    if len(measures):
        measures = measures.sort_values("kind", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    return runs, measures


IDENTITY = ("run", "key", "task", *HPARAMS, "seed", "max_steps", "base", "cluster")


def measures_from_columns(columns) -> pd.DataFrame:
    """The measure columns' catalogue (``column, kind, bound``) of a stored ``runs.csv``, from its
    column names alone (the names :func:`runs_table` gives them), in :func:`runs_table`'s order."""
    catalogue = {}
    for c in columns:
        if c in IDENTITY or c in METRICS or c.startswith("vacuous:"):
            continue
        init = c.endswith(INIT_SUFFIX)
        if c.startswith("gap:"):
            kind, bound = ("gap_bound_from_init" if init else "gap_bound"), c[len("gap:") :]
        elif c in REFERENCE:
            kind, bound = "reference", c
        else:
            kind, bound = ("from_init" if init else "complexity"), c
        catalogue[c] = (kind, bound[: -len(INIT_SUFFIX)] if init else bound)
    order = {k: i for i, k in enumerate(MEASURE_KINDS)}
    measures = pd.DataFrame(
        [{"column": c, "kind": k, "bound": b} for c, (k, b) in catalogue.items()], columns=["column", "kind", "bound"]
    )
    return measures.sort_values("kind", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)


def pstar_table(records: list[dict]) -> pd.DataFrame:
    """One row per analysed matrix of every run: ``run, task, depth, converged, layer, role, p_star,
    log10_downstream_factor`` (the spectrum-adaptive bound's chosen Schatten index and the log10 of the
    layer's downstream factor, the paper's alpha_l; schema 1 documents call it ``log10_alpha``)."""
    rows = []
    for rec in records:
        if rec["analysis"] is None:
            continue
        run = rec["path"].rsplit("/", 1)[-1]
        for m in rec["analysis"].get("matrices", []):
            rows.append(
                {
                    "run": run,
                    "task": rec["config"]["task"],
                    "depth": rec["config"]["depth"],
                    "converged": bool(rec["metrics"].get("converged", False)),
                    "layer": m["layer"],
                    "role": m["role"],
                    "p_star": m["p_star"],
                    "log10_downstream_factor": m.get("log10_downstream_factor", m.get("log10_alpha", math.nan)),
                }
            )
    return pd.DataFrame(
        rows, columns=["run", "task", "depth", "converged", "layer", "role", "p_star", "log10_downstream_factor"]
    )


def _put(row: dict, catalogue: dict, column: str, kind: str, bound: str, value) -> None:
    row[column] = float(value) if value is not None else math.nan  # JSON keeps non-finite values as strings
    catalogue.setdefault(column, (kind, bound))
