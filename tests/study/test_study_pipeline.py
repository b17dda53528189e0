"""`specbound study` end to end on the quick grid of one task (11 runs on real data, about a minute
on two cores), and one run of each text task trained to the criterion and measured against
independent recomputations (the head on the observed rows, the margin's normalisation, the
flatness bisection)."""

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
from specbound.study.data import load_task
from specbound.study.grid import HPARAMS, RunConfig, make_grid
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
    rc, out, err = _run("--quick", "--tasks", "fmnist", "--bootstrap", "10", "--out", folder)
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
    grid = make_grid("quick", ("fmnist",))
    assert sorted(runs["run"]) == sorted(c.name for c in grid)
    for c in grid:
        path = folder / "runs" / c.name
        metrics = json.loads((path / "metrics.json").read_text())
        assert metrics["n_test"] == 10_000 and metrics["n_train"] == c.train_size
        assert metrics["error_gap"] == pytest.approx(metrics["test_error"] - metrics["train_error"])
        margins = np.load(path / "train_margins.npy")
        assert metrics["train_error"] == pytest.approx(float((margins <= 0).mean()), abs=1e-6)
        # What the code guarantees, however many runs converge: `converged` is the criterion applied
        # to the final whole-training-set evaluation (the one recorded here), and a run that missed it
        # ran to its step cap.
        assert metrics["converged"] == (metrics["train_error"] <= 0.01 or metrics["train_loss"] <= 0.01)
        if metrics["converged"]:
            assert metrics["steps"] <= c.max_steps and metrics["margin"] > 0
            assert metrics["margin"] == pytest.approx(
                metrics["margin_logit"] / (metrics["head_lipschitz"] * metrics["row_norm_max"])
            )
        else:
            assert metrics["steps"] == c.max_steps
        assert bool(runs.set_index("run").loc[c.name, "converged"]) == metrics["converged"]
        assert metrics["row_norm_max"] > 1.5  # LayerNorm rows: nowhere near unit vectors
        for sub in ("init", "model"):
            assert (path / sub / "config.json").exists() and (path / sub / "model.safetensors").exists()
    # every missed run is listed among the excluded ones (and test_correlations_... checks that the
    # correlations count only the converged ones)
    excluded = (folder / "report.md").read_text().split("### Runs that missed the criterion (excluded)")[1]
    excluded = excluded.split("\n## ")[0]
    assert all(name in excluded for name in runs.loc[~runs["converged"].astype(bool), "run"])
    assert ("None: every run met it." in excluded) == bool(runs["converged"].all())
    assert not [p for p in (folder / "runs").iterdir() if p.name.startswith(".")]  # no temp folders


def test_analysis_is_the_analyze_code_path(quick):
    folder = quick[0]
    c = make_grid("quick", ("fmnist",))[0]
    path = folder / "runs" / c.name
    metrics = json.loads((path / "metrics.json").read_text())
    stored = json.loads((path / "analysis.json").read_text())
    fresh = specbound.analyze(path / "model", init=path / "init", n=c.train_size, margin=metrics["margin"], threads=1)
    assert stored["bounds"] == pytest.approx(fresh.bounds, rel=1e-12)
    assert stored["from_init"] == pytest.approx(fresh.from_init, rel=1e-12)
    assert stored["gap_bound"]["bounds"]["spectral_adaptive"]["gap"] == pytest.approx(
        fresh.gap_bound["bounds"]["spectral_adaptive"]["gap"], rel=1e-12
    )
    assert stored["model"]["family"] == "vit"


def test_correlations_use_only_converged_runs_and_carry_intervals(runs, corr):
    n_ok = int(runs["converged"].sum())
    # The input this test needs: a tau over at least two runs.  Not a criterion's edge: the eight
    # quick fmnist runs meet the criterion in 218-546 of their 1,000 steps (one torch thread, as the
    # study's workers run; two runs tried at two threads took 312 and 308), so fewer than two would
    # mean the quick grid has stopped training, not a hair's difference.
    assert n_ok >= 2, runs[["run", "converged", "steps", "train_error", "train_loss"]]
    assert {"value", "value_lo", "value_hi"} <= set(corr.columns)
    assert {"overall", *HPARAMS, "Psi", "K", "sign_error_max", "sign_error_mean"} <= set(corr["statistic"])
    overall = corr[(corr["statistic"] == "overall") & (corr["scope"] == "fmnist")]
    assert (overall["groups"] <= n_ok).all() and overall["groups"].max() == n_ok
    finite = corr.dropna(subset=["value"])
    taus = finite[~finite["statistic"].str.startswith(("K", "sign"))]
    assert ((taus["value"] >= -1) & (taus["value"] <= 1)).all()
    both = finite.dropna(subset=["value_lo", "value_hi"])
    assert (both["value_lo"] <= both["value_hi"] + 1e-12).all()
    assert {
        "spectral_adaptive",
        "edelman",
        "gap:spectral_adaptive",
        "pacbayes_flatness",
        "inverse_margin",
        "pacbayes_init",
    } <= set(corr["measure"])


def test_report_tables_and_figures(quick, runs):
    folder, out, err = quick
    report = (folder / "report.md").read_text()
    assert "## fmnist: each measure against the error gap" in report and "| spectral_adaptive |" in report
    assert "### Runs that missed the criterion (excluded)" in report and "p* along each base point" in report
    for name in ("bounds_vs_gap_fmnist.png", "psi_per_axis.png", "pstar_by_depth.png"):
        assert (folder / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (folder / "figures" / name).with_suffix(".pdf").exists()
    pstar = pd.read_csv(folder / "pstar.csv")
    assert "log10_downstream_factor" in pstar and not any("alpha" in c for c in pstar.columns)
    assert set(pstar["run"]) == set(runs["run"]) and ((pstar["p_star"] >= 0) & (pstar["p_star"] <= 2)).all()
    assert "robust sign-error" in out and "met the training criterion" in out
    assert "a smoke test: the quick grid" in out  # its numbers are not findings
    n = len(make_grid("quick", ("fmnist",)))
    assert f"[{n}/{n}]" in err
    study = json.loads((folder / "study.json").read_text())
    assert study["trained"] == n and study["bootstrap"] == 10


def test_rerun_reuses_every_run_and_reanalyses_a_missing_analysis(quick, runs):
    folder = quick[0]
    victim = folder / "runs" / runs["run"].iloc[0] / "analysis.json"
    victim.unlink()
    result = run_study(folder, grid="quick", tasks=("fmnist",), figures=False, bootstrap=10, log=lambda line: None)
    assert result.timing["trained"] == 0 and result.timing["analysed"] == 1
    assert victim.exists()
    again = result.runs.set_index("run").sort_index()
    before = runs.set_index("run").sort_index()
    pd.testing.assert_series_equal(again["spectral_adaptive"], before["spectral_adaptive"])


def test_quick_study_writes_growth_exponents_that_match_a_fit_by_hand(quick, runs):
    folder, out, _ = quick
    scaling = pd.read_csv(folder / "scaling.csv")
    assert list(scaling.columns) == [
        "task",
        "bound",
        "axis",
        "slope",
        "slope_lo",
        "slope_hi",
        "pooled",
        "pooled_lo",
        "pooled_hi",
        "groups",
        "clusters",
    ]
    table = scaling.set_index(["task", "bound", "axis"])
    for scope in ("fmnist", "all"):
        for bound in ("spectral_adaptive", "edelman"):
            for axis in ("depth", "width"):
                row = table.loc[(scope, bound, axis)]
                assert np.isfinite(row[["slope", "slope_lo", "slope_hi"]].to_numpy(dtype=float)).all(), row
                assert row["slope_lo"] <= row["slope"] <= row["slope_hi"] and row["clusters"] == 2
        # the parameter count is depth x width^2 in the analysed matrices: exponents 1 and 2
        assert table.loc[(scope, "param_count", "depth"), "slope"] == pytest.approx(1.0, abs=1e-9)
        assert table.loc[(scope, "param_count", "width"), "slope"] == pytest.approx(2.0, abs=1e-9)
    ok = runs[runs["converged"]]
    for axis in ("depth", "width"):  # by hand: a line through each seed's pair of runs, then the median
        keys = [h for h in HPARAMS if h != axis] + ["seed"]
        slopes = [
            np.polyfit(np.log(g[axis]), np.log(g["spectral_adaptive"]), 1)[0]
            for _, g in ok.groupby(keys)
            if g[axis].nunique() > 1
        ]
        assert table.loc[("fmnist", "spectral_adaptive", axis), "slope"] == pytest.approx(np.median(slopes), rel=1e-9)
        # two runs a group: each group's slope is the pair's, and the pooled within-group slope is their
        # average weighted by the squared spread of log x (the same spread in every group: the mean)
        assert table.loc[("fmnist", "spectral_adaptive", axis), "pooled"] == pytest.approx(np.mean(slopes), rel=1e-9)
    assert set(runs["cluster"]) == {"fmnist/0/A", "fmnist/1/A"} and set(runs["base"]) == {"A"}
    report = (folder / "report.md").read_text()
    assert "## How each bound grows with depth and width" in report and "### growth exponent in width" in report
    assert "not a generalisation guarantee" in report and "growth exponents, all tasks" in out
    assert (folder / "figures" / "bounds_vs_depth_width.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## p* along each base point's depth axis" in report and "| fmnist | A | 2 |" in report


def test_report_only_rebuilds_everything_from_runs_csv(quick, tmp_path):
    """A folder holding only runs.csv and pstar.csv (no run folders) gets the same statistics back."""
    folder = quick[0]
    (tmp_path / "runs.csv").write_bytes((folder / "runs.csv").read_bytes())
    pstar = pd.read_csv(folder / "pstar.csv")  # as written before the downstream factor was renamed
    pstar.rename(columns={"log10_downstream_factor": "log10_alpha"}).to_csv(tmp_path / "pstar.csv", index=False)
    replicates = json.loads((folder / "study.json").read_text())["bootstrap"]  # another test re-reports with 10
    rc, out, err = _run("--report-only", "--bootstrap", replicates, "--no-figures", "--out", tmp_path)
    assert rc == 0, err
    assert "re-reporting 11 runs" in err and not (tmp_path / "runs").exists()
    for name in ("correlations.csv", "scaling.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / name), pd.read_csv(folder / name), rtol=1e-12)
    report = (tmp_path / "report.md").read_text()
    assert "rebuilt from the stored runs.csv and pstar.csv alone" in report and "Grid `quick`" in report
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "pstar.csv"), pstar)  # today's column names
    (tmp_path / "pstar.csv").unlink()
    rc, _, err = _run("--report-only", "--bootstrap", "5", "--no-figures", "--out", tmp_path)
    assert rc == 0 and "no pstar.csv" in err and "No per-matrix table" in (tmp_path / "report.md").read_text()
    rc, _, err = _run("--report-only", "--out", tmp_path / "empty")
    assert rc == 2 and "no " in err and "runs.csv" in err
    (tmp_path / "other").mkdir()
    pd.read_csv(folder / "runs.csv").drop(columns=["seed", "n_test"]).to_csv(tmp_path / "other" / "runs.csv")
    rc, _, err = _run("--report-only", "--out", tmp_path / "other")
    assert rc == 2 and "lacks the column(s) seed, n_test" in err and len(err.strip().splitlines()) == 1


def test_estimate_of_the_deep_grid_from_the_quick_runs(quick):
    rc, out, err = _run("--grid", "quick", "--seeds", "0,1,2", "--estimate", "--tasks", "fmnist", "--out", quick[0])
    assert rc == 0, err
    assert "ESTIMATE" in out and "CPU s" in out and "runs to do" in out
    rc, _, err = _run("--quick", "--grid", "deep", "--out", quick[0])
    assert rc == 2 and "--quick is --grid quick" in err


@pytest.mark.parametrize("task", ["langid", "fortunes"])
def test_text_task_trains_to_the_criterion_and_measures_honestly(task, tmp_path):
    import torch

    from specbound.study.models import forward_with_rows
    from specbound.study.train import FLAT_BRACKET, FLAT_STEPS, FLAT_TARGET, flatness_sigma, to_tensor, train_run

    torch.set_num_threads(1)
    # Easy on purpose: 32 examples, width 64, a gentle lr.  Such runs meet the criterion (no training
    # mistake) in 70-350 steps on every seed and thread count tried, so the 2,000-step cap leaves a
    # margin of more than 5x: the test checks the measurements, not where a training run lands.
    c = RunConfig(
        task=task,
        depth=1,
        width=64,
        train_size=32,
        lr=2e-3,
        batch_size=16,
        weight_decay=0.0,
        dropout=0.0,
        seed=0,
        max_steps=2000,
    )
    data = load_task(task)
    metrics = train_run(c, data, tmp_path)
    assert metrics["converged"] and (metrics["train_error"] <= 0.01 or metrics["train_loss"] <= 0.01), metrics
    assert metrics["steps"] < c.max_steps and metrics["train_error"] == 0.0
    import transformers

    net = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "model").eval()
    x, y = data.train_subset(c.train_size, 0)
    xt = to_tensor(data, x)
    with torch.no_grad():
        logits, rows = forward_with_rows(net, task, xt)
        head = net.classifier(torch.tanh(net.bert.pooler.dense(rows)))  # the head applied to the observed rows
    np.testing.assert_allclose(head.numpy(), logits.numpy(), rtol=1e-4, atol=1e-5)
    norms = torch.linalg.vector_norm(rows.double(), dim=1).numpy()
    assert metrics["row_norm_max"] == pytest.approx(norms.max(), rel=1e-5)
    margins = np.load(tmp_path / "train_margins.npy")
    assert metrics["margin_logit"] == pytest.approx(float(np.quantile(margins, 0.1)), rel=1e-5)
    assert metrics["margin"] * metrics["head_lipschitz"] * metrics["row_norm_max"] == pytest.approx(
        metrics["margin_logit"]
    )
    # head_lipschitz is a Lipschitz constant of every f_y - f_j in the row: checked on all pairs of rows
    f = logits.double().numpy()
    d = f[:, :, None] - f[:, None, :]  # (n, C, C)
    change = np.abs(d[:, None] - d[None, :]).max(axis=(2, 3))  # (n, n)
    distance = np.linalg.norm(rows.double().numpy()[:, None] - rows.double().numpy()[None, :], axis=2)
    assert np.all(change <= metrics["head_lipschitz"] * distance + 1e-5)
    # flatness: the bisection's sigma keeps the error within the target, and the other end of its
    # final bracket (one bisection width above, on log sigma) does not: the invariant it keeps
    yt = torch.from_numpy(y)
    steps = 12
    found = flatness_sigma(net, data, xt, yt, seed=0, steps=steps)
    assert found["sigma_censored"] == 0
    # the run's own 10-step bisection on the same examples and draws: 12 steps only refine its bracket
    width = math.log(FLAT_BRACKET[1]) - math.log(FLAT_BRACKET[0])
    assert metrics["sigma_flat"] <= found["sigma_flat"] * (1 + 1e-12)
    assert found["sigma_flat"] < metrics["sigma_flat"] * math.exp(width / 2**FLAT_STEPS) * (1 + 1e-12)
    assert found["flat_error_at_sigma"] <= found["flat_base_error"] + FLAT_TARGET
    upper = math.exp(math.log(found["sigma_flat"]) + width / 2**steps)
    above = flatness_sigma(net, data, xt, yt, seed=0, steps=0, bracket=(upper, upper))
    assert above["sigma_censored"] == -1  # the bracket's upper end raises the error by more than the target


def test_runs_as_dask_tasks_on_a_local_cluster(tmp_path):
    """--workers: each run is a Dask task; a run that misses its (tiny) step cap is recorded,
    listed as excluded, and the report is still written.  One worker process: the two runs are
    still two tasks, and a second worker would only add its own torch import (half this test's
    CPU time); two processes writing one run store at once is what the quick study does."""
    pytest.importorskip("dask.distributed")
    base = dict(
        task="fmnist",
        depth=1,
        width=16,
        train_size=64,
        lr=3e-3,
        batch_size=32,
        weight_decay=0.0,
        dropout=0.0,
        max_steps=4,
    )
    grid = [RunConfig(seed=s, **base) for s in (0, 1)]
    result = run_study(tmp_path, grid=grid, workers=1, figures=False, bootstrap=5, log=lambda line: None)
    assert result.timing["trained"] == 2 and result.timing["dask"] == "LocalCluster(1)"
    assert sorted(result.runs["run"]) == sorted(c.name for c in grid)
    assert not result.runs["converged"].any() and result.correlations.empty
    report = (tmp_path / "report.md").read_text()
    assert all(c.name in report for c in grid)  # listed among the runs that missed the criterion


def test_study_imports_no_torch_in_the_calling_process():
    code = (
        "import sys, specbound.cli, specbound.study.pipeline, specbound.study.report; "
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]; assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_usage_errors(tmp_path):
    (tmp_path / "file").write_text("")
    rc, _, err = _run("--out", tmp_path / "file")
    assert rc == 2 and "is a file" in err
    rc, _, err = _run("--tasks", "cifar", "--out", tmp_path / "x")
    assert rc == 2 and "tasks must be among" in err
    rc, _, err = _run("--seeds", "a,b", "--out", tmp_path / "y")
    assert rc == 2 and "--seeds expects" in err
    rc, _, err = _run("--workers", "2", "--scheduler", "tcp://x:1", "--out", tmp_path / "z")
    assert rc == 2 and "not both" in err


def test_the_criterion_counts_mistakes_exactly_and_is_inclusive():
    """k mistakes in 100 k examples are an error of exactly 0.01, which meets the 0.01 criterion
    (1 - accuracy would be 0.010000000000000009 and miss it); one more mistake misses it."""
    import torch

    from specbound.study.train import CRITERION_ERROR, evaluate, meets_criterion

    class Fixed(torch.nn.Module):  # a model whose logits are its input (fmnist-style pixel_values)
        def forward(self, pixel_values):
            return type("Out", (), {"logits": pixel_values.flatten(1)})()

    task = type("Task", (), {"name": "fmnist"})()
    for n, wrong in ((100, 1), (300, 3), (1000, 10), (100, 2)):
        y = torch.zeros(n, dtype=torch.long)
        logits = torch.tensor([[5.0, 0.0]] * n)
        logits[:wrong] = torch.tensor([0.0, 5.0])  # `wrong` mistakes
        result = evaluate(Fixed(), task, logits[:, None, :], y)
        assert result["error"] == wrong / n
        assert meets_criterion(result) == (wrong / n <= CRITERION_ERROR) == (wrong * 100 <= n)
