"""The stable schema of an analysis: the columns of its tables and the JSON conversions of its values
(schema version 1; documented key by key in docs/schema.md).

A float beyond float64 is ``inf`` in memory, ``null`` in JSON and in the tables; its ``log10`` is kept
(``log10_bounds``, the ``log10_*`` columns), so no output ever holds an Infinity.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

SCHEMA_VERSION = 1

MATRIX_COLUMNS = [
    "layer", "head", "role", "tensors", "rows", "cols", "rank", "spectral_norm", "frobenius_norm",
    "nuclear_norm", "stable_rank", "norm_2_1", "norm_1_1", "alpha", "gamma", "scale", "p_star",
    "contribution", "c_p0", "c_p2", "p_continuous", "contribution_continuous", "c_p1", "sv_method",
    "sv_rel_error_bound", "log10_alpha", "log10_scale", "argmax_offset",
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
DELTA_COLUMNS = ["delta_rank", "delta_spectral_norm", "delta_frobenius_norm", "delta_norm_2_1",
                 "delta_norm_1_1", "delta_p_star", "delta_contribution"]


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
    """A number as schema 1 writes it: non-finite floats are null, or the strings ``"inf"``,
    ``"-inf"``, ``"nan"`` (a store's ``record.json`` bounds; some schema 1 documents), read as floats."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def read_table(name: str, table: pd.DataFrame) -> pd.DataFrame:
    """A saved table (an analysis folder's or a store record's) in the columns of :data:`TABLE_NAMES`:
    the singular values' index column is ``sv_index``, which schema 1 files may also call ``index``.
    Every reader of saved tables goes through here: the one place a spelling of the format is read."""
    if name == "singular_values" and "index" in table.columns and "sv_index" not in table.columns:
        return table.rename(columns={"index": "sv_index"})
    return table


def from_json_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: from_json_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_tree(v) for v in value]
    return from_json_number(value)
