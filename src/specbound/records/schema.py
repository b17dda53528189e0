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
    """Undo :func:`json_number`'s strings for non-finite floats."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def from_json_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: from_json_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_tree(v) for v in value]
    return from_json_number(value)
