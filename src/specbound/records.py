"""The result of an analysis as tidy tables plus the bound values, and its stable JSON schema.

Reports and plots read these records; they never recompute spectra.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .atomic import atomic_write
from .bounds import REGISTRY, BoundResult, in_group
from .compute.measures import ModelMeasures
from .compute.spectra import numerical_rank

SCHEMA_VERSION = 1

MATRIX_COLUMNS = [
    "layer", "head", "role", "rows", "cols", "rank", "spectral_norm", "frobenius_norm",
    "nuclear_norm", "stable_rank", "norm_2_1", "norm_1_1", "alpha", "gamma", "scale", "p_star",
    "contribution", "c_p0", "c_p2", "p_continuous", "contribution_continuous", "c_p1", "sv_method",
    "sv_rel_error_bound",
]
# Added when the analysis is measured from initial weights: norms of W - W0 and the adaptive
# bound's choice on them.
DELTA_COLUMNS = ["delta_rank", "delta_spectral_norm", "delta_frobenius_norm", "delta_norm_2_1",
                 "delta_norm_1_1", "delta_p_star", "delta_contribution"]


@dataclass
class Analysis:
    """Everything one analysis produced.

    Attributes
    ----------
    source : str
        Where the weights came from.
    model : dict
        ``family, L, N, H, H_kv, d_head, d_ff, activation``.
    options : dict
        ``grid_m, rank_tol, l_phi, l_phi_source, method``.
    bounds : dict[str, float]
        The headline comparison: ``spectral_adaptive`` and ``edelman``.
    matrices : DataFrame, one row per analysed matrix (columns ``MATRIX_COLUMNS``, plus
        ``DELTA_COLUMNS`` when measured from initial weights).
    layers : DataFrame, one row per layer (``layer, lambda, alpha, xi, adaptive``, the fixed-p and
        three-type adaptive sums ``adaptive_p0/1/2``, ``adaptive_three_type``, and each baseline's
        per-layer terms).
    singular_values : DataFrame, long form ``(matrix, layer, head, role, index, sigma)``; the
        computed values only (a factored N x N product's exact zeros are implied by its rank).
    baselines : dict[str, float]
        Other bounds and measures from the literature on the same matrices.
    adaptive_variants : dict[str, float]
        The spectrum-adaptive bound with a fixed Schatten index, and with three matrix types.
    from_init : dict[str, float] or None
        Every bound that measures norms, recomputed on ``W - W0`` (``init=`` given).
    gap_bound : dict or None
        Generalisation-gap bounds (``n`` and ``margin`` given): parameters, assumptions and, per
        bound, ``complexity, log_factor, union_cost, leading, confidence, gap, vacuous``.
    """

    source: str
    model: dict[str, Any]
    options: dict[str, Any]
    bounds: dict[str, float]
    matrices: pd.DataFrame
    layers: pd.DataFrame
    singular_values: pd.DataFrame = field(repr=False)
    baselines: dict[str, float] = field(default_factory=dict)
    adaptive_variants: dict[str, float] = field(default_factory=dict)
    from_init: dict[str, float] | None = None
    gap_bound: dict[str, Any] | None = None

    def all_bounds(self) -> dict[str, float]:
        """Every computed bound and measure, headline first."""
        return {**self.bounds, **self.adaptive_variants, **self.baselines}

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``specbound analyze --format json`` (schema version 1)."""
        rows = []
        for rec in self.matrices.to_dict("records"):
            rec["head"] = None if pd.isna(rec["head"]) else int(rec["head"])
            rec["shape"] = [int(rec.pop("rows")), int(rec.pop("cols"))]
            rec["layer"], rec["rank"] = int(rec["layer"]), int(rec["rank"])
            rows.append({k: _json_number(v) for k, v in rec.items()})
        doc = {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "model": self.model,
            "options": {k: _json_number(v) for k, v in self.options.items()},
            "bounds": _json_dict(self.bounds),
            "baselines": _json_dict(self.baselines),
            "adaptive_variants": _json_dict(self.adaptive_variants),
            "bound_references": {k: REGISTRY[k].reference for k in self.all_bounds()},
            "layers": [{k: _json_number(v) for k, v in r.items()} for r in self.layers.to_dict("records")],
            "matrices": rows,
        }
        if self.from_init is not None:
            doc["from_init"] = _json_dict(self.from_init)
        if self.gap_bound is not None:
            doc["gap_bound"] = _json_tree(self.gap_bound)
        return doc

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Write the tables (Parquet and CSV) and the summary JSON to ``out_dir``, each atomically."""
        from .errors import os_errors

        out = Path(out_dir)
        with os_errors(f"write the tables to {out}"):
            return self._save(out)

    def _save(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, table in (("matrices", self.matrices), ("layers", self.layers),
                            ("singular_values", self.singular_values)):
            written.append(atomic_write(out / f"{name}.parquet", lambda p, t=table: t.to_parquet(p, index=False)))
            written.append(atomic_write(out / f"{name}.csv", lambda p, t=table: t.to_csv(p, index=False)))
        written.append(atomic_write(out / "summary.json", lambda p: Path(p).write_text(self.to_json())))
        return written


def _json_number(value: Any) -> Any:
    """numpy scalars -> Python; non-finite floats -> strings, so the JSON stays strict."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    return value


def _json_dict(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _json_number(v) for k, v in values.items()}


def _json_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_tree(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return _json_number(value)


def build_analysis(source: str, family: str, measures: ModelMeasures, results: dict[str, BoundResult],
                   options: dict[str, Any], *,
                   from_init: tuple[ModelMeasures, dict[str, BoundResult]] | None = None,
                   gap: dict[str, Any] | None = None) -> Analysis:
    """Assemble the records from the measures and every bound's result (``from_init``: the
    measures on ``W - W0`` and the bounds computed on them)."""
    dims = measures.dims
    base = []
    sv_arrays = []
    for i, mm in enumerate(measures.matrices):
        s = mm.spectrum
        base.append({
            "layer": mm.layer, "head": mm.head, "role": mm.role, "rows": s.shape[0], "cols": s.shape[1],
            "rank": numerical_rank(s.singular_values, s.dim, measures.rank_tol),
            "spectral_norm": s.spectral_norm, "frobenius_norm": s.frobenius_norm,
            "nuclear_norm": s.nuclear_norm, "stable_rank": s.stable_rank, "norm_2_1": s.norm_2_1,
            "norm_1_1": s.norm_1_1, "alpha": mm.alpha, "gamma": mm.gamma,
            "sv_method": s.sv_method, "sv_rel_error_bound": s.sv_rel_error_bound,
        })
        sv_arrays.append(s.singular_values)
    # Every column gathered first and the frames built once: inserting columns one by one
    # re-converts the string columns each time (most of this function's time on a small model).
    columns = {key: [row[key] for row in base] for key in (base[0] if base else {})}
    for result in results.values():
        columns.update(result.per_matrix)
    columns["head"] = pd.array(columns.get("head", []), dtype="Int64")
    matrices = pd.DataFrame(columns, columns=MATRIX_COLUMNS) if base else pd.DataFrame(base, columns=MATRIX_COLUMNS)

    per_layer = {"layer": np.arange(dims.L), "lambda": measures.lambdas, "alpha": measures.alphas}
    for result in results.values():
        per_layer.update(result.per_layer)
    layers = pd.DataFrame(per_layer)
    if from_init is not None:
        matrices, layers = _with_differences(matrices, layers, *from_init)

    counts = np.array([sv.size for sv in sv_arrays])
    owner = np.repeat(np.arange(len(counts)), counts)  # one table built at once, not one per matrix
    singular_values = pd.DataFrame({
        "matrix": owner,
        "layer": np.repeat([mm.layer for mm in measures.matrices], counts),
        "head": pd.array(np.repeat(np.array([mm.head for mm in measures.matrices], dtype=object), counts),
                         dtype="Int64"),
        "role": np.repeat([mm.role for mm in measures.matrices], counts),
        "index": np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + 1,
        "sigma": np.concatenate(sv_arrays) if sv_arrays else np.array([]),
    })
    model = {"family": family, "L": dims.L, "N": dims.N, "H": dims.H, "H_kv": dims.H_kv,
             "d_head": dims.d_head, "d_ff": dims.d_ff, "activation": dims.activation}
    values = {name: r.value for name, r in results.items()}
    return Analysis(source=source, model=model, options=options,
                    bounds={k: values[k] for k in in_group("bounds") if k in values},
                    matrices=matrices, layers=layers, singular_values=singular_values,
                    baselines={k: values[k] for k in in_group("baselines") if k in values},
                    adaptive_variants={k: values[k] for k in in_group("adaptive_variants") if k in values},
                    from_init=None if from_init is None else {k: r.value for k, r in from_init[1].items()},
                    gap_bound=gap)


def _with_differences(matrices: pd.DataFrame, layers: pd.DataFrame, measures: ModelMeasures,
                      results: dict[str, BoundResult]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Add the ``W - W0`` columns (``DELTA_COLUMNS``) and the per-layer terms on the differences
    (prefixed ``delta_``)."""
    matrices, layers = matrices.copy(), layers.copy()
    deltas = [mm.delta for mm in measures.matrices]
    matrices["delta_rank"] = [numerical_rank(d.singular_values, d.dim, measures.rank_tol) for d in deltas]
    for key, attr in (("delta_spectral_norm", "spectral_norm"), ("delta_frobenius_norm", "frobenius_norm"),
                      ("delta_norm_2_1", "norm_2_1"), ("delta_norm_1_1", "norm_1_1")):
        matrices[key] = [getattr(d, attr) for d in deltas]
    adaptive = results["spectral_adaptive"].per_matrix
    matrices["delta_p_star"], matrices["delta_contribution"] = adaptive["p_star"], adaptive["contribution"]
    for result in results.values():
        for key, column in result.per_layer.items():
            layers[f"delta_{key}"] = column
    return matrices, layers
