"""A store of one run's checkpoints (one shape): the scaling fit says which label to fit against, the
figures and the report show the trajectory, and every table of the store reads back as one tidy frame."""

import json
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from support.numpy_bert import write_tiny_bert
from support.run_store import RUN_STEPS, run_store  # noqa: F401  (a fixture)

from specbound.cli import main
from specbound.errors import SpecboundError
from specbound.records.style import bound_label
from specbound.report.html import write_report
from specbound.report.plots import build_figures
from specbound.report.scaling import scaling_table
from specbound.report.trajectory import figure_trajectory, trajectory_axis, trajectory_frame
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store


def test_scaling_names_the_label_to_fit_against(run_store, capsys):
    with pytest.raises(SpecboundError, match=r"--against label_step") as info:
        scaling_table(run_store)
    assert "L=2 and N=16" in str(info.value) and "\n" not in str(info.value)
    assert main(["scaling", "--store", str(run_store.root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--against label_step" in err
    # and the fit it names works: edelman grows with the step, the slope is finite
    fits = scaling_table(run_store, against=[("label_step", None)])
    edelman = fits[(fits["bound"] == "edelman") & (fits["role"] == "all")].iloc[0]
    assert edelman["points"] == len(RUN_STEPS) and edelman["slope"] > 0


def test_trajectory_frame_orders_by_step_and_counts_p_star(run_store):
    table = run_store.table()
    assert trajectory_axis(table) == "label_step"
    frame = trajectory_frame(run_store)
    assert list(frame["label_step"]) == list(RUN_STEPS)  # numeric order, not 100, 1000, 200, 300
    shares = frame[[c for c in frame.columns if c.startswith("p*=")]]
    np.testing.assert_allclose(shares.sum(axis=1), 1.0)
    for (_, row), share in zip(frame.iterrows(), shares.itertuples(index=False)):
        mats = run_store.load(row["key"], tables=("matrices",)).tables["matrices"]
        m = int(table.loc[table["key"] == row["key"], "grid_m"].iloc[0])
        counts = pd.Series([str(Fraction(round(p * m), m)) for p in mats["p_star"]]).value_counts(normalize=True)
        for col, value in zip(shares.columns, share):
            assert value == pytest.approx(counts.get(col[3:], 0.0))
        assert row["edelman"] == run_store.load_meta(row["key"])["bounds"]["edelman"]


def test_trajectory_figure_draws_every_bound_against_the_step(run_store):
    fig = figure_trajectory(run_store)
    top, bottom = [ax for ax in fig.axes if ax.get_visible()][:2]
    assert top.get_yscale() == "log" and bottom.get_xlabel() == "step"
    names = run_store.bound_names()
    frame = trajectory_frame(run_store)
    equal = [n for n in names if n != "spectral_adaptive" and (frame[n] == frame["spectral_adaptive"]).all()]
    assert len(top.get_lines()) == len(names) - len(equal)
    by_label = {line.get_label().removesuffix(" (headline)"): line for line in top.get_lines()}
    for name in set(names) - set(equal):
        line = by_label[bound_label(name)]
        np.testing.assert_array_equal(line.get_xdata(), list(RUN_STEPS))
        np.testing.assert_allclose(line.get_ydata(), frame[name].where(frame[name] > 0))
    assert fig.get_figwidth() <= 7.5


def test_the_headline_is_on_top_and_equal_variants_are_named_not_drawn(run_store):
    """The headline is drawn on top of the variant lines (identical ones are named, not drawn), and the p* legend
    does not list 20 entries."""
    from matplotlib.collections import QuadMesh

    fig = figure_trajectory(run_store)
    top, strip = fig.axes[0], fig.axes[1]
    lines = top.get_lines()
    headline = [line for line in lines if line.get_label().endswith("(headline)")]
    assert len(headline) == 1 and headline[0].get_label() == bound_label("spectral_adaptive") + " (headline)"
    assert headline[0].get_zorder() > max(line.get_zorder() for line in lines if line is not headline[0])
    assert headline[0].get_linewidth() > max(line.get_linewidth() for line in lines if line is not headline[0])
    frame = trajectory_frame(run_store)
    equal = [
        n
        for n in run_store.bound_names()
        if n != "spectral_adaptive" and (frame[n] == frame["spectral_adaptive"]).all()
    ]
    assert equal  # on these small checkpoints some variant coincides (spectral_shared: no shared weights)
    drawn = {line.get_label() for line in lines}
    assert not drawn & {bound_label(n) for n in equal}
    (note,) = [t for t in top.texts if "not drawn" in t.get_text()]
    assert all(n in note.get_text() for n in equal)
    # p*: one shaded strip (cells = checkpoints x grid values, shade = share), a colour bar, no legend
    (mesh,) = [c for c in strip.collections if isinstance(c, QuadMesh)]
    shares = frame[[c for c in frame.columns if c.startswith("p*=")]].to_numpy(float).T
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(shares.shape), shares)
    assert strip.get_legend() is None and strip.get_ylabel() == "p*"
    assert not any(ax.get_title().startswith("The run's own numbers") for ax in fig.axes)  # no metrics: no panel


def test_the_run_s_own_numbers_share_the_step_axis(tmp_path):
    """Records that carry the run's loss and evaluation metrics (metrics.json beside each checkpoint, or
    a training callback's) get a panel of them on the bounds' step axis."""

    steps, losses, accuracies = (100, 200, 400), (1.5, 0.9, 0.4), (0.5, 0.7, 0.8)
    for i, step in enumerate(steps):
        write_tiny_bert(tmp_path / "run" / f"step-{step}", seed=i, L=2, N=16, H=4, d_ff=24, std=0.1 * (1 + i))
        (tmp_path / "run" / f"step-{step}" / "metrics.json").write_text(
            json.dumps({"train_loss": losses[i], "eval_accuracy": accuracies[i]})
        )
    run_sweep(expand_sources([str(tmp_path / "run" / "step-{step=100..400..100}")]), tmp_path / "store", progress=False)
    fig = figure_trajectory(Store(tmp_path / "store"))
    top, numbers, strip = fig.axes[:3]
    assert numbers.get_title().startswith("The run's own numbers")
    assert numbers.get_shared_x_axes().joined(numbers, top) and numbers.get_shared_x_axes().joined(numbers, strip)
    lines = {line.get_label(): line for line in numbers.get_lines()}
    assert set(lines) == {"train_loss", "eval_accuracy"}
    np.testing.assert_array_equal(lines["train_loss"].get_xdata(), steps)
    np.testing.assert_allclose(lines["train_loss"].get_ydata(), losses)
    np.testing.assert_allclose(lines["eval_accuracy"].get_ydata(), accuracies)


def test_plot_and_report_show_the_trajectory(run_store, tmp_path):
    figures = build_figures(run_store)
    assert "trajectory" in figures and "bounds_vs_width" not in figures and "bounds_vs_depth" not in figures
    paths = write_report(run_store, tmp_path / "rep")
    page, md = paths["html"].read_text(), paths["markdown"].read_text()
    assert "<h2>Trajectory</h2>" in page and "<h2>Scaling</h2>" not in page and ">nan<" not in page
    assert "## Trajectory" in md and "--against label_step" in md and "| nan |" not in md
    assert (paths["figures"] / "trajectory.pdf").read_bytes()[:4] == b"%PDF"


def test_store_tables_read_back_as_one_tidy_frame(run_store):
    """Every Parquet table of the store carries its record's key and source: one read of all of them
    (pyarrow or Dask, over STORE/records/*/<table>.parquet) is one tidy frame."""
    import dask.dataframe as dd

    files = sorted(str(p) for p in (run_store.root / "records").glob("*/matrices.parquet"))
    assert len(files) == len(RUN_STEPS)
    frame = pd.read_parquet(files)
    lazy = dd.read_parquet(str(run_store.root / "records" / "*" / "matrices.parquet")).compute()
    assert len(frame) == len(lazy) == sum(len(run_store.load(k, ("matrices",)).matrices) for k in run_store.keys())
    assert list(frame.columns[:2]) == ["key", "source"] and "tensors" in frame.columns
    assert set(frame["key"]) == set(lazy["key"]) == set(run_store.keys())
    assert set(frame["source"]) == set(run_store.table()["source"])
    assert frame["tensors"].str.startswith("encoder.layer.").all()
    for name in ("layers", "singular_values", "curves"):
        table = pd.read_parquet(sorted(str(p) for p in (run_store.root / "records").glob(f"*/{name}.parquet")))
        assert list(table.columns[:2]) == ["key", "source"] and "index" not in table.columns, name
