"""Kendall's tau (against scipy) and the granulated correlation of Jiang et al. (2020) on designs
whose answers are known."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau  # noqa: TID253

from specbound.study.correlate import (
    _codes,
    cluster_draws,
    clusters,
    correlations,
    environment_errors,
    environments,
    granulated,
    groups_differing_in,
    k_score,
    kendall,
    normalised_cmi,
)
from specbound.study.grid import DEFAULT_BASES, DEFAULT_SEEDS, HPARAMS, make_grid


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
    """2^7 x 2 seeds x 1 task over the seven hyper-parameters, with a gap that grows with 1/n and
    with the learning rate and nothing else."""
    rows = []
    for values in itertools.product(*[(1, 2)] * len(HPARAMS), (0, 1)):
        row = dict(zip((*HPARAMS, "seed"), values))
        row["train_size"] *= 500
        row.update(task="t", gap=1000 / row["train_size"] + row["lr"] + 0.01 * row["seed"])
        rows.append(row)
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
    half = len(runs) // 2
    runs["data_measure"] = 1 / runs["train_size"]  # follows the gap along n, constant otherwise
    runs["anti"] = -runs["gap"]
    runs["depth_measure"] = runs["depth"]  # unrelated to the gap
    assert granulated(runs, "data_measure", "gap", "train_size") == (1.0, half)
    assert granulated(runs, "anti", "gap", "lr") == (-1.0, half)
    assert granulated(runs, "data_measure", "gap", "lr") == (0.0, half)  # blind to what changes the gap
    psi, groups = granulated(runs, "depth_measure", "gap", "depth")  # the gap does not change with depth
    assert math.isnan(psi) and groups == 0


def _dense_cmi(v_mu, v_g, cell):
    """I(V_mu; V_g | cell) / H(V_g | cell) by explicit counting (the oracle)."""
    n = len(cell)
    info = entropy = 0.0
    for c in set(cell):
        idx = [i for i in range(n) if cell[i] == c]
        pc = len(idx) / n
        for a in (-1, 0, 1):
            for b in (-1, 1):
                pab = sum(1 for i in idx if v_mu[i] == a and v_g[i] == b) / len(idx)
                pa = sum(1 for i in idx if v_mu[i] == a) / len(idx)
                pb = sum(1 for i in idx if v_g[i] == b) / len(idx)
                if pab > 0:
                    info += pc * pab * math.log(pab / (pa * pb))
        for b in (-1, 1):
            pb = sum(1 for i in idx if v_g[i] == b) / len(idx)
            if pb > 0:
                entropy -= pc * pb * math.log(pb)
    return info / entropy if entropy > 0 else math.nan


@pytest.mark.parametrize("seed", range(6))
def test_normalised_cmi_matches_explicit_counting(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    v_g = rng.choice([-1, 1], n)
    v_mu = np.where(rng.random(n) < 0.6, v_g, rng.choice([-1, 0, 1], n))
    cells = np.stack([np.zeros(n, dtype=np.int64), rng.integers(0, 4, n)])
    got = normalised_cmi(v_mu, v_g, cells, np.array([1, 4]))
    for k in range(2):
        expected = _dense_cmi(v_mu.tolist(), v_g.tolist(), cells[k].tolist())
        assert (math.isnan(got[k]) and math.isnan(expected)) or got[k] == pytest.approx(expected, abs=1e-12)


def test_k_score_extremes():
    runs = _factorial_runs()
    codes = _codes(runs, HPARAMS)
    gap = runs["gap"].to_numpy(dtype=float)
    assert k_score(gap, gap, codes)[0] == pytest.approx(1.0)
    assert k_score(-gap, gap, codes)[0] == pytest.approx(1.0)  # sign-blind
    noise = np.random.default_rng(0).normal(size=len(runs))
    k_noise, _ = k_score(noise, gap, codes)
    assert 0 <= k_noise < 0.15
    # A measure that only sees n explains nothing once n is fixed (conditioning on train_size).
    k_n, subset = k_score(1 / runs["train_size"].to_numpy(dtype=float), gap, codes)
    assert k_n == pytest.approx(0.0, abs=1e-12) and "train_size" in subset


def test_sign_error_environments():
    runs = _factorial_runs()
    envs = environments(runs, "gap", noise_filter=False)
    assert all(len(pairs) == 2 for pairs in envs)  # coupled over the two seeds
    # n and lr change the gap; the others leave it equal across a pair (no usable pair)
    assert len(envs) == 2 * 2 ** (len(HPARAMS) - 1)
    runs["same"], runs["opposite"] = runs["gap"], -runs["gap"]
    runs["flat"] = 1.0
    assert np.all(environment_errors(runs, "same", "gap", envs) == 0)
    assert np.all(environment_errors(runs, "opposite", "gap", envs) == 1)
    assert np.all(environment_errors(runs, "flat", "gap", envs) == 0.5)  # a tie is a coin flip


def test_correlation_table_with_intervals():
    runs = _factorial_runs()
    runs["m"] = runs["gap"] + np.random.default_rng(0).normal(size=len(runs)) * 0.3
    runs["exact"] = runs["gap"]
    # every run its own cluster, so that the interval machinery has many to draw (a factorial of two
    # seeds is two clusters, :func:`clusters`; the grid's clusters are tested below)
    runs["cluster"] = runs.index.astype(str)
    measures = pd.DataFrame([{"column": c, "kind": "complexity", "bound": c} for c in ("m", "exact")])
    corr = correlations(runs, measures, gaps=("gap",), bootstrap=60, bootstrap_k=20)
    assert set(corr["statistic"]) == {"overall", *HPARAMS, "Psi", "K", "sign_error_max", "sign_error_mean"}
    assert set(corr["scope"]) == {"t", "all"}
    assert not (corr["scope"].eq("all") & corr["statistic"].isin(["K", "sign_error_max"])).any()
    finite = corr.dropna(subset=["value_lo", "value_hi"])
    assert len(finite) > 0 and (finite["value_lo"] <= finite["value_hi"] + 1e-12).all()
    assert ((finite["value"] >= finite["value_lo"] - 0.35) & (finite["value"] <= finite["value_hi"] + 0.35)).all()
    exact = corr[(corr["measure"] == "exact") & (corr["scope"] == "t")].set_index("statistic")
    assert exact.loc["overall", "value"] == pytest.approx(1.0) and exact.loc["overall", "value_lo"] == pytest.approx(
        1.0
    )
    assert exact.loc["K", "value"] == pytest.approx(1.0) and exact.loc["sign_error_max", "value"] == 0.0
    noisy = corr[(corr["measure"] == "m") & (corr["scope"] == "t")].set_index("statistic")
    assert noisy.loc["overall", "value_lo"] < noisy.loc["overall", "value"] < noisy.loc["overall", "value_hi"]
    psi = corr[(corr["scope"] == "all") & (corr["statistic"].isin(HPARAMS)) & (corr["measure"] == "m")]["value"]
    assert corr.loc[
        (corr["scope"] == "all") & (corr["statistic"] == "Psi") & (corr["measure"] == "m"), "value"
    ].item() == pytest.approx(np.nanmean(psi))


def _grid_frame(tasks=("fmnist", "langid")):
    return pd.DataFrame([c.to_dict() for c in make_grid("default", tasks)])


def test_clusters_are_a_base_points_runs_of_one_task_and_seed():
    runs = _grid_frame()
    base, cluster = clusters(runs)
    for i, point in enumerate(DEFAULT_BASES):
        letter = "AB"[i]
        mine = runs[base == letter]
        # the base point and its 14 single changes, for every task and seed
        assert len(mine) == 2 * len(DEFAULT_SEEDS) * 15
        assert all(sum(r[h] != point[h] for h in HPARAMS) <= 1 for _, r in mine.iterrows())
    assert len(set(cluster)) == 2 * len(DEFAULT_SEEDS) * len(DEFAULT_BASES)
    for label, rows in runs.groupby(cluster):
        assert len(rows) == 15 and rows["task"].nunique() == 1 and rows["seed"].nunique() == 1
        assert label == f"{rows['task'].iloc[0]}/{rows['seed'].iloc[0]}/{base[rows.index[0]]}"


def test_cluster_draws_stay_within_strata_and_need_two_clusters():
    rng = np.random.default_rng(0)
    labels = np.array(["a1", "a1", "a2", "b1", "b1", "b2", "b3"], dtype=object)
    strata = np.array(["a", "a", "a", "b", "b", "b", "b"], dtype=object)
    codes, draws = cluster_draws(labels, strata, 50, rng)
    assert len(draws) == 50 and len(set(codes.tolist())) == 5
    a = set(codes[:3].tolist())
    for d in draws:  # as many clusters as each task holds, drawn from that task's
        assert len(d) == 5 and sum(c in a for c in d) == 2
    assert cluster_draws(["x", "x", "x"], ["t", "t", "t"], 50, rng)[1] == []  # one cluster: no interval
    assert cluster_draws(["x", "y"], ["t", "u"], 50, rng)[1] == []  # one cluster per task: none either


def test_the_bootstrap_resamples_clusters_not_runs():
    """Four clusters that repeat the same seven runs: between clusters there is nothing to vary, so
    every replicate of a cluster bootstrap reproduces the statistic (a run bootstrap would not); a
    single cluster gets no interval at all; the robust sign-error never gets one."""
    rng = np.random.default_rng(3)
    one = pd.DataFrame(
        {
            "depth": [1, 2, 3, 1, 1, 1, 1],
            "width": [1, 1, 1, 2, 3, 1, 1],
            "train_size": [1, 1, 1, 1, 1, 2, 3],
            "gap": rng.normal(size=7),
        }
    )
    one["m"] = one["gap"] + rng.normal(size=7)
    hparams = ("depth", "width", "train_size")
    runs = pd.concat([one.assign(seed=s, task="t") for s in range(4)], ignore_index=True)
    measures = pd.DataFrame([{"column": "m", "kind": "complexity", "bound": "m"}])
    corr = correlations(runs, measures, gaps=("gap",), hparams=hparams, bootstrap=40, bootstrap_k=10)
    t = corr[corr["scope"] == "t"].set_index("statistic")
    assert (t["clusters"] == 4).all()
    for stat in ("overall", "depth", "Psi", "sign_error_mean"):
        assert t.loc[stat, "value_lo"] == pytest.approx(t.loc[stat, "value"], abs=1e-12)
        assert t.loc[stat, "value_hi"] == pytest.approx(t.loc[stat, "value"], abs=1e-12)
    assert math.isnan(t.loc["sign_error_max", "value_lo"]) and math.isnan(t.loc["sign_error_max", "value_hi"])
    # three axes x three pairs of values, each coupled over the four seeds
    assert t.loc["sign_error_max", "environments"] == 9 and t.loc["sign_error_max", "pairs"] == 9 * 4
    single = correlations(
        runs[runs["seed"] == 0], measures, gaps=("gap",), hparams=hparams, bootstrap=40, bootstrap_k=10
    )
    assert single["value_lo"].isna().all() and (single["clusters"] == 1).all()
