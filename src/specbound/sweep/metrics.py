"""Your own numbers for each checkpoint (loss, accuracy, a measured gap), carried into its record so
that ``specbound scaling`` and ``report`` can correlate every bound with them.

Two ways in: a ``metrics.json`` beside the checkpoint (in its folder, or in the folder of a weights
file), a JSON object whose number-valued entries are taken (``{"eval_loss": 0.41, "accuracy":
0.87}``; strings, lists and nested objects are left out); and ``specbound sweep --metrics FILE`` for
a whole sweep, a CSV with a ``source`` column and one column per metric, or a JSON object mapping each
source to such an object.  A source is matched by its name as the sweep lists it, or by its last path
component when that is unique.  A metric from ``--metrics`` wins over ``metrics.json``'s of the same
name.  Metrics are part of what a record says, not of its key: they are attached when the record is
written.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SpecboundError
from ..io.base import read_regular_file

METRICS_FILE = "metrics.json"
_MAX_BYTES = 16 << 20  # a metrics file is a few numbers; anything this large is not one


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(obj: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in obj.items() if _is_number(v)} if isinstance(obj, dict) else {}


def checkpoint_metrics(target: str | Path) -> dict[str, float]:
    """The number-valued entries of the ``metrics.json`` beside a checkpoint (``{}`` when there is
    none); a metrics.json that is not a JSON object is one line."""
    path = Path(target)
    folder = path if path.is_dir() else path.parent
    file = folder / METRICS_FILE
    if not file.is_file():
        return {}
    doc = _read_json(file)
    if not isinstance(doc, dict):
        raise SpecboundError(
            f"{file} holds a JSON {type(doc).__name__}; a metrics.json is an object of numbers, "
            f'e.g. {{"eval_loss": 0.41, "accuracy": 0.87}}'
        )
    return _numbers(doc)


def read_metrics_file(path: str | Path) -> dict[str, dict[str, float]]:
    """``{source: {metric: value}}`` from ``--metrics FILE``: a CSV (a ``source`` column, one column per
    metric; empty cells left out) or a JSON object of objects."""
    path = Path(path)
    if not path.is_file():
        raise SpecboundError(f"--metrics {path}: no such file; pass a CSV with a 'source' column or a JSON object")
    if path.suffix.lower() == ".json":
        doc = _read_json(path)
        if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
            raise SpecboundError(
                f"--metrics {path} must map each source to an object of numbers, e.g. "
                f'{{"runs/step-100": {{"eval_loss": 0.41}}}}'
            )
        return {str(k): _numbers(v) for k, v in doc.items()}

    data = read_regular_file(path, _MAX_BYTES, "metrics file", "pass a CSV with a 'source' column")
    try:
        table = pd.read_csv(io.BytesIO(data))
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError) as exc:
        raise SpecboundError(
            f"cannot read --metrics {path} as CSV ({type(exc).__name__}: {str(exc)[:120]}); "
            f"pass a CSV with a 'source' column and one column per metric"
        ) from None
    if "source" not in table.columns:
        raise SpecboundError(
            f"--metrics {path} has no 'source' column (found {', '.join(map(str, table.columns))}); "
            f"name the checkpoint of each row in a column 'source'"
        )
    numeric = [c for c in table.columns if c != "source" and pd.api.types.is_numeric_dtype(table[c])]
    if not numeric:
        raise SpecboundError(f"--metrics {path} has no numeric column besides 'source'; add one per metric")
    out: dict[str, dict[str, float]] = {}
    for row in table.to_dict("records"):
        out[str(row["source"])] = {c: float(row[c]) for c in numeric if _is_number(row[c])}
    return out


def match_metrics(names: list[str], metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``metrics`` re-keyed by the source names they belong to: an exact name, else the last path
    component of a name when exactly one source has it.  Entries that match no source are an error
    when none matches at all (a file for another sweep)."""
    by_base: dict[str, list[str]] = {}
    for name in names:
        by_base.setdefault(Path(name.rstrip("/")).name, []).append(name)
    out: dict[str, dict[str, float]] = {}
    for given, values in metrics.items():
        if given in names:
            out[given] = values
        elif len(by_base.get(Path(given.rstrip("/")).name, [])) == 1:
            out[by_base[Path(given.rstrip("/")).name][0]] = values
    if metrics and not out:
        sample = ", ".join(list(metrics)[:3])
        raise SpecboundError(
            f"--metrics names no checkpoint of this sweep (it names {sample}, ...; the sweep has "
            f"{', '.join(names[:3])}, ...); name each source as the sweep lists it"
        )
    return out


def _read_json(path: Path) -> Any:
    data = read_regular_file(path, _MAX_BYTES, "metrics file", "write it again as a JSON object of numbers")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SpecboundError(
            f"cannot read {path} as JSON ({type(exc).__name__}: {str(exc)[:120]}); a metrics "
            f"file is a JSON object of numbers"
        ) from None
