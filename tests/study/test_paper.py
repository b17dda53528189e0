"""``specbound paper``: the paper's depth/width figure and growth slopes on a family of tiny checkpoints
written in the test (L and N read from the models), against a least-squares fit computed here."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats  # noqa: TID253
from support.numpy_bert import write_tiny_bert
from support.one_line import assert_one_line_error, run_cli
from support.tiny_models import save_tiny

from specbound import SpecboundError
from specbound.cli import main
from specbound.records.style import bound_color
from specbound.study.paper import PAPER_BOUNDS, figure_paper, paper_fits, store_points, study_points, verdicts
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store

DEPTHS, WIDTHS = (1, 2, 3), (16, 32)


@pytest.fixture(scope="module")
def bert_grid(tmp_path_factory):
    """A 3 x 2 depth x width grid of tiny random BERT folders (std 0.1, d_ff = 2N)."""
    root = tmp_path_factory.mktemp("paper_grid")
    for L in DEPTHS:
        for N in WIDTHS:
            write_tiny_bert(root / f"L{L}-N{N}", seed=10 * L + N, L=L, N=N, H=4, d_ff=2 * N, std=0.1)
    return root


@pytest.fixture(scope="module")
def paper_run(bert_grid, tmp_path_factory):
    """``specbound paper`` on the grid's folders: ``(out folder, stdout)``."""

    out = tmp_path_factory.mktemp("paper_out")
    rc = main(["paper", *sorted(str(p) for p in bert_grid.iterdir()), "--out", str(out), "--format", "csv"])
    assert rc == 0
    return out


def direct_fit(x, y, group, confidence=0.95):
    """``(slope, low, high)``: ordinary least squares of ``log y`` on ``log x`` and one indicator per
    group, the slope's interval from ``s^2 (X'X)^-1`` and Student's t: the textbook fit, written here."""
    levels = sorted(set(group))
    design = np.column_stack([np.log(x)] + [(np.asarray(group) == g).astype(float) for g in levels])
    beta, *_ = np.linalg.lstsq(design, np.log(y), rcond=None)
    resid = np.log(y) - design @ beta
    dof = len(y) - design.shape[1]
    se = math.sqrt(resid @ resid / dof * np.linalg.inv(design.T @ design)[0, 0])
    half = stats.t.ppf(0.5 + confidence / 2, dof) * se
    return beta[0], beta[0] - half, beta[0] + half


def test_slopes_are_the_least_squares_fit_of_the_stored_bounds(paper_run):
    slopes = pd.read_csv(paper_run / "slopes.csv").set_index(["axis", "bound"])
    table = Store(paper_run / "store").table()
    assert sorted(zip(table["L"], table["N"])) == [(L, N) for L in DEPTHS for N in WIDTHS]  # read from the models
    for axis, other in (("L", "N"), ("N", "L")):
        for bound in PAPER_BOUNDS:
            slope, low, high = direct_fit(
                table[axis].to_numpy(float), table[bound].to_numpy(float), table[other].tolist()
            )
            row = slopes.loc[(axis, bound)]
            np.testing.assert_allclose([row["slope"], row["ci_low"], row["ci_high"]], [slope, low, high], rtol=1e-9)
            assert row["points"] == 6 and row["groups"] == (2 if axis == "L" else 3)
    for name in ("paper.png", "paper.pdf"):
        assert (paper_run / name).stat().st_size > 10_000


def test_the_figure_has_its_layers(paper_run):
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D

    st = Store(paper_run / "store")
    points = store_points(st)
    fits = paper_fits(points)
    fig = figure_paper(points, fits, title="tiny")
    panels = fig.axes
    assert [ax.get_xlabel() for ax in panels] == ["depth L", "width N"]
    for ax, axis, groups in zip(panels, ("L", "N"), (len(WIDTHS), len(DEPTHS))):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
        markers = [ln for ln in ax.get_lines() if ln.get_linestyle() == "None"]
        assert len(lines) == len(PAPER_BOUNDS)  # one fitted line per bound
        assert lines[0].get_zorder() > lines[1].get_zorder()  # the paper's bound drawn over the proxy
        assert len(markers) == len(PAPER_BOUNDS) * groups  # each bound's points, one marker per group
        x_min = min(DEPTHS) if axis == "L" else min(WIDTHS)
        texts = [t.get_text() for t in ax.texts]
        for line, bound in zip(lines, PAPER_BOUNDS):
            fit = fits[(fits["axis"] == axis) & (fits["bound"] == bound)].iloc[0]
            assert to_rgba(line.get_color()) == to_rgba(bound_color(bound))
            x, y = line.get_data()
            np.testing.assert_allclose(y, (x / x_min) ** fit["slope"], rtol=1e-12)
            assert (
                f"grows as {axis}^{fit['slope']:.2f}, 95% interval [{fit['ci_low']:.2f}, {fit['ci_high']:.2f}]" in texts
            )
        # the points: each group's residuals about the pooled line average to one (log residuals to zero)
        for marker in markers:
            x, y = (np.asarray(v, float) for v in marker.get_data())
            bound = next(b for b in PAPER_BOUNDS if to_rgba(bound_color(b)) == to_rgba(marker.get_color()))
            slope = fits[(fits["axis"] == axis) & (fits["bound"] == bound)]["slope"].iloc[0]
            assert abs(np.mean(np.log(y) - slope * np.log(x / x_min))) < 1e-9
        legend = ax.get_legend()
        assert legend is not None and len(legend.get_texts()) == groups  # which marker is which group
    bound_legend = fig.legends[0]
    assert [t.get_text() for t in bound_legend.get_texts()] == [
        "Spectrum-adaptive (Sakai & Imaizumi 2026)",
        "Edelman-style norm proxy",
    ]
    assert all(isinstance(h, Line2D) for h in bound_legend.legend_handles)
    assert fig._suptitle.get_text() == "tiny"


def test_the_cli_prints_the_slopes_and_the_verdicts(paper_run, capsys):
    rc, out, err = run_cli(capsys, "--store", paper_run / "store", "--out", paper_run / "again", command="paper")
    assert rc == 0, err
    lines = verdicts(pd.read_csv(paper_run / "slopes.csv"))
    assert len(lines) == 4 and all(line in out.splitlines() for line in lines)
    assert f"wrote {paper_run / 'again' / 'paper.png'}" in out
    assert (paper_run / "again" / "slopes.csv").read_text() == (paper_run / "slopes.csv").read_text()


def test_a_grid_of_one_shape_is_one_line(bert_grid, tmp_path, capsys):
    for seed in (1, 2):
        write_tiny_bert(tmp_path / f"seed{seed}", seed=seed, L=2, N=16, H=4, d_ff=32, std=0.1)
    run_sweep(expand_sources([str(tmp_path / "seed1"), str(tmp_path / "seed2")]), tmp_path / "store", progress=False)
    rc, out, err = run_cli(capsys, "--store", tmp_path / "store", "--out", tmp_path / "out", command="paper")
    assert_one_line_error(rc, out, err, ["vary neither depth L nor width N", "L=2, N=16", "add checkpoints"])
    assert not (tmp_path / "out" / "paper.png").exists()


def test_too_few_points_for_an_interval_is_one_line(bert_grid, tmp_path, capsys):
    run_sweep(
        expand_sources([str(bert_grid / "L1-N16"), str(bert_grid / "L2-N16")]), tmp_path / "store", progress=False
    )
    rc, out, err = run_cli(capsys, "--store", tmp_path / "store", "--out", tmp_path / "out", command="paper")
    assert_one_line_error(
        rc,
        out,
        err,
        ["too few checkpoints to fit the growth in depth L", "2 usable value(s)", "three or more L values at one N"],
    )


@pytest.mark.parametrize(
    "args, needles",
    [
        ((), ["paper needs checkpoints (SOURCE ...), --store DIR or --study DIR"]),
        (("--study", "nowhere"), ["no runs.csv in nowhere"]),
        (("--study", "s", "--store", "t"), ["pass either it or SOURCEs / --store, not both"]),
    ],
)
def test_bad_requests_are_one_line(args, needles, capsys):
    rc, out, err = run_cli(capsys, *args, command="paper")
    assert_one_line_error(rc, out, err, needles)


def test_an_unknown_bound_is_one_line(paper_run, capsys):
    rc, out, err = run_cli(
        capsys, "--store", paper_run / "store", "--bound", "nope", "--out", paper_run / "x", command="paper"
    )
    assert_one_line_error(rc, out, err, ["unknown bound(s) nope for --bound", "spectral_adaptive"])


def synthetic_runs(law):
    """A one-at-a-time study grid (two tasks, two seeds, three base points) whose bounds follow
    ``law(depth, width, base)`` exactly, with one run that missed the criterion (left out)."""
    rows = []
    bases = [dict(depth=2, width=32, lr=1e-3), dict(depth=4, width=64, lr=3e-3), dict(depth=2, width=64, lr=1e-2)]
    for task in ("a", "b"):
        for seed in (0, 1):
            for b, base in enumerate(bases):
                for change in ({}, {"depth": 6}, {"depth": 3}, {"width": 128}, {"width": 16}):
                    hp = {**base, **change}
                    rows.append(
                        {
                            "task": task,
                            "seed": seed,
                            "train_size": 100,
                            "batch_size": 8,
                            "weight_decay": 0.0,
                            "dropout": 0.0,
                            **hp,
                            "converged": True,
                            "run": f"{task}-{seed}-{b}-{hp['depth']}-{hp['width']}",
                            **{k: f(hp["depth"], hp["width"], b + 3 * seed) for k, f in law.items()},
                        }
                    )
    runs = pd.DataFrame(rows).drop_duplicates(["task", "seed", "depth", "width", "lr"]).reset_index(drop=True)
    runs.loc[0, "converged"] = False
    runs.loc[0, "spectral_adaptive"] = 1e30  # would break the exact fit if it were not left out
    return runs


def test_a_study_grid_recovers_exact_power_laws():
    law = {
        "spectral_adaptive": lambda L, N, b: (1 + b) * L**1.0 * N**0.5,
        "edelman": lambda L, N, b: (2 + b) * L**6.0 * N**3.0,
    }
    fits = paper_fits(study_points(synthetic_runs(law))).set_index(["axis", "bound"])
    for (axis, bound), slope in {
        ("L", "spectral_adaptive"): 1.0,
        ("N", "spectral_adaptive"): 0.5,
        ("L", "edelman"): 6.0,
        ("N", "edelman"): 3.0,
    }.items():
        np.testing.assert_allclose(fits.loc[(axis, bound), "slope"], slope, atol=1e-10)
        assert fits.loc[(axis, bound), "ci_high"] - fits.loc[(axis, bound), "ci_low"] < 1e-8
    assert fits.loc[("L", "edelman"), "groups"] == 12  # 2 tasks x 2 seeds x 3 bases: each varies in depth


def test_the_study_slopes_are_the_studys_pooled_slopes():
    """On the shipped study (docs/study-default), the same estimator as the study's own ``pooled``
    column of scaling.csv (the fixed-effects slope over groups of runs that differ in one axis)."""

    folder = Path(__file__).parents[2] / "docs" / "study-default"
    fits = paper_fits(study_points(pd.read_csv(folder / "runs.csv"))).set_index(["axis", "bound"])
    study = pd.read_csv(folder / "scaling.csv")
    study = study[study["task"] == "all"].set_index(["axis", "bound"])
    for axis, name in (("L", "depth"), ("N", "width")):
        for bound in PAPER_BOUNDS:
            np.testing.assert_allclose(fits.loc[(axis, bound), "slope"], study.loc[(name, bound), "pooled"], rtol=1e-9)
            assert fits.loc[(axis, bound), "groups"] == study.loc[(name, bound), "groups"]


def test_study_runs_without_the_columns_are_one_line():
    with pytest.raises(SpecboundError, match="the study's runs.csv has no column depth, width"):
        study_points(
            pd.DataFrame(
                {"task": ["a"], "run": ["r"], "converged": [True], "spectral_adaptive": [1.0], "edelman": [2.0]}
            )
        )


@pytest.mark.parametrize(
    "adaptive, proxy, says",
    [
        (
            (1.0, 0.9, 1.1),
            (5.0, 4.0, 6.0),
            "spectral_adaptive grows more slowly (the intervals do not overlap): the paper's claim holds here",
        ),
        (
            (1.0, 0.5, 3.0),
            (2.0, 1.5, 2.5),
            "spectral_adaptive and edelman: the intervals overlap, this grid does not decide",
        ),
        (
            (5.0, 4.0, 6.0),
            (1.0, 0.9, 1.1),
            "spectral_adaptive grows faster (the intervals do not overlap): the paper's claim fails here",
        ),
    ],
)
def test_verdicts(adaptive, proxy, says):
    fits = pd.DataFrame(
        [
            {"axis": "L", "bound": b, "slope": s, "ci_low": lo, "ci_high": hi}
            for b, (s, lo, hi) in zip(PAPER_BOUNDS, (adaptive, proxy))
        ]
    )
    slopes, claim = verdicts(fits)
    assert slopes == (
        f"depth L: spectral_adaptive ~ L^{adaptive[0]:.2f} [{adaptive[1]:.2f}, {adaptive[2]:.2f}], "
        f"edelman ~ L^{proxy[0]:.2f} [{proxy[1]:.2f}, {proxy[2]:.2f}]"
    )
    assert claim == f"  {says}"


def test_a_llama_grid_from_transformers(tmp_path, capsys):
    """Tiny LLaMAs saved by transformers (grouped-query attention): L and N read from their configs,
    the slopes those of the textbook fit."""
    import torch
    import transformers

    for L in DEPTHS:
        for N in WIDTHS:
            torch.manual_seed(L * 100 + N)
            config = transformers.LlamaConfig(
                hidden_size=N,
                num_hidden_layers=L,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=3 * N,
                vocab_size=40,
                initializer_range=0.1,
            )
            save_tiny(transformers.LlamaForCausalLM(config).eval(), tmp_path / "llama" / f"L{L}-N{N}")
    rc, out, err = run_cli(capsys, str(tmp_path / "llama" / "L*-N*"), "--out", tmp_path / "out", command="paper")
    assert rc == 0, err
    table = Store(tmp_path / "out" / "store").table()
    assert set(table["family"]) == {"llama"}
    assert sorted(zip(table["L"], table["N"])) == [(L, N) for L in DEPTHS for N in WIDTHS]
    slopes = pd.read_csv(tmp_path / "out" / "slopes.csv").set_index(["axis", "bound"])
    for axis, other in (("L", "N"), ("N", "L")):
        for bound in PAPER_BOUNDS:
            expected = direct_fit(table[axis].to_numpy(float), table[bound].to_numpy(float), table[other].tolist())
            np.testing.assert_allclose(
                slopes.loc[(axis, bound), ["slope", "ci_low", "ci_high"]].to_numpy(float), expected, rtol=1e-9
            )


def test_a_grid_varying_in_depth_alone_draws_one_panel(bert_grid, tmp_path):
    run_sweep(expand_sources([str(bert_grid / f"L{L}-N16") for L in DEPTHS]), tmp_path / "store", progress=False)
    points = store_points(Store(tmp_path / "store"))
    fits = paper_fits(points)
    assert list(fits["axis"]) == ["L", "L"]  # nothing to fit in N: one width
    fig = figure_paper(points, fits)
    assert [ax.get_xlabel() for ax in fig.axes] == ["depth L"]
    assert len(verdicts(fits)) == 2  # depth only


def test_a_study_without_runs_differing_in_one_axis_is_one_line():
    law = {"spectral_adaptive": lambda L, N, b: 1.0 * L * N, "edelman": lambda L, N, b: 2.0 * L * N}
    runs = synthetic_runs(law)
    one_each = runs.drop_duplicates(["task", "seed", "lr"])  # one run per base point: nothing differs in one axis
    with pytest.raises(
        SpecboundError,
        match=r"vary neither depth L nor width N \(no two differ in depth or width "
        r"alone\)",
    ):
        paper_fits(study_points(one_each))
