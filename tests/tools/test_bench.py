"""The benchmark's synthetic checkpoints are real checkpoints (they load, bf16 is rounded as torch
rounds it), and specbound bench --scenario miniatures on a tiny family (the real one takes minutes)."""

import json

import numpy as np
import pytest

import specbound
from specbound.tools.bench import (_to_bf16, format_miniatures_bench, run_miniatures_bench, write_bert_checkpoint,
                             write_llama_checkpoint)
from specbound.cli import main


def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    x[:4] = [0.0, -0.0, 1.0, 3.140625]
    ours = _to_bf16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


def test_small_llama_checkpoint_analyses(tmp_path):
    folder, largest = write_llama_checkpoint(tmp_path / "llama", L=2, N=64, H=4, H_kv=2, d_ff=96)
    result = specbound.analyze(folder, threads=1)
    assert result.model["family"] == "llama" and result.model["H_kv"] == 2 and result.model["L"] == 2
    assert set(result.matrices["role"]) == {"QK", "OV", "FF_gate", "FF_up", "FF_out"}
    layer_params = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 96 + 2 * 64
    assert largest >= 2 * layer_params  # bf16 payload plus the header


def test_small_bert_checkpoint_analyses(tmp_path):
    folder = write_bert_checkpoint(tmp_path / "bert", L=2, N=64, H=4, d_ff=128)
    dense = specbound.analyze(folder, threads=1, method="dense")
    fast = specbound.analyze(folder, threads=1)
    for name, value in dense.bounds.items():
        assert fast.bounds[name] == pytest.approx(value, rel=1e-9)


def test_miniatures_bench_reports_totals_and_every_checkpoint(tmp_path):
    report = run_miniatures_bench(depths=(1, 2), widths=(64, 128), jobs=2, workdir=str(tmp_path))
    assert report["checkpoints"] == 4 and [b["cores"] for b in report["budgets"]] == [1, 2]
    for budget in report["budgets"]:
        rows = budget["per_checkpoint"]
        assert [(r["L"], r["N"]) for r in rows] == [(1, 64), (1, 128), (2, 64), (2, 128)]
        assert budget["max_relative_bound_difference_vs_dense"] < 1e-10  # same bounds as the dense method
        assert budget["speedup_vs_dense"] == budget["dense_seconds"] / budget["sweep_seconds"]
    json.dumps(report)  # the --format json document
    text = format_miniatures_bench(report)
    assert "speedup vs dense" in text and "per checkpoint median" in text and "on 2 cores" in text
    assert text.splitlines()[-4].split()[:2] == ["1", "64"] and text.count("x") >= 8
    assert list(tmp_path.iterdir()) == []  # the family and the store lived in a temporary folder


def test_core_budgets():
    from specbound.tools.bench import core_budgets

    assert core_budgets(1) == [1] and core_budgets(4) == [1, 4]
    assert core_budgets(None)[0] == 1


def test_bench_scenarios_on_the_command_line(capsys, monkeypatch):
    import specbound.tools.bench

    monkeypatch.setattr(specbound.tools.bench, "run_miniatures_bench", lambda **kw: {"called": kw})
    monkeypatch.setattr(specbound.tools.bench, "format_miniatures_bench", lambda r: f"miniatures {r}")
    assert main(["bench", "--scenario", "miniatures", "--threads", "1"]) == 0
    assert "miniatures {'called': {'threads': 1, 'jobs': None, 'workdir': None}}" in capsys.readouterr().out
    assert main(["bench", "--scenario", "miniatures", "--jobs", "2"]) == 0
    assert "'jobs': 2" in capsys.readouterr().out
    assert main(["bench", "--scenario", "nope"]) == 2


def test_bert_bench_on_one_and_two_cores(tmp_path):
    """The bert-base scenario's machinery on a tiny shape: every contender at each core budget, the
    results on two cores identical to one core, the same bounds as the dense method."""
    from specbound.tools.bench import format_bench, run_bench

    report = run_bench(repeats=1, jobs=2, workdir=str(tmp_path), shape=dict(L=2, N=64, H=4, d_ff=128))
    assert [b["cores"] for b in report["budgets"]] == [1, 2]
    for budget in report["budgets"]:
        assert budget["identical_to_one_core"] and budget["seconds"] > 0
        assert budget["speedup_vs_dense"] == budget["dense_seconds"] / budget["seconds"]
    assert report["max_relative_bound_difference_vs_dense"] < 1e-10 and report["ff_shape"] == [64, 128]
    json.dumps(report)
    text = format_bench(report)
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[0] for r in rows] == ["1", "2"] and all(r[3].endswith("x") for r in rows)
    assert "64 x 128" in text and "WARNING" not in text
    assert list(tmp_path.iterdir()) == []


def test_large_bench_text_says_what_the_memory_limit_covers():
    from specbound.tools.bench import format_large_bench

    report = dict(scenario="s", threads=1, jobs=1, seconds=90.0, seconds_per_layer=[45.0, 45.0], peak_rss_mb=700.0,
                  rss_limit_mb=1000.0, within_rss_limit=True, ff_sv_methods={"gram": 6})
    assert "per layer: 45.0, 45.0 s" in format_large_bench(report) and "1000 MB: within" in format_large_bench(report)
    report.update(jobs=2, peak_rss_mb=1400.0, within_rss_limit=False)
    text = format_large_bench(report)
    assert "2 layers at a time" in text and "is for one layer at a time" in text and "EXCEEDED" not in text
