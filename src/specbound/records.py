"""The result of an analysis as tidy tables plus the bound values, and its stable JSON schema.

Reports and plots read these records; they never recompute spectra.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .atomic import atomic_write
from .bounds import REGISTRY, BoundResult, in_group
from .errors import SpecboundError
from .compute.measures import ModelMeasures
from .bounds.schatten import kept_singular_values
from .records_plot import AnalysisPlots
from .records_view import analysis_html, format_summary, short_name

SCHEMA_VERSION = 1

MATRIX_COLUMNS = [
    "layer", "head", "role", "tensors", "rows", "cols", "rank", "spectral_norm", "frobenius_norm",
    "nuclear_norm", "stable_rank", "norm_2_1", "norm_1_1", "alpha", "gamma", "scale", "p_star",
    "contribution", "c_p0", "c_p2", "p_continuous", "contribution_continuous", "c_p1", "sv_method",
    "sv_rel_error_bound", "log10_alpha", "log10_scale",
]
LN10 = math.log(10)
# Added when the analysis is measured from initial weights: norms of W - W0 and the adaptive
# bound's choice on them.
DELTA_COLUMNS = ["delta_rank", "delta_spectral_norm", "delta_frobenius_norm", "delta_norm_2_1",
                 "delta_norm_1_1", "delta_p_star", "delta_contribution"]


# Columns an analysis' saved tables and a store's tables carry besides the analysis' own: which record
# and which model each row belongs to, so that tables of many analyses concatenate into one tidy frame.
ID_COLUMNS = ("key", "source")


@dataclass(repr=False)
class Analysis:
    """Everything one analysis produced.

    Attributes
    ----------
    source : str
        The model's name: where the weights came from, or ``all-MiniLM-L6-v2 (embedded default)``.
    model : dict
        ``family, L, N, H, H_kv, d_head, d_ff, activation``.
    options : dict
        ``grid_m, rank_tol, l_phi, l_phi_source, method``.
    bounds : dict[str, float]
        The headline comparison: ``spectral_adaptive`` and ``edelman``.
    matrices : DataFrame, one row per analysed matrix (columns ``MATRIX_COLUMNS``, plus
        ``DELTA_COLUMNS`` when measured from initial weights); ``tensors`` names the checkpoint
        tensor(s) the matrix is made of, ``|``-separated, a head's slice of the head axis in brackets
        (``...query.weight[0:32]|...key.weight[0:32]``).
    layers : DataFrame, one row per layer (``layer, lambda, alpha, xi, adaptive``, the fixed-p and
        three-type adaptive sums ``adaptive_p0/1/2``, ``adaptive_three_type``, and each baseline's
        per-layer terms).
    singular_values : DataFrame, long form ``(matrix, layer, head, role, sv_index, sigma)``; the
        computed values only (a factored N x N product's exact zeros are implied by its rank).
    baselines : dict[str, float]
        Other bounds and measures from the literature on the same matrices.
    adaptive_variants : dict[str, float]
        The spectrum-adaptive bound with a fixed Schatten index, and with three matrix types.
    from_init : dict[str, float] or None
        Every bound that measures norms, recomputed on ``W - W0`` (``init=`` given).
    assumptions : list of dict
        Where this model departs from the theorem's: ``{"name", "applies", "kind", "effect"}`` each
        (:mod:`specbound.assumptions`); with any ``theorem`` or ``extension`` entry applying, every
        bound is a proxy under the named assumptions, not a theorem.
    log10_bounds : dict[str, float]
        ``log10`` of every bound and measure, finite even where the value overflows float64 (the
        value is then ``inf`` here and ``null`` in every output).
    gap_bound : dict or None
        Generalisation-gap bounds (``n`` and ``margin`` given): parameters, assumptions and, per
        bound, ``complexity, log_factor, union_cost, leading, confidence, gap, vacuous``.
    location : str or None
        The folder or file the weights were read from (None: in memory or unknown).

    In a notebook the analysis shows its headline bounds, per-role table and spectra
    (``_repr_html_``); ``print(result)`` prints the command line's summary; ``result.plot`` draws
    its figures; ``result.bounds_frame()`` is every bound as one table; ``result.save(dir)`` and
    ``Analysis.load(dir)`` write and reopen it.
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
    log10_bounds: dict[str, float] = field(default_factory=dict)
    assumptions: list[dict[str, Any]] = field(default_factory=list)
    location: str | None = None

    def all_bounds(self) -> dict[str, float]:
        """Every computed bound and measure, headline first."""
        return {**self.bounds, **self.adaptive_variants, **self.baselines}

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``specbound analyze --format json`` (schema version 1)."""
        rows = []
        for rec in self.matrices.to_dict("records"):
            rec["head"] = None if pd.isna(rec["head"]) else int(rec["head"])
            rec["rows"], rec["cols"] = int(rec["rows"]), int(rec["cols"])  # as the Parquet table has them
            rec["shape"] = [rec["rows"], rec["cols"]]  # schema 1's form, kept
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
            "log10_bounds": _json_dict(self.log10_bounds),
            "assumptions": self.assumptions,
            "bound_references": {k: REGISTRY[k].reference for k in self.all_bounds()},
            "layers": [{k: _json_number(v) for k, v in r.items()} for r in self.layers.to_dict("records")],
            "matrices": rows,
        }
        if self.from_init is not None:
            doc["from_init"] = _json_dict(self.from_init)
        if self.gap_bound is not None:
            doc["gap_bound"] = _json_tree(self.gap_bound)
        doc["location"] = self.location
        return doc

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Write the tables (Parquet and CSV, each with a ``source`` column first) and the summary JSON
        to ``out_dir``, each atomically; :meth:`load` reopens them."""
        from .errors import os_errors

        out = Path(out_dir)
        with os_errors(f"write the tables to {out}"):
            return self._save(out)

    def _save(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name in TABLE_NAMES:
            table = self.tidy_table(name)
            written.append(atomic_write(out / f"{name}.parquet", lambda p, t=table: t.to_parquet(p, index=False)))
            written.append(atomic_write(out / f"{name}.csv", lambda p, t=table: t.to_csv(p, index=False)))
        written.append(atomic_write(out / "summary.json", lambda p: Path(p).write_text(self.to_json())))
        return written

    # --- the surface a researcher touches (notebook, tidy tables, reopening) ----------------------

    @classmethod
    def load(cls, out_dir: str | Path) -> "Analysis":
        """Reopen what :meth:`save` wrote to ``out_dir`` (``summary.json`` and the Parquet tables)."""
        return load_analysis(out_dir)

    def tidy_table(self, name: str, *, key: str | None = None, source: str | None = None) -> pd.DataFrame:
        """Table ``name`` (``matrices``, ``layers`` or ``singular_values``) with the identifying
        columns first: ``key`` (when given: a store's record key) and ``source`` (default this
        analysis' ``source``), so that the tables of many analyses concatenate into one frame."""
        if name not in TABLE_NAMES:
            raise SpecboundError(f"no table {name!r}; an analysis has {', '.join(TABLE_NAMES)}")
        table = getattr(self, name)
        ident = {"source": self.source if source is None else source}
        if key is not None:
            ident = {"key": key, **ident}
        front = pd.DataFrame({k: pd.Series([v] * len(table), dtype="string") for k, v in ident.items()})
        rest = table.drop(columns=[c for c in ident if c in table.columns]).reset_index(drop=True)
        return pd.concat([front, rest], axis=1)

    def bounds_frame(self) -> pd.DataFrame:
        """Every bound and measure as one table: ``bound, group, title, reference, value,
        log10_value`` (and ``from_init``, ``gap``, ``vacuous`` when they were computed), headline first."""
        log10 = getattr(self, "log10_bounds", None) or {}
        gaps = (self.gap_bound or {}).get("bounds", {})
        rows = []
        for name, value in self.all_bounds().items():
            bound = REGISTRY[name]
            row = {"bound": name, "group": bound.group, "title": bound.title, "reference": bound.reference,
                   "value": float(value), "log10_value": float(log10[name]) if name in log10 else _log10(value)}
            if self.from_init is not None:
                row["from_init"] = float(self.from_init.get(name, math.nan))
            if self.gap_bound is not None:
                g = gaps.get(name)
                row["gap"] = math.nan if g is None else float(g["gap"])
                row["vacuous"] = None if g is None else bool(g["vacuous"])
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def plot(self) -> AnalysisPlots:
        """The one-model figures: ``.spectra()``, ``.contributions()``, ``.p_star()`` (matplotlib Figures)."""
        return AnalysisPlots(self)

    def __str__(self) -> str:
        return format_summary(self)

    def __repr__(self) -> str:
        m = self.model
        bounds = ", ".join(f"{k}={v:.4g}" for k, v in self.bounds.items())
        return (f"<specbound.Analysis of {short_name(self.source)}: {m['family']} L={m['L']} N={m['N']}, "
                f"{len(self.matrices)} matrices; {bounds}>")

    def _repr_html_(self) -> str:
        figure = None
        try:
            import matplotlib  # noqa: F401  (the figure is optional)
        except ImportError:
            pass
        else:
            figure = _spectra_png(self)
        return analysis_html(self, figure)


TABLE_NAMES = ("matrices", "layers", "singular_values")


def _log10(value: float) -> float:
    value = float(value)
    if value > 0:
        return math.log10(value)
    return -math.inf if value == 0 else math.nan


def _spectra_png(a: Analysis) -> str:
    """A small spectrum figure as base64 PNG for the notebook view."""
    from .records_plot import png_base64

    return png_base64(a.plot.spectra(), dpi=80)  # 600 px wide: legible, about 60 kB


def _from_json_number(value: Any) -> Any:
    """Undo :func:`_json_number`'s strings for non-finite floats."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def _from_json_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _from_json_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json_tree(v) for v in value]
    return _from_json_number(value)


def load_analysis(out_dir: str | Path) -> Analysis:
    """The :class:`Analysis` that ``save(out_dir)`` wrote."""
    folder = Path(out_dir)
    summary = folder / "summary.json"
    if not summary.is_file():
        raise SpecboundError(f"{folder} holds no summary.json; pass a folder written by Analysis.save or "
                             f"`specbound analyze --out`")
    try:
        doc = json.loads(summary.read_text())
    except (OSError, ValueError) as exc:
        raise SpecboundError(f"cannot read {summary} ({exc}); write it again with Analysis.save") from None
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise SpecboundError(f"{summary} has schema version {doc.get('schema_version')!r}; this specbound reads "
                             f"version {SCHEMA_VERSION}")
    tables = {}
    for name in TABLE_NAMES:
        path = folder / f"{name}.parquet"
        try:
            table = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            raise SpecboundError(f"cannot read {path} ({exc}); write the folder again with Analysis.save") from None
        table = table.drop(columns=[c for c in ID_COLUMNS if c in table.columns])
        if name == "singular_values" and "index" in table.columns:  # written before the rename
            table = table.rename(columns={"index": "sv_index"})
        tables[name] = table
    log10 = {k: float(v) for k, v in (doc.get("log10_bounds") or {}).items() if v is not None}

    def bounds(values):  # JSON null (or a string, before 0.2) for a value beyond float64 -> inf
        out = {}
        for k, v in (values or {}).items():
            v = _from_json_number(v)
            out[k] = (math.inf if math.isfinite(log10.get(k, math.nan)) else math.nan) if v is None else float(v)
        return out

    kwargs = dict(source=doc["source"], model=doc["model"],
                  options={k: _from_json_number(v) for k, v in doc["options"].items()},
                  bounds=bounds(doc["bounds"]), matrices=tables["matrices"], layers=tables["layers"],
                  singular_values=tables["singular_values"], baselines=bounds(doc.get("baselines")),
                  adaptive_variants=bounds(doc.get("adaptive_variants")),
                  from_init=bounds(doc["from_init"]) if "from_init" in doc else None,
                  gap_bound=_from_json_tree(doc["gap_bound"]) if "gap_bound" in doc else None,
                  location=doc.get("location"))
    # any other field the document carries under its own name (e.g. log10_bounds)
    for f in fields(Analysis):
        if f.name not in kwargs and f.name in doc and f.name not in TABLE_NAMES:
            kwargs[f.name] = _from_json_tree(doc[f.name])
    return Analysis(**kwargs)


def _json_number(value: Any) -> Any:
    """numpy scalars -> Python; non-finite floats (and pandas' NA) -> null, so the JSON stays strict
    (a bound too large for float64 is in ``log10_bounds``)."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if value is pd.NA:
        return None
    return value


def _finite_or_null(table: pd.DataFrame) -> pd.DataFrame:
    """``inf`` entries of float columns as NaN, which Parquet stores as null and CSV as empty: no
    output table ever holds an Infinity (the ``log10_*`` columns carry what overflowed)."""
    floats = table.select_dtypes(include="float").columns
    if len(floats):
        values = table[floats].to_numpy()
        if not np.isfinite(values[~np.isnan(values)]).all():
            table = table.copy()
            table[floats] = table[floats].where(np.isfinite(table[floats]))
    return table


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
                   gap: dict[str, Any] | None = None,
                   tensors: dict[tuple[int, int | None, str], str] | None = None,
                   location: str | None = None, model_extra: dict[str, Any] | None = None,
                   assumptions: list[dict[str, Any]] | None = None) -> Analysis:
    """Assemble the records from the measures and every bound's result (``from_init``: the
    measures on ``W - W0`` and the bounds computed on them; ``tensors``: the checkpoint tensor names
    of each ``(layer, head, role)``, from :func:`specbound.archs.extract.matrix_tensor_names`)."""
    dims = measures.dims
    base = []
    sv_arrays = []
    for i, mm in enumerate(measures.matrices):
        s = mm.spectrum
        base.append({
            "layer": mm.layer, "head": mm.head, "role": mm.role,
            "tensors": (tensors or {}).get((mm.layer, mm.head, mm.role)), "rows": s.shape[0], "cols": s.shape[1],
            "rank": int(kept_singular_values(s, measures.rank_tol).size),
            "spectral_norm": s.spectral_norm, "frobenius_norm": s.frobenius_norm,
            "nuclear_norm": s.nuclear_norm, "stable_rank": s.stable_rank, "norm_2_1": s.norm_2_1,
            "norm_1_1": s.norm_1_1, "alpha": mm.alpha, "gamma": mm.gamma,
            "sv_method": s.sv_method, "sv_rel_error_bound": s.sv_rel_error_bound,
            "log10_alpha": mm.log_alpha / LN10, "log10_scale": mm.log_scale / LN10,
        })
        sv_arrays.append(s.singular_values)
    # Every column gathered first and the frames built once: inserting columns one by one
    # re-converts the string columns each time (most of this function's time on a small model).
    columns = {key: [row[key] for row in base] for key in (base[0] if base else {})}
    for result in results.values():
        columns.update(result.per_matrix)
    columns["head"] = pd.array(columns.get("head", []), dtype="Int64")
    matrices = pd.DataFrame(columns, columns=MATRIX_COLUMNS) if base else pd.DataFrame(base, columns=MATRIX_COLUMNS)

    per_layer = {"layer": np.arange(dims.L), "lambda": measures.lambdas, "alpha": measures.alphas,
                 "log10_alpha": measures.log_alphas / LN10}
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
        "sv_index": np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + 1,
        "sigma": np.concatenate(sv_arrays) if sv_arrays else np.array([]),
    })
    model = {"family": family, "L": dims.L, "N": dims.N, "H": dims.H, "H_kv": dims.H_kv,
             "d_head": dims.d_head, "d_ff": dims.d_ff, "activation": dims.activation}
    model.update(model_extra or {})
    matrices, layers = _finite_or_null(matrices), _finite_or_null(layers)
    values = {name: r.value for name, r in results.items()}
    return Analysis(source=source, model=model, options=options,
                    log10_bounds={name: r.log10_value for name, r in results.items()},
                    assumptions=list(assumptions or []),
                    bounds={k: values[k] for k in in_group("bounds") if k in values},
                    matrices=matrices, layers=layers, singular_values=singular_values,
                    baselines={k: values[k] for k in in_group("baselines") if k in values},
                    adaptive_variants={k: values[k] for k in in_group("adaptive_variants") if k in values},
                    from_init=None if from_init is None else {k: r.value for k, r in from_init[1].items()},
                    gap_bound=gap, location=location)


def _with_differences(matrices: pd.DataFrame, layers: pd.DataFrame, measures: ModelMeasures,
                      results: dict[str, BoundResult]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Add the ``W - W0`` columns (``DELTA_COLUMNS``) and the per-layer terms on the differences
    (prefixed ``delta_``)."""
    matrices, layers = matrices.copy(), layers.copy()
    deltas = [mm.delta for mm in measures.matrices]
    matrices["delta_rank"] = [int(kept_singular_values(d, measures.rank_tol).size) for d in deltas]
    for key, attr in (("delta_spectral_norm", "spectral_norm"), ("delta_frobenius_norm", "frobenius_norm"),
                      ("delta_norm_2_1", "norm_2_1"), ("delta_norm_1_1", "norm_1_1")):
        matrices[key] = [getattr(d, attr) for d in deltas]
    adaptive = results["spectral_adaptive"].per_matrix
    matrices["delta_p_star"], matrices["delta_contribution"] = adaptive["p_star"], adaptive["contribution"]
    for result in results.values():
        for key, column in result.per_layer.items():
            layers[f"delta_{key}"] = column
    return matrices, layers
