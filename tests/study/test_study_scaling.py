"""The growth exponents of scaling.csv on runs tables made by hand, whose slopes are known: every
group's own slope, the median over groups, the cluster bootstrap, the pooled scope, and the
run-time estimate extrapolated from measured CPU seconds."""

import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from specbound.study.correlate import clusters
from specbound.study.grid import DEFAULT_BASES, HPARAMS, make_grid
from specbound.study.report import plot_scaling
from specbound.study.scaling import SCALING_COLUMNS, axis_groups, scaling_slopes, slopes_by_group
from specbound.study.timing import estimate_runs, format_estimate

# the exponent of each (seed) in depth and width: a group's slope is known exactly
DEPTH_EXPONENT = {0: 1.0, 1: 2.0, 2: 4.0}
WIDTH_EXPONENT = {0: 0.5, 1: 0.5, 2: 3.0}


def _runs(tasks=("fmnist", "langid")):
    """The default grid's configurations with a made-up bound ``B = c * depth^a(seed) * width^b(seed)``
    (``c`` differs by base point and by the other hyper-parameters, so only within-group slopes see
    ``a`` and ``b``), and ``noisy`` = B times lognormal noise."""
    runs = pd.DataFrame([c.to_dict() for c in make_grid("default", tasks)])
    runs["base"], runs["cluster"] = clusters(runs)
    a, b = runs["seed"].map(DEPTH_EXPONENT), runs["seed"].map(WIDTH_EXPONENT)
    c = np.where(runs["base"] == "A", 3.0, 50.0) * runs["train_size"] ** 0.3 * (1 + runs["dropout"])
    runs["B"] = c * runs["depth"] ** a * runs["width"] ** b
    runs["noisy"] = runs["B"] * np.exp(0.3 * np.random.default_rng(0).standard_normal(len(runs)))
    runs["converged"] = True
    return runs


def test_each_groups_slope_is_its_own_exponent():
    runs = _runs()
    for axis, exponent in (("depth", DEPTH_EXPONENT), ("width", WIDTH_EXPONENT)):
        per = slopes_by_group(runs, "B", axis)
        assert len(per) == 2 * len(DEFAULT_BASES) * 3 and (per["runs"] == 3).all()  # tasks x bases x seeds
        seeds = per["cluster"].str.split("/").str[1].astype(int)
        np.testing.assert_allclose(per["slope"], seeds.map(exponent), atol=1e-10)


def test_median_over_groups_with_a_cluster_interval():
    table = scaling_slopes(_runs(), ["B", "noisy"], bootstrap=200)
    assert list(table.columns) == SCALING_COLUMNS
    exact = table[table["bound"] == "B"].set_index(["task", "axis"])
    for scope in ("fmnist", "langid", "all"):
        # six groups a task (2 bases x 3 seeds): exponents 1, 1, 2, 2, 4, 4 -> median 2; 0.5 x 4, 3 x 2 -> 0.5
        assert exact.loc[(scope, "depth"), "slope"] == pytest.approx(2.0, abs=1e-10)
        assert exact.loc[(scope, "width"), "slope"] == pytest.approx(0.5, abs=1e-10)
        for axis, exponent in (("depth", DEPTH_EXPONENT), ("width", WIDTH_EXPONENT)):
            row = exact.loc[(scope, axis)]
            # a median of resampled groups lies among the groups' own slopes
            assert min(exponent.values()) - 1e-10 <= row["slope_lo"] <= row["slope"] <= row["slope_hi"]
            assert row["slope_hi"] <= max(exponent.values()) + 1e-10
            assert row["groups"] == (12 if scope == "all" else 6)
            assert row["clusters"] == (12 if scope == "all" else 6)
    assert exact.loc[("fmnist", "depth"), "slope_hi"] > exact.loc[("fmnist", "depth"), "slope_lo"]


def test_the_slopes_equal_a_fit_by_hand():
    """np.polyfit within every group of runs that differ only in depth (width), then the median."""
    runs = _runs(("fmnist",))
    table = scaling_slopes(runs, ["noisy"], bootstrap=20).set_index(["task", "axis"])
    others = {axis: [h for h in HPARAMS if h != axis] + ["task", "seed"] for axis in ("depth", "width")}
    for axis, keys in others.items():
        slopes = [
            np.polyfit(np.log(g[axis]), np.log(g["noisy"]), 1)[0]
            for _, g in runs.groupby(keys)
            if g[axis].nunique() > 1
        ]
        assert len(slopes) == 6
        assert table.loc[("fmnist", axis), "slope"] == pytest.approx(np.median(slopes), rel=1e-10)


def test_missing_and_non_positive_values_leave_their_group_out():
    runs = _runs(("fmnist",))
    label = axis_groups(runs, "depth")
    first, second = np.flatnonzero(label == 0), np.flatnonzero(label == 1)
    runs.loc[first[:2], "B"] = np.nan  # one value left: no slope for that group
    runs.loc[second[0], "B"] = -1.0  # two values left: the slope of those two
    per = slopes_by_group(runs, "B", "depth").set_index("group")
    assert math.isnan(per.loc[0, "slope"]) and np.isfinite(per.loc[1, "slope"])
    row = scaling_slopes(runs, ["B"], axes=("depth",), bootstrap=10).set_index("task").loc["fmnist"]
    assert row["groups"] == 5
    one_cluster = runs[runs["cluster"] == runs["cluster"].iloc[np.flatnonzero(label == 2)[0]]]
    row = scaling_slopes(one_cluster, ["B"], axes=("depth",), bootstrap=10).set_index("task").loc["fmnist"]
    assert np.isfinite(row["slope"]) and math.isnan(row["slope_lo"])  # one cluster: no interval


def test_estimate_extrapolates_cpu_seconds_linearly_in_depth():
    measured = pd.DataFrame([c.to_dict() for c in make_grid("default", ("fmnist",))])
    measured["steps"] = 500
    measured["cpu_seconds"] = 2.0 + 3.0 * measured["depth"]  # exactly linear: 0.004 + 0.006 depth per step
    deep = [c for c in make_grid("deep", ("fmnist",)) if c.depth > 6]
    todo = estimate_runs(measured, deep)
    np.testing.assert_allclose(todo["expected_cpu_s"], 2.0 + 3.0 * todo["depth"])
    np.testing.assert_allclose(todo["capped_cpu_s"], (2.0 + 3.0 * todo["depth"]) / 500 * todo["max_steps"])
    text = format_estimate(todo, workers=8)
    assert "ESTIMATE" in text and f"{len(deep)} runs to do" in text and "8 single-threaded workers" in text


def test_pooled_within_group_slope_equals_a_fixed_effects_regression():
    """One least-squares slope over every group's runs with an intercept per group,
    checked against lstsq on a design with a dummy column per group (over all tasks and per task)."""
    runs = _runs()
    table = scaling_slopes(runs, ["noisy", "B"], bootstrap=50).set_index(["task", "bound", "axis"])
    for axis in ("depth", "width"):
        for scope in ("fmnist", "langid", "all"):
            sub = runs if scope == "all" else runs[runs["task"] == scope]
            xs, ys, dummies = [], [], []
            offset = 0
            for _, part in sub.groupby("task", sort=True):
                part = part.reset_index(drop=True)
                label = axis_groups(part, axis)
                keep = label >= 0
                xs += list(np.log(part.loc[keep, axis]))
                ys += list(np.log(part.loc[keep, "noisy"]))
                dummies += list(label[keep] + offset)
                offset += label.max() + 1
            dummies = np.asarray(dummies)
            design = np.column_stack([xs] + [(dummies == g).astype(float) for g in np.unique(dummies)])
            beta = np.linalg.lstsq(design, np.asarray(ys), rcond=None)[0]
            row = table.loc[(scope, "noisy", axis)]
            assert row["pooled"] == pytest.approx(beta[0], rel=1e-10)
            assert row["pooled_lo"] <= row["pooled"] <= row["pooled_hi"]
    # noiseless: each group's slope is its seed's exponent, and with equal designs per group the pooled
    # slope is their mean (depth: (1 + 2 + 4) / 3; width: (0.5 + 0.5 + 3) / 3)
    exact = table.xs("B", level="bound")
    assert exact.loc[("all", "depth"), "pooled"] == pytest.approx(7 / 3, rel=1e-10)
    assert exact.loc[("all", "width"), "pooled"] == pytest.approx(4 / 3, rel=1e-10)


def test_the_scaling_figure_draws_only_the_axes_the_grid_varies(tmp_path):
    """A depth-only grid (the deep runs) gets no empty row of width panels."""

    runs = _runs(("fmnist",))
    depth_only = runs[axis_groups(runs, "depth") >= 0]
    assert (axis_groups(depth_only.reset_index(drop=True), "width") < 0).all()
    both = plot_scaling(runs, scaling_slopes(runs, ["B"], bootstrap=0), ["B"], tmp_path / "both.png")
    one = plot_scaling(depth_only, scaling_slopes(depth_only, ["B"], bootstrap=0), ["B"], tmp_path / "depth.png")
    (w2, h2), (w1, h1) = Image.open(both).size, Image.open(one).size
    assert w1 == w2 and h1 == pytest.approx(h2 / 2, rel=0.05)
