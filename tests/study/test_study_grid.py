"""The study's grids: seven axes with three values, one-at-a-time around base points, stable keys."""

from dataclasses import replace

import pandas as pd
import pytest

from specbound.errors import SpecboundError
from specbound.study.correlate import clusters, groups_differing_in
from specbound.study.grid import (
    AXES,
    DEEP_DEPTHS,
    DEFAULT_BASES,
    DEFAULT_SEEDS,
    HPARAMS,
    RunConfig,
    make_grid,
    one_at_a_time,
    with_seeds,
)


def _frame(configs):
    return pd.DataFrame([c.to_dict() for c in configs])


def test_axes_have_three_values_and_depth_reaches_six():
    assert set(AXES) == set(HPARAMS) and len(HPARAMS) == 7
    assert all(len(set(v)) >= 3 for v in AXES.values())
    assert max(AXES["depth"]) >= 6
    for base in DEFAULT_BASES:
        assert all(base[h] in AXES[h] for h in HPARAMS)


def test_default_grid_is_one_at_a_time_around_the_bases():
    grid = make_grid("default")
    df = _frame(grid)
    assert set(df["task"]) == {"fmnist", "langid", "fortunes"}
    assert len({c.key for c in grid}) == len(grid) == 3 * len(DEFAULT_SEEDS) * len(DEFAULT_BASES) * (1 + 7 * 2)
    for c in grid:  # every configuration is a base or differs from one in exactly one hyper-parameter
        assert min(sum(getattr(c, h) != b[h] for h in HPARAMS) for b in DEFAULT_BASES) <= 1
    for task, sub in df.groupby("task"):
        for h in HPARAMS:
            assert set(sub[h]) >= set(AXES[h])
            groups = groups_differing_in(sub.reset_index(drop=True), h)
            assert len(groups) == len(DEFAULT_BASES) * len(DEFAULT_SEEDS)  # a base's three values, per seed
            assert all(len(g) == 3 for g in groups)


def test_one_at_a_time_lists_a_shared_configuration_once():
    axes = {"depth": (1, 2), "width": (16, 32)}
    bases = ({"depth": 1, "width": 16}, {"depth": 2, "width": 16})  # the second is a change of the first
    fixed = dict(train_size=64, lr=1e-3, batch_size=32, weight_decay=0.0, dropout=0.0)
    grid = one_at_a_time("fmnist", bases, axes, (0,), **fixed)
    assert sorted((c.depth, c.width) for c in grid) == [(1, 16), (1, 32), (2, 16), (2, 32)]


def test_quick_grid_is_small_and_has_a_group_per_axis():
    grid = make_grid("quick")
    assert len(grid) == 3 * (8 + 3)
    df = _frame(grid)
    for task, sub in df.groupby("task"):
        sub = sub.reset_index(drop=True)
        for h in HPARAMS:
            # depth and width: a group per seed, two clusters for the growth exponents' intervals
            assert len(groups_differing_in(sub, h)) == (2 if h in ("depth", "width") else 1)
        assert len(set(clusters(sub)[1])) == 2
    assert make_grid("quick", ("fmnist",)) == [c for c in grid if c.task == "fmnist"]


def test_deep_grid_extends_the_default_grids_depth_axis_to_twelve():
    default, deep = make_grid("default", ("fmnist",)), make_grid("deep", ("fmnist",))
    assert {c.key for c in default} < {c.key for c in deep}  # a default folder is extended, not redone
    extra = [c for c in deep if c.key not in {d.key for d in default}]
    assert sorted({c.depth for c in extra}) == [8, 10, 12] and max(DEEP_DEPTHS) == 12
    assert len(extra) == 3 * len(DEFAULT_BASES) * len(DEFAULT_SEEDS)
    for c in extra:  # a base point with only its depth changed
        assert any(all(getattr(c, h) == b[h] for h in HPARAMS if h != "depth") for b in DEFAULT_BASES)
    groups = groups_differing_in(_frame(deep), "depth")
    assert len(groups) == len(DEFAULT_BASES) * len(DEFAULT_SEEDS) and all(len(g) == 6 for g in groups)


def test_with_seeds():
    grid = make_grid("quick", ("fmnist",))
    bigger = with_seeds(grid, (0, 1, 2))
    configurations = {replace(c, seed=0) for c in grid}  # the quick grid repeats three of them at seed 1
    assert len(configurations) == 8
    assert len(bigger) == 3 * len(configurations) and {c.seed for c in bigger} == {0, 1, 2}


def test_key_is_stable_and_covers_every_field():
    c = RunConfig(
        task="fmnist", depth=1, width=32, train_size=200, lr=1e-3, batch_size=64, weight_decay=0.0, dropout=0.0, seed=0
    )
    # Changing how keys are computed orphans every recorded run: bump STUDY_VERSION on purpose instead.
    assert c.key == "96bb91ce9354"
    assert c.name == f"fmnist-{c.key}"
    for field, value in (
        ("seed", 1),
        ("lr", 2e-3),
        ("weight_decay", 1.0),
        ("task", "langid"),
        ("dropout", 0.1),
        ("max_steps", 10),
    ):
        assert RunConfig(**{**c.to_dict(), field: value}).key != c.key


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(task="cifar"), "unknown task"),
        (dict(depth=0), "depth"),
        (dict(width=30), "multiple of heads"),
        (dict(weight_decay=-1.0), "weight_decay"),
        (dict(dropout=1.0), "dropout"),
        (dict(seed=-1), "seed"),
        (dict(max_steps=0), "max_steps"),
    ],
)
def test_run_config_validation(bad, match):
    args = dict(
        task="fmnist", depth=1, width=32, train_size=200, lr=1e-3, batch_size=64, weight_decay=0.0, dropout=0.0, seed=0
    )
    with pytest.raises(SpecboundError, match=match):
        RunConfig(**{**args, **bad})


def test_make_grid_rejects_unknown_names():
    with pytest.raises(SpecboundError, match="unknown grid"):
        make_grid("huge")
    with pytest.raises(SpecboundError, match="tasks must be among"):
        make_grid("quick", ("mnist",))
