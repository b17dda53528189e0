"""specbound bench --scenario miniatures, on a tiny family (the real one takes minutes)."""

import json

from specbound.bench import format_miniatures_bench, run_miniatures_bench
from specbound.cli import main


def test_miniatures_bench_reports_totals_and_every_checkpoint(tmp_path):
    report = run_miniatures_bench(depths=(1, 2), widths=(64, 128), workdir=str(tmp_path))
    assert report["checkpoints"] == 4 and len(report["per_checkpoint"]) == 4
    assert [(r["L"], r["N"]) for r in report["per_checkpoint"]] == [(1, 64), (1, 128), (2, 64), (2, 128)]
    assert report["max_relative_bound_difference_vs_dense"] < 1e-10  # same bounds as the dense method
    assert report["speedup_vs_dense"] == report["dense_seconds"] / report["sweep_seconds"]
    json.dumps(report)  # the --format json document
    text = format_miniatures_bench(report)
    assert "speedup vs dense" in text and "per checkpoint median" in text
    assert len(text.splitlines()) == 10 + 1 + 4
    assert list(tmp_path.iterdir()) == []  # the family and the store lived in a temporary folder


def test_bench_scenarios_on_the_command_line(capsys, monkeypatch):
    import specbound.bench

    monkeypatch.setattr(specbound.bench, "run_miniatures_bench", lambda **kw: {"called": kw})
    monkeypatch.setattr(specbound.bench, "format_miniatures_bench", lambda r: f"miniatures {r}")
    assert main(["bench", "--scenario", "miniatures", "--threads", "1"]) == 0
    assert "miniatures {'called': {'threads': 1, 'workdir': None}}" in capsys.readouterr().out
    assert main(["bench", "--scenario", "nope"]) == 2
