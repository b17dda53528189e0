"""Your own metrics: a metrics.json beside a checkpoint and `sweep --metrics FILE` are carried into
the records (not into their keys); `scaling` and `report` give Kendall's tau of every bound with
each metric, checked against a count of concordant and discordant pairs."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import numpy as np
import pytest
from support.tiny_models import TINY_PATTERN

import specbound.report.html as html
import specbound.report.plots as plots
from specbound import SpecboundError
from specbound.cli import main
from specbound.report.metrics import figure_metrics, metric_correlations
from specbound.sweep.metrics import match_metrics, read_metrics_file
from specbound.sweep.store import Store


def _tau(x, y) -> float:
    """Kendall's tau by counting pairs (no ties here: tau-a = tau-b)."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    s = sum(np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in pairs)
    return s / len(pairs)


@pytest.fixture(scope="module")
def metrics_store(tiny_family, tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    family = root / "family"
    shutil.copytree(tiny_family, family)
    folders = sorted(p for p in family.iterdir() if p.is_dir())
    # three checkpoints carry a metrics.json (a string entry is left out), the other three get theirs from a CSV
    for i, folder in enumerate(folders[:3]):
        (folder / "metrics.json").write_text(json.dumps({"eval_loss": 0.1 * (i + 1) ** 2, "note": "x"}))
    rows = ["source,eval_loss,accuracy"] + [
        f"{f.name},{0.5 + 0.3 * i},{0.9 - 0.1 * i}" for i, f in enumerate(folders[3:])
    ]
    (root / "metrics.csv").write_text("\n".join(rows) + "\n")
    store = root / "store"
    assert (
        main(
            [
                "sweep",
                str(family / TINY_PATTERN),
                "--store",
                str(store),
                "--metrics",
                str(root / "metrics.csv"),
                "--no-progress",
            ]
        )
        == 0
    )
    return root, folders


def test_the_metrics_reach_the_records(metrics_store):
    root, folders = metrics_store
    table = Store(root / "store").table().set_index("source")
    by_name = {name.rsplit("/", 1)[-1]: row for name, row in table.iterrows()}
    for i, folder in enumerate(folders[:3]):
        assert by_name[folder.name]["metric_eval_loss"] == pytest.approx(0.1 * (i + 1) ** 2)
        assert math.isnan(by_name[folder.name]["metric_accuracy"])
    for i, folder in enumerate(folders[3:]):
        assert by_name[folder.name]["metric_eval_loss"] == pytest.approx(0.5 + 0.3 * i)
        assert by_name[folder.name]["metric_accuracy"] == pytest.approx(0.9 - 0.1 * i)
    assert "metric_note" not in table


def test_kendall_tau_against_a_pair_count(metrics_store):
    root, _ = metrics_store
    table = Store(root / "store").table()
    corr = metric_correlations(table, ["spectral_adaptive", "edelman"]).set_index(["bound", "metric"])
    for bound in ("spectral_adaptive", "edelman"):
        x, y = table[bound].to_numpy(float), table["metric_eval_loss"].to_numpy(float)
        assert corr.loc[(bound, "eval_loss"), "records"] == 6
        assert corr.loc[(bound, "eval_loss"), "kendall_tau"] == pytest.approx(_tau(x, y))
        assert corr.loc[(bound, "accuracy"), "records"] == 3


def test_scaling_and_report_show_the_correlations(metrics_store, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")

    figures = plots.build_figures(Store(metrics_store[0] / "store"))
    assert "metrics" in figures  # the report's figures include the metrics figure; the other figures are
    # tested in tests/report, so the report below draws only this one (a whole report costs a minute here)
    monkeypatch.setattr(html, "build_figures", lambda store, **kw: {"metrics": figure_metrics(store)})
    root, _ = metrics_store
    capsys.readouterr()
    assert main(["scaling", "--store", str(root / "store")]) == 0
    out = capsys.readouterr().out
    assert "your metrics: Kendall's tau" in out and "eval_loss" in out
    assert main(["report", "--store", str(root / "store"), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Your metrics" in md and (tmp_path / "r" / "figures" / "metrics.png").exists()


def test_bad_metrics_files_are_one_line(tmp_path):
    (tmp_path / "m.csv").write_text("name,loss\na,1\n")
    with pytest.raises(SpecboundError, match="no 'source' column"):
        read_metrics_file(tmp_path / "m.csv")
    (tmp_path / "m.json").write_text("[1, 2]")
    with pytest.raises(SpecboundError, match="must map each source"):
        read_metrics_file(tmp_path / "m.json")
    with pytest.raises(SpecboundError, match="names no checkpoint of this sweep"):
        match_metrics(["runs/a", "runs/b"], {"elsewhere/z": {"loss": 1.0}})
    assert match_metrics(["runs/a", "runs/b"], {"b": {"loss": 1.0}}) == {"runs/b": {"loss": 1.0}}
