"""`specbound study --quick` end to end: it trains the quick grid on the real datasets, and the
records, the correlations, the twins and the resumability are checked here (one run of the grid per
test session, about a minute on two cores)."""

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import specbound
from specbound.cli import main
from specbound.study.grid import HPARAMS, make_grid
from specbound.study.pipeline import run_study

SRC = str(Path(specbound.__file__).resolve().parents[1])


def _run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["study", *map(str, args)])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    folder = tmp_path_factory.mktemp("study") / "quick"
    rc, out, err = _run("--quick", "--out", folder)
    assert rc == 0, err
    return folder, out, err


@pytest.fixture(scope="module")
def runs(quick):
    return pd.read_csv(quick[0] / "runs.csv")


@pytest.fixture(scope="module")
def corr(quick):
    return pd.read_csv(quick[0] / "correlations.csv")


def test_every_run_has_a_complete_record(quick, runs):
    folder = quick[0]
    grid = make_grid("quick")
    assert sorted(runs["run"]) == sorted(c.name for c in grid)
    for c in grid:
        path = folder / "runs" / c.name
        metrics = json.loads((path / "metrics.json").read_text())
        assert metrics["n_test"] >= 10_000 and metrics["n_train"] == c.train_size
        for key in ("train_loss", "test_loss", "train_error", "test_error"):
            assert math.isfinite(metrics[key]) and metrics[key] >= 0
        assert metrics["error_gap"] == pytest.approx(metrics["test_error"] - metrics["train_error"])
        margins = np.load(path / "train_margins.npy")
        assert margins.shape == (c.train_size,)
        assert metrics["train_error"] == pytest.approx(float((margins <= 0).mean()), abs=1e-6)
        assert metrics["margin"] > 0 and metrics["margin_logit"] > 0
        for sub in ("init", "model"):
            assert (path / sub / "config.json").exists() and (path / sub / "model.safetensors").exists()
    assert not [p for p in (folder / "runs").iterdir() if p.name.startswith(".")]  # no temp folders


def test_analysis_is_the_analyze_code_path(quick):
    """A run's analysis.json is what `specbound.analyze` gives on its checkpoint."""
    folder = quick[0]
    c = make_grid("quick")[1]
    path = folder / "runs" / c.name
    metrics = json.loads((path / "metrics.json").read_text())
    stored = json.loads((path / "analysis.json").read_text())
    fresh = specbound.analyze(path / "model", init=path / "init", n=c.train_size, margin=metrics["margin"],
                              threads=1)
    assert stored["bounds"] == pytest.approx(fresh.bounds, rel=1e-12)
    assert stored["baselines"] == pytest.approx(fresh.baselines, rel=1e-12)
    assert stored["from_init"] == pytest.approx(fresh.from_init, rel=1e-12)
    assert stored["gap_bound"]["bounds"]["spectral_adaptive"]["gap"] == pytest.approx(
        fresh.gap_bound["bounds"]["spectral_adaptive"]["gap"], rel=1e-12)
    assert stored["model"]["family"] == ("vit" if c.task == "fmnist" else "bert")


def test_correlations_are_in_range_and_granulated_for_every_hyperparameter(corr):
    assert set(corr["statistic"]) == {"overall", *HPARAMS, "Psi", "twins"}
    finite = corr["tau"].dropna()
    assert len(finite) > 0 and ((finite >= -1) & (finite <= 1)).all()
    adaptive = corr[(corr["measure"] == "spectral_adaptive") & (corr["scope"] == "all")
                    & (corr["gap"] == "error_gap")].set_index("statistic")
    assert (adaptive.loc[list(HPARAMS), "groups"] >= 1).all()  # every hyper-parameter has a ranked group
    assert {"spectral_adaptive", "edelman", "bft", "nbs", "param_count", "gap:spectral_adaptive",
            "spectral_adaptive[W-W0]"} <= set(corr["measure"])


def test_fewer_examples_trained_longer_has_the_larger_gap(runs):
    for task, sub in runs.groupby("task"):
        base = sub[(sub["depth"] == 1) & (sub["width"] == 32) & (sub["weight_decay"] == 0)]
        overfit = base[(base["train_size"] == 192) & (base["epochs"] == 40)].iloc[0]
        twin = base[(base["train_size"] == 768) & (base["epochs"] == 10)].iloc[0]
        assert overfit["steps"] == twin["steps"]  # same optimisation budget, a quarter of the data
        assert overfit["error_gap"] > twin["error_gap"] + 0.05, task
        assert overfit["loss_gap"] > twin["loss_gap"], task


def test_report_and_figures(quick):
    folder, out, err = quick
    report = (folder / "report.md").read_text()
    assert "Kendall tau against the error gap" in report and "| spectral_adaptive |" in report
    for name in ("measures_vs_gap.png", "gap_bounds_vs_gap.png", "headline.png"):
        assert (folder / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Kendall tau" in out and "spectral_adaptive" in out and "twins" in out
    assert "[12/12]" in err  # progress lines on stderr
    study = json.loads((folder / "study.json").read_text())
    assert study["command"] == f"specbound study --quick --out {folder}" and study["trained"] == 12


def test_rerun_reuses_every_run_and_reanalyses_a_missing_analysis(quick, runs):
    folder = quick[0]
    victim = folder / "runs" / runs["run"].iloc[0] / "analysis.json"
    victim.unlink()
    result = run_study(folder, grid="quick", figures=False, log=lambda line: None)
    assert result.timing["trained"] == 0 and result.timing["analysed"] == 1
    assert victim.exists()
    again = result.runs.set_index("run").sort_index()
    before = runs.set_index("run").sort_index()
    pd.testing.assert_series_equal(again["spectral_adaptive"], before["spectral_adaptive"])


def test_study_imports_no_torch_in_the_calling_process():
    code = ("import sys, specbound.cli, specbound.study.pipeline, specbound.study.report; "
            "heavy = [m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]; assert not heavy, heavy")
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_usage_errors(tmp_path):
    (tmp_path / "file").write_text("")
    rc, _, err = _run("--out", tmp_path / "file")
    assert rc == 2 and "is a file" in err
    rc, _, err = _run("--tasks", "cifar", "--out", tmp_path / "x")
    assert rc == 2 and "tasks must be among" in err
