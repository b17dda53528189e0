"""Kendall's tau (against scipy) and the granulated correlation of Jiang et al. (2020) on designs
whose answers are known."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

from specbound.study.correlate import (correlations, granulated, groups_differing_in, kendall, twin_agreement,
                                      twin_pairs)
from specbound.study.grid import HPARAMS


@pytest.mark.parametrize("seed", range(8))
def test_kendall_matches_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    x, y = rng.integers(0, 5, n).astype(float), rng.normal(size=n).round(1)
    if np.all(x == x[0]):
        x[0] += 1  # a constant measure is scored 0, not scipy's NaN (test_kendall_edge_cases)
    expected = kendalltau(x, y).statistic
    got = kendall(x, y)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)


def test_kendall_edge_cases():
    assert kendall([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert kendall([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(kendall([1], [2]))
    assert kendall([1, 1, 1], [1, 2, 3]) == 0.0  # a constant measure predicts nothing
    assert math.isnan(kendall([1, 2, 3], [1, 1, 1]))  # a constant gap: nothing to predict
    assert kendall([1, 2, np.nan, 3, np.inf], [1, 2, 0, 3, 5]) == pytest.approx(1.0)  # non-finite pairs dropped


def _factorial_runs():
    """2^5 x 2 seeds x 1 task, with a gap that grows with n^-1 and epochs and nothing else."""
    rows = []
    for depth, width, n, wd, epochs, seed in itertools.product((1, 2), (32, 64), (500, 2000), (0.0, 1.0),
                                                                (6, 24), (0, 1)):
        rows.append({"task": "t", "depth": depth, "width": width, "train_size": n, "weight_decay": wd,
                     "epochs": epochs, "seed": seed, "gap": 1000 / n + epochs + 0.01 * seed})
    return pd.DataFrame(rows)


def test_groups_differ_in_exactly_one_hyperparameter():
    runs = _factorial_runs()
    for h in HPARAMS:
        groups = groups_differing_in(runs, h)
        assert len(groups) == len(runs) // 2  # every other combination, per seed
        for rows in groups:
            g = runs.iloc[rows]
            assert g[h].nunique() == 2
            assert all(g[o].nunique() == 1 for o in (*HPARAMS, "seed", "task") if o != h)


def test_granulated_knows_which_hyperparameter_matters():
    runs = _factorial_runs()
    runs["data_measure"] = 1 / runs["train_size"]          # follows the gap along n, constant otherwise
    runs["anti"] = -runs["gap"]
    runs["depth_measure"] = runs["depth"]                    # unrelated to the gap
    assert granulated(runs, "data_measure", "gap", "train_size") == (1.0, 32)
    assert granulated(runs, "anti", "gap", "epochs") == (-1.0, 32)
    assert granulated(runs, "data_measure", "gap", "epochs") == (0.0, 32)  # blind to what changes the gap
    psi, groups = granulated(runs, "data_measure", "gap", "depth")  # the gap does not change with depth
    assert math.isnan(psi) and groups == 0
    psi, groups = granulated(runs, "depth_measure", "gap", "depth")  # gap constant along depth
    assert math.isnan(psi) and groups == 0


def test_correlation_table_shape_and_range():
    runs = _factorial_runs()
    runs["m"] = runs["gap"] + np.random.default_rng(0).normal(size=len(runs))
    measures = pd.DataFrame([{"column": "m", "kind": "complexity", "bound": "m"}])
    corr = correlations(runs, measures, gaps=("gap",))
    assert set(corr["statistic"]) == {"overall", *HPARAMS, "Psi", "twins"}
    assert set(corr["scope"]) == {"t", "all"}
    finite = corr["tau"].dropna()
    assert ((finite >= -1) & (finite <= 1)).all()
    psi = corr[(corr["scope"] == "all") & (corr["statistic"].isin(HPARAMS))]["tau"]
    assert corr.loc[(corr["scope"] == "all") & (corr["statistic"] == "Psi"), "tau"].item() == pytest.approx(
        np.nanmean(psi))


def test_twin_agreement():
    runs = _factorial_runs()
    pairs = twin_pairs(runs)
    assert len(pairs) == 2 ** 3 * 2  # depth x width x wd, 2 seeds
    for a, b in pairs:
        assert (runs.loc[a, "train_size"], runs.loc[a, "epochs"]) == (500, 24)
        assert (runs.loc[b, "train_size"], runs.loc[b, "epochs"]) == (2000, 6)
    runs["inv_n"] = 1 / runs["train_size"]
    runs["steps"] = runs["train_size"] * runs["epochs"]  # equal for twins: blind to them
    assert twin_agreement(runs, "inv_n", "gap") == (1.0, 16)
    assert twin_agreement(runs, "steps", "gap") == (0.0, 16)
    assert twin_agreement(runs, "train_size", "gap") == (-1.0, 16)
