"""The result of an analysis: :class:`Analysis`, its tidy tables and bound values, its JSON document,
``save`` and ``load``.

Reports and plots read these records; they never recompute spectra.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from ..atomic import atomic_write
from ..bounds import REGISTRY
from ..errors import SpecboundError, os_errors
from ..io.base import read_regular_file
from .plot import AnalysisPlots
from .schema import (
    ID_COLUMNS,
    SCHEMA_VERSION,
    TABLE_NAMES,
    document_problem,
    from_json_number,
    from_json_tree,
    json_dict,
    json_number,
    json_tree,
    read_table,
    table_problem,
)
from .style import optional_png
from .view import analysis_html, format_summary, short_name


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
    singular_values : DataFrame, long form ``(matrix, layer, head, role, kind, sv_index, sigma)``; the
        computed values only (a factored N x N product's exact zeros are implied by its rank).
        ``kind`` (:data:`~.schema.SV_KINDS`): ``singular_value``; for a rotary QK head ``sigma_bound``
        (per-index bounds at every offset) and ``horn_envelope`` (not singular values).
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
        """The JSON document of ``specbound analyze --format json`` (schema version 2)."""
        rows = []
        for rec in self.matrices.to_dict("records"):
            rec["head"] = None if pd.isna(rec["head"]) else int(rec["head"])
            rec["rows"], rec["cols"] = int(rec["rows"]), int(rec["cols"])  # as the Parquet table has them
            rec["shape"] = [rec["rows"], rec["cols"]]  # schema 1's form, kept
            rec["layer"], rec["rank"] = int(rec["layer"]), int(rec["rank"])
            rows.append({k: json_number(v) for k, v in rec.items()})
        doc = {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "model": self.model,
            "options": {k: json_number(v) for k, v in self.options.items()},
            "bounds": json_dict(self.bounds),
            "baselines": json_dict(self.baselines),
            "adaptive_variants": json_dict(self.adaptive_variants),
            "log10_bounds": json_dict(self.log10_bounds),
            "assumptions": self.assumptions,
            "bound_references": {k: REGISTRY[k].reference for k in self.all_bounds()},
            "layers": [{k: json_number(v) for k, v in r.items()} for r in self.layers.to_dict("records")],
            "matrices": rows,
        }
        if self.from_init is not None:
            doc["from_init"] = json_dict(self.from_init)
        if self.gap_bound is not None:
            doc["gap_bound"] = json_tree(self.gap_bound)
        doc["location"] = self.location
        return doc

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, out_dir: str | Path) -> list[Path]:
        """Write the tables (Parquet and CSV, each with a ``source`` column first) and the summary JSON
        to ``out_dir``, each atomically; :meth:`load` reopens them."""
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
            row = {
                "bound": name,
                "group": bound.group,
                "title": bound.title,
                "reference": bound.reference,
                "value": float(value),
                "log10_value": float(log10[name]) if name in log10 else _log10(value),
            }
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
        adapter = m.get("adapter")
        what = (
            f" (LoRA adapter r={'/'.join(str(r) for r in adapter['ranks'])} merged into "
            f"{short_name(str(adapter['base']))}; from_init = W - W0)"
            if adapter
            else ""
        )
        return (
            f"<specbound.Analysis of {short_name(self.source)}{what}: {m['family']} L={m['L']} N={m['N']}, "
            f"{len(self.matrices)} matrices; {bounds}>"
        )

    def _repr_html_(self) -> str:
        # a small spectrum figure, 600 px wide: legible, about 60 kB
        return analysis_html(self, optional_png(lambda: self.plot.spectra(), dpi=80))


def _log10(value: float) -> float:
    value = float(value)
    if value > 0:
        return math.log10(value)
    return -math.inf if value == 0 else math.nan


# summary.json and each table: bytes, read only from a regular file of at most this size
_SAVED_BYTES = {"summary.json": 256 << 20, "table": 4 << 30}


def _saved_bytes(path: Path, what: str) -> bytes:
    return read_regular_file(
        path, _SAVED_BYTES.get(path.name, _SAVED_BYTES["table"]), what, "write the folder again with Analysis.save"
    )


def _no_constant(name: str):
    raise ValueError(f"the non-standard JSON constant {name}")


def load_analysis(out_dir: str | Path) -> Analysis:
    """The :class:`Analysis` that ``save(out_dir)`` wrote, checked once against everything its
    readers use (:func:`~.schema.document_problem`, :func:`~.schema.table_problem`): an Analysis
    this returns can be printed, saved and serialised; any other folder is one line."""
    folder = Path(out_dir)
    summary = folder / "summary.json"
    if not summary.is_file():
        if (folder / "towers.json").is_file():  # a two-tower model's folder: one analysis per tower below it
            raise SpecboundError(
                f"{folder} holds a two-tower model's analyses (towers.json); open it with "
                f"TowerAnalyses.load, or one tower's subfolder with Analysis.load"
            )
        raise SpecboundError(
            f"{folder} holds no summary.json; pass a folder written by Analysis.save or `specbound analyze --out`"
        )
    try:
        doc = json.loads(_saved_bytes(summary, "analysis summary").decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SpecboundError(
            f"cannot read {summary} ({type(exc).__name__}: {str(exc)[:200]}); write it again with Analysis.save"
        ) from None
    problem = document_problem(doc)
    if problem:
        raise SpecboundError(f"{summary} is not a saved analysis: {problem}; write it again with Analysis.save")
    tables = {}
    for name in TABLE_NAMES:
        path = folder / f"{name}.parquet"
        try:
            table = pd.read_parquet(io.BytesIO(_saved_bytes(path, "analysis table")))
        except SpecboundError:
            raise
        except Exception as exc:  # noqa: BLE001  (pyarrow raises many types for a damaged file)
            raise SpecboundError(
                f"cannot read {path} ({type(exc).__name__}: {str(exc)[:200]}); write the folder "
                f"again with Analysis.save"
            ) from None
        table = read_table(name, table.drop(columns=[c for c in ID_COLUMNS if c in table.columns]))
        problem = table_problem(name, table, doc["model"]["L"])
        if problem:
            raise SpecboundError(
                f"{path} is not a saved analysis table: {problem}; write the folder again with Analysis.save"
            )
        tables[name] = table
    return analysis_from_document(doc, tables)


def analysis_from_document(doc: dict, tables: dict) -> Analysis:
    """The :class:`Analysis` of a checked JSON document (``to_dict()`` without its tables) and its
    tables (``matrices, layers, singular_values``; any ``key``/``source`` columns are dropped):
    what :func:`load_analysis` and a results store's records are reopened with."""
    tables = {
        name: read_table(name, tables[name].drop(columns=[c for c in ID_COLUMNS if c in tables[name].columns]))
        for name in TABLE_NAMES
    }
    log10 = {k: float(v) for k, v in (doc.get("log10_bounds") or {}).items() if v is not None}

    def bounds(values):  # a value beyond float64 (null or a string in the document) -> inf, its log10 kept
        out = {}
        for k, v in (values or {}).items():
            v = from_json_number(v)
            out[k] = (math.inf if math.isfinite(log10.get(k, math.nan)) else math.nan) if v is None else float(v)
        return out

    kwargs = dict(
        source=doc["source"],
        model=doc["model"],
        options={k: from_json_number(v) for k, v in doc["options"].items()},
        bounds=bounds(doc["bounds"]),
        matrices=tables["matrices"],
        layers=tables["layers"],
        singular_values=tables["singular_values"],
        baselines=bounds(doc.get("baselines")),
        adaptive_variants=bounds(doc.get("adaptive_variants")),
        from_init=bounds(doc["from_init"]) if "from_init" in doc else None,
        gap_bound=from_json_tree(doc["gap_bound"]) if "gap_bound" in doc else None,
        location=doc.get("location"),
    )
    # any other field the document carries under its own name (e.g. log10_bounds)
    for f in fields(Analysis):
        if f.name not in kwargs and f.name in doc and f.name not in TABLE_NAMES:
            kwargs[f.name] = from_json_tree(doc[f.name])
    return Analysis(**kwargs)
