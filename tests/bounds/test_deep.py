"""Deep models: bounds exact at any depth (logs), no NaN or Infinity in any output, no RuntimeWarning;
checked against an independent log-space oracle (tests/support/log_oracle.py) at 96 and 200 layers."""

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from support.families import FAMILIES, FAMILY_OF, SAME_PATH_AT_DEPTH, save_family
from support.log_oracle import log_bounds
from support.numpy_bert import row_weights, write_tiny_bert

import specbound
from specbound.records.view import format_summary


def _strict(text):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("L", [96, 200])
def test_deep_bert_matches_the_log_space_oracle(tmp_path, L):
    folder = write_tiny_bert(tmp_path / "deep", seed=0, L=L, N=16, H=2, d_ff=24, std=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning anywhere on the way
        a = specbound.analyze(folder, threads=1)
        text = str(a.to_json())

        summary = format_summary(a)
    rows = []
    for layer in range(L):
        w = row_weights(folder, layer)
        d = 8
        rows += [("QK", w["q"][:, h * d : (h + 1) * d] @ w["k"][:, h * d : (h + 1) * d].T) for h in range(2)]
        rows += [("OV", w["v"][:, h * d : (h + 1) * d] @ w["o"][h * d : (h + 1) * d, :]) for h in range(2)]
        rows += [("FF_in", w["ff_in"]), ("FF_out", w["ff_out"])]
    oracle = log_bounds(rows, L=L, N=16, heads=2)
    assert a.bounds["spectral_adaptive"] == pytest.approx(oracle["adaptive"], rel=1e-9)
    assert math.isinf(a.bounds["edelman"])  # beyond float64 ...
    assert a.log10_bounds["edelman"] == pytest.approx(
        oracle["log_edelman"] / math.log(10), rel=1e-10
    )  # ... exact in logs
    assert a.log10_bounds["spectral_fixed_p2"] == pytest.approx(oracle["log_fixed_p2"] / math.log(10), rel=1e-10)
    doc = _strict(text)
    assert doc["bounds"]["edelman"] is None and doc["log10_bounds"]["edelman"] > 308
    assert all(v is not None and math.isfinite(v) for v in doc["log10_bounds"].values())
    assert f"10^{a.log10_bounds['edelman']:.2f}" in summary and "nan" not in summary.lower()


def test_outputs_hold_no_nan_or_infinity(tmp_path):
    folder = write_tiny_bert(tmp_path / "deep", seed=1, L=96, N=16, H=2, d_ff=24, std=0.5)
    a = specbound.analyze(folder, threads=1)
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a.save(out)
    _strict((out / "summary.json").read_text())
    for name in ("matrices", "layers", "singular_values"):
        cells = set((out / f"{name}.csv").read_text().replace("\n", ",").split(","))
        assert not cells & {"inf", "-inf", "nan", "NaN", "Infinity", "-Infinity"}, name
        table = pd.read_parquet(out / f"{name}.parquet")
        floats = table.select_dtypes(include="float").to_numpy()
        assert not np.isinf(floats).any(), name


def _deep_families() -> list[str]:
    """One model per code path: the test variants (Mistral, Qwen2, Falcon's other layouts) are read by
    the spec of the family they vary, the Gemmas take LLaMA's and Qwen3's paths (SAME_PATH_AT_DEPTH)."""
    return sorted(set(FAMILIES) - set(SAME_PATH_AT_DEPTH) - set(FAMILY_OF))


# one test per family (not one fixture building them all): under pytest-xdist the 200-layer models
# are built and analysed on every worker at once instead of one worker's critical path
@pytest.mark.parametrize("name", _deep_families())
def test_every_shipped_family_gives_finite_bounds_at_depth_200(name, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    save_family(name, tmp_path / name, layers=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = specbound.analyze(tmp_path / name, threads=1)
    if name != "albert":  # ALBERT's test builder fixes its depth (4 layers over 2 shared groups)
        assert a.model["L"] == 200, name
    assert math.isfinite(a.bounds["spectral_adaptive"]), name
    assert all(math.isfinite(v) for v in a.log10_bounds.values()), (name, a.log10_bounds)
    _strict(a.to_json())
