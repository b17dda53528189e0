"""Comparing two analyses of the same weights read different ways: every number of their JSON
documents, minus where the weights came from (the source, its location, each matrix's tensor names,
which an exporter or a wrapper may prefix) and, where asked, the family's name."""

import json
import math

import pytest


def numbers(result, *, family: bool = True) -> dict:
    """The analysis' JSON document without its provenance (and without ``model.family`` when
    ``family`` is False: e.g. llama vs llama_gguf, the same blocks under two names)."""
    doc = json.loads(result.to_json())
    doc.pop("source")
    doc.pop("location", None)
    if not family:
        doc["model"].pop("family")
    for row in doc["matrices"]:
        row.pop("tensors", None)
    return doc


def assert_same_numbers(a, b, rel=1e-12, *, family: bool = True):
    """Every key equal, every finite float within ``rel`` (relative), everything else equal."""
    def walk(x, y, where):
        if isinstance(x, dict):
            assert sorted(x) == sorted(y), where
            for k in x:
                walk(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, list):
            assert len(x) == len(y), where
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{where}[{i}]")
        elif isinstance(x, float) and isinstance(y, float) and math.isfinite(x):
            assert y == pytest.approx(x, rel=rel, abs=1e-300), where
        else:
            assert x == y, where
    walk(numbers(a, family=family), numbers(b, family=family), "")
