"""The stable schema of an analysis: the columns of its tables and the JSON conversions of its values
(schema version 3; documented key by key in docs/schema.md).

A float beyond float64 is ``inf`` in memory, ``null`` in JSON and in the tables; its ``log10`` is kept
(``log10_bounds``, the ``log10_*`` columns), so no output ever holds an Infinity.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pandas as pd

from ..bounds import REGISTRY

SCHEMA_VERSION = 3
# Version 1 named the downstream factor ``alpha`` (the paper's alpha_l), which readers of WeightWatcher
# take for its power-law exponent; version 2 calls it ``downstream_factor``.  Version 3 adds each row's
# ``lipschitz_factor`` (what Lambda and the sensitivities read) and ``lipschitz_factor_frobenius`` (what the
# Frobenius product reads), so that every norm column is of the row's own matrix: before it, a QK-norm
# head's ``spectral_norm`` held its logit's factor kappa.  Every reader accepts all three.
READABLE_VERSIONS = (1, 2, 3)
RENAMED_COLUMNS = {"alpha": "downstream_factor", "log10_alpha": "log10_downstream_factor"}  # version 1 -> 2
# Version 3's columns, read from a version 1 or 2 table as what that version's propagation and Frobenius
# product read (a QK-norm head's old spectral_norm was its kappa): new column -> the column it came from.
DERIVED_COLUMNS = {"lipschitz_factor": "spectral_norm", "lipschitz_factor_frobenius": "frobenius_norm"}

MATRIX_COLUMNS = [
    "layer",
    "head",
    "role",
    "tensors",
    "rows",
    "cols",
    "rank",
    "spectral_norm",
    "frobenius_norm",
    "nuclear_norm",
    "stable_rank",
    "norm_2_1",
    "norm_1_1",
    "lipschitz_factor",
    "lipschitz_factor_frobenius",
    "downstream_factor",
    "gamma",
    "scale",
    "p_star",
    "contribution",
    "c_p0",
    "c_p2",
    "p_continuous",
    "contribution_continuous",
    "c_p1",
    "sv_method",
    "sv_rel_error_bound",
    "log10_downstream_factor",
    "log10_scale",
    "argmax_offset",
]
# What a row of the singular_values table holds (its ``kind`` column).  Only ``singular_value`` rows are
# singular values; a rotary QK head has ``sigma_bound`` rows (per-index bounds at every offset) and
# ``horn_envelope`` rows (s_i(W_Q) s_i(W_K): bounds on partial sums of powers, *not* per index;
# docs/rotary.md section 3.2), the first ``rank`` of which are the values its S_p sums over.
SV_KINDS = ("singular_value", "sigma_bound", "horn_envelope")


def sv_kinds(singular_values: pd.DataFrame) -> pd.Series:
    """The ``kind`` of every row (tables written before the column: ``singular_value``)."""
    if "kind" in singular_values.columns:
        return singular_values["kind"]
    return pd.Series("singular_value", index=singular_values.index)


LN10 = math.log(10)
# Added when the analysis is measured from initial weights: norms of W - W0 and the adaptive
# bound's choice on them.
DELTA_COLUMNS = [
    "delta_rank",
    "delta_spectral_norm",
    "delta_frobenius_norm",
    "delta_norm_2_1",
    "delta_norm_1_1",
    "delta_p_star",
    "delta_contribution",
]


# Columns an analysis' saved tables and a store's tables carry besides the analysis' own: which record
# and which model each row belongs to, so that tables of many analyses concatenate into one tidy frame.
ID_COLUMNS = ("key", "source")
TABLE_NAMES = ("matrices", "layers", "singular_values")


def json_number(value: Any) -> Any:
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


def json_dict(values: dict[str, Any]) -> dict[str, Any]:
    return {k: json_number(v) for k, v in values.items()}


def json_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_tree(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return json_number(value)


def from_json_number(value: Any) -> Any:
    """A number as schemas 1 and 2 write it: non-finite floats are null, or the strings ``"inf"``,
    ``"-inf"``, ``"nan"`` (a store's ``record.json`` bounds; some schema 1 documents), read as floats."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def read_table(name: str, table: pd.DataFrame) -> pd.DataFrame:
    """A saved table (an analysis folder's or a store record's) in the columns of :data:`TABLE_NAMES`:
    the singular values' index column is ``sv_index``, which schema 1 files may also call ``index``;
    schema 1's ``alpha`` and ``log10_alpha`` are read as ``downstream_factor`` and
    ``log10_downstream_factor`` (:data:`RENAMED_COLUMNS`); a matrices table of schema 1 or 2 gets
    version 3's ``lipschitz_factor`` and ``lipschitz_factor_frobenius`` from the columns that version's
    bounds read for them (:data:`DERIVED_COLUMNS`).  Every reader of saved tables goes through
    here: the one place a spelling of the format is read."""
    if name == "singular_values" and "index" in table.columns and "sv_index" not in table.columns:
        return table.rename(columns={"index": "sv_index"})
    if name in ("matrices", "layers"):
        old = {a: b for a, b in RENAMED_COLUMNS.items() if a in table.columns and b not in table.columns}
        if old:
            table = table.rename(columns=old)
    if name == "matrices":
        missing = {
            new: old for new, old in DERIVED_COLUMNS.items() if new not in table.columns and old in table.columns
        }
        if missing:
            table = table.copy()
            at = table.columns.get_loc("norm_1_1") + 1 if "norm_1_1" in table.columns else len(table.columns)
            for i, (new, old) in enumerate(missing.items()):
                table.insert(at + i, new, table[old])
    return table


def from_json_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: from_json_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_tree(v) for v in value]
    return from_json_number(value)


# --- what Analysis.load accepts ------------------------------------------------------------------
# One check of a saved analysis (summary.json and its tables) against everything its readers use:
# ``str()``, ``to_json()``, ``save()``, the notebook view and the figures.  A folder that passes
# reopens into an Analysis none of them can fail on; one that does not is one line naming the first
# field that is wrong.

_MAX_INT = 2**53  # dimensions and counts: far above any model, exactly a float


def _is_count(value, low: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < _MAX_INT


def _is_finite(value) -> bool:
    """A number a float holds: finite, and (an integer) at most the largest float (compared exactly, no overflow)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and abs(value) <= sys.float_info.max
        and math.isfinite(value)
    )


def _is_bound(value) -> bool:
    return value is None or _is_finite(value) or value in ("inf", "-inf", "nan")  # strings: before 0.2


# summary.json: field -> (what it must be, check)
_MODEL = {
    "family": ("a string", lambda v: isinstance(v, str)),
    **{k: ("a positive integer below 2^53", _is_count) for k in ("L", "N", "H", "H_kv", "d_head", "d_ff")},
}
_OPTIONS = {
    "grid_m": ("a positive integer below 2^53", _is_count),
    "rank_tol": ("a finite number", _is_finite),
    "l_phi": ("a finite number", _is_finite),
    "l_phi_source": ("a string", lambda v: isinstance(v, str)),
    "method": ("a string", lambda v: isinstance(v, str)),
}
_ASSUMPTION = {"name": str, "applies": bool, "kind": str, "effect": str}
_GAP_PARAMETERS = ("n", "margin", "delta", "lead_constant", "confidence_constant")


def _fields_problem(where: str, value, spec: dict) -> str | None:
    if not isinstance(value, dict):
        return f"{where} is {type(value).__name__}, not an object"
    for key, (what, ok) in spec.items():
        if key not in value:
            return f"{where} has no {key!r}"
        if not ok(value[key]):
            return f"{where}[{key!r}] is {str(value[key])[:40]!r}, not {what}"
    return None


def _bounds_problem(doc: dict) -> str | None:
    log10 = doc.get("log10_bounds", {})
    if not isinstance(log10, dict) or not all(v is None or _is_finite(v) for v in log10.values()):
        return "log10_bounds is not an object of finite numbers (or null)"
    for group in ("bounds", "baselines", "adaptive_variants", "from_init"):
        if group not in doc and group != "bounds":
            continue
        values = doc.get(group)
        if not isinstance(values, dict):
            return f"{group} is {type(values).__name__}, not an object"
        for name, value in values.items():
            if group != "from_init" and name not in REGISTRY:
                return f"{group} names the unknown bound {name!r:.40}"
            if not _is_bound(value):
                return f"{group}[{name!r:.40}] is {str(value)[:40]!r}, not a number or null"
    if (
        "spectral_adaptive" in doc["bounds"]
        and not _is_finite(doc["bounds"]["spectral_adaptive"])
        and doc["bounds"]["spectral_adaptive"] is not None
    ):
        return "bounds['spectral_adaptive'] is not a finite number"
    return None


def _gap_problem(gap) -> str | None:
    if gap is None:
        return None
    if (
        not isinstance(gap, dict)
        or not isinstance(gap.get("parameters"), dict)
        or not isinstance(gap.get("bounds"), dict)
    ):
        return "gap_bound lacks its parameters and bounds objects"
    for name in _GAP_PARAMETERS:
        if not _is_finite(gap["parameters"].get(name)):
            return f"gap_bound['parameters'][{name!r}] is not a finite number"
    for name, entry in gap["bounds"].items():
        if not isinstance(entry, dict) or not _is_bound(entry.get("gap")) or not isinstance(entry.get("vacuous"), bool):
            return f"gap_bound['bounds'][{name!r:.40}] lacks a numeric gap and a boolean vacuous"
    return None


def document_problem(doc: Any) -> str | None:
    """Why a decoded ``summary.json`` is not a saved analysis every reader can use, or None."""
    if not isinstance(doc, dict):
        return f"it holds a JSON {type(doc).__name__}, not an object"
    if doc.get("schema_version") not in READABLE_VERSIONS or isinstance(doc.get("schema_version"), bool):
        return (
            f"it has schema version {str(doc.get('schema_version'))[:20]!r}; this specbound reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    if not isinstance(doc.get("source"), str):
        return "it has no string 'source'"
    if doc.get("location") is not None and not isinstance(doc["location"], str):
        return "its 'location' is neither a string nor null"
    problem = (
        _fields_problem("model", doc.get("model"), _MODEL)
        or _fields_problem("options", doc.get("options"), _OPTIONS)
        or _bounds_problem(doc)
        or _gap_problem(doc.get("gap_bound"))
    )
    if problem:
        return problem
    assumptions = doc.get("assumptions", [])
    if not isinstance(assumptions, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(k), kind) for k, kind in _ASSUMPTION.items()) for e in assumptions
    ):
        return "assumptions is not a list of {name, applies, kind, effect} objects"
    return None


# table -> (column -> "int" (integers, no nulls), "int?" (integers or null), "num" (finite numbers),
# "num?" (numbers or null), "str" (text))
_TABLE_COLUMNS = {
    "matrices": {
        "layer": "int",
        "head": "int?",
        "role": "str",
        "rows": "int",
        "cols": "int",
        "rank": "int",
        "p_star": "num",
        "contribution": "num?",
    },
    "layers": {
        "layer": "int",
        "lambda": "num?",
        "downstream_factor": "num?",
        "xi": "num?",
        "adaptive": "num?",
        "adaptive_p0": "num?",
        "adaptive_p1": "num?",
        "adaptive_p2": "num?",
        "adaptive_three_type": "num?",
        "three_type_ff_p_star": "num",
    },
    "singular_values": {"matrix": "int", "layer": "int", "role": "str", "sigma": "num?"},
}


# The text columns of the saved tables (and the identity columns a store or a tidy table adds);
# every other column holds numbers (schema 1's ``alpha`` as strings used to load and re-save).
TEXT_COLUMNS = frozenset({"role", "tensors", "sv_method", "kind", "source", "key", "tower", "stack"})


def column_types_problem(name: str, table: pd.DataFrame) -> str | None:
    """Why a saved table's columns are not of their kinds (a text column holding non-text, any other
    column not numeric: strings, booleans or objects where a number is expected), or None."""
    for column in table.columns:
        values = table[column]
        if column in TEXT_COLUMNS:
            if not all(isinstance(v, str) for v in values.dropna()):
                return f"{name}[{str(column)[:40]!r}] holds values that are not text"
        elif not (pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)):
            return f"{name}[{str(column)[:40]!r}] is not numeric ({values.dtype}) where numbers are expected"
    return None


def table_problem(name: str, table: pd.DataFrame, L: int) -> str | None:
    """Why a saved table is not one every reader can use (columns, their types, layers in
    ``0..L-1``), or None."""
    problem = column_types_problem(name, table)
    if problem:
        return problem
    for column, kind in _TABLE_COLUMNS[name].items():
        if column not in table.columns:
            return f"{name} has no column {column!r}"
        values = table[column]
        if kind == "str":
            if not all(isinstance(v, str) for v in values):
                return f"{name}[{column!r}] holds values that are not text"
            continue
        if not (pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)):
            return f"{name}[{column!r}] is not numeric ({values.dtype})"
        present = values.dropna().to_numpy(dtype=float)
        if not kind.endswith("?") and len(present) != len(values):
            return f"{name}[{column!r}] has missing values"
        if not np.isfinite(present).all():
            return f"{name}[{column!r}] holds an infinity or NaN"
        if kind.startswith("int") and (
            (present != np.round(present)).any() or (np.abs(present) >= _MAX_INT).any() or (present < 0).any()
        ):
            return f"{name}[{column!r}] holds values that are not non-negative integers below 2^53"
    if (table["layer"] >= L).any():
        return f"{name} has layers beyond the model's L = {L}"
    if name == "matrices" and not table["p_star"].between(0, 2).all():
        return "matrices['p_star'] lies outside [0, 2]"
    return None
