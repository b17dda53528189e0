"""Comparing two analyses of the same weights read different ways: every number of their JSON
documents, minus where the weights came from (the source, its location, each matrix's tensor names,
which an exporter or a wrapper may prefix) and, where asked, the family's name."""

import json
import math

import numpy as np
import pytest

from specbound.archs.extract import layer_weights


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


def assert_close_tree(x, y, rel=1e-12, where: str = "") -> None:
    """Two nested dicts / lists with the same keys and lengths: every finite float within ``rel``
    (relative), everything else equal; ``where`` names the first difference."""
    if isinstance(x, dict):
        assert sorted(x) == sorted(y), where
        for k in x:
            assert_close_tree(x[k], y[k], rel, f"{where}.{k}")
    elif isinstance(x, list):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)):
            assert_close_tree(u, v, rel, f"{where}[{i}]")
    elif isinstance(x, float) and isinstance(y, float) and math.isfinite(x):
        assert y == pytest.approx(x, rel=rel, abs=1e-300), where
    else:
        assert x == y, where


def assert_same_numbers(a, b, rel=1e-12, *, family: bool = True):
    """Every key equal, every finite float within ``rel`` (relative), everything else equal."""
    assert_close_tree(numbers(a, family=family), numbers(b, family=family), rel)


def assert_same_layer_weights(a, b, layers: int, *, atol: float = 1e-9, ordered: bool = True) -> None:
    """Every layer's q, k, v, o and feed-forward matrices of two opened models (``open_model``) equal
    to ``atol``: the matrices ``layer_weights`` hands the spectra, not only the numbers after them.
    ``ordered``: the feed-forward roles in the same order, not only the same set."""

    for layer in range(layers):
        x = layer_weights(a.spec, a.ckpt, a.dims, a.prefix, layer)
        y = layer_weights(b.spec, b.ckpt, b.dims, b.prefix, layer)
        for role in "qkvo":
            np.testing.assert_allclose(getattr(y, role), getattr(x, role), rtol=0, atol=atol, err_msg=role)
        assert (list(x.ff) == list(y.ff)) if ordered else (sorted(x.ff) == sorted(y.ff)), (
            layer,
            list(x.ff),
            list(y.ff),
        )
        for role in x.ff:
            np.testing.assert_allclose(y.ff[role], x.ff[role], rtol=0, atol=atol, err_msg=role)
