"""A store of one run's checkpoints (one shape): the scaling fit says which label to fit against, the
figures and the report show the trajectory, and every table of the store reads back as one tidy frame."""

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from specbound.cli import main
from specbound.errors import SpecboundError
from specbound.report.html import write_report
from specbound.report.plots import build_figures
from specbound.report.scaling import scaling_table
from specbound.report.trajectory import figure_trajectory, trajectory_axis, trajectory_frame
from support.run_store import RUN_STEPS, run_store  # noqa: F401  (a fixture)




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
    assert len(top.get_lines()) == len(names)
    frame = trajectory_frame(run_store)
    for line, name in zip(top.get_lines(), names):
        np.testing.assert_array_equal(line.get_xdata(), list(RUN_STEPS))
        np.testing.assert_allclose(line.get_ydata(), frame[name].where(frame[name] > 0))
    assert fig.get_figwidth() <= 7.5


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
