"""The report of a store whose records were measured from initial weights (``--init``, a LoRA
adapter) shows ``W - W0``: a table whose numbers are the analyses' own ``from_init`` bounds, and a
figure; the one-model figures say which record they show, the last checkpoint of a run by default."""

from __future__ import annotations

import pytest
from support.tiny_models import build_tiny_model, save_tiny

import specbound
from specbound.records.view import fmt
from specbound.report.distance import figure_from_init, from_init_frame
from specbound.report.html import write_report
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store

pytest.importorskip("matplotlib")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def init_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("distance")
    model = build_tiny_model("bert")
    save_tiny(model, root / "init")
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_tiny(model, root / "trained")
    run_sweep(
        expand_sources([str(root / "trained")]),
        root / "store",
        option_sets=[{}, {"init": str(root / "init")}],
        progress=False,
    )
    return root


def test_the_table_holds_the_analysis_from_init_bounds(init_store):
    store = Store(init_store / "store")
    frame = from_init_frame(store)
    assert len(frame) == 1  # the record without --init has no W - W0
    reference = specbound.analyze(init_store / "trained", init=init_store / "init", threads=1)
    row = frame.iloc[0]
    assert row["W0"].startswith("init ")
    for bound in ("spectral_adaptive", "edelman"):
        assert row[f"{bound} (W - W0)"] == fmt(reference.from_init[bound])
        assert row[f"(W - W0) / W, {bound}"] == fmt(reference.from_init[bound] / reference.bounds[bound])
    assert figure_from_init(store) is not None
    from matplotlib.figure import Figure  # ax=: drawn into the caller's Axes, none added

    fig = Figure()
    ax = fig.add_subplot()
    assert figure_from_init(store, ax=ax) is fig and len(fig.axes) == 1 and len(ax.get_lines()) >= 2


def test_the_report_shows_w_minus_w0_and_names_the_model_shown(init_store, tmp_path):
    paths = write_report(Store(init_store / "store"), tmp_path / "report")
    page, md = paths["html"].read_text(), paths["markdown"].read_text()
    for text in (page, md):
        assert "Distance from initialisation (W - W0)" in text and "The model shown: trained" in text
    assert "| spectral_adaptive (W - W0) |" in md and "adaptive (W - W0)</th>" in page
    assert (tmp_path / "report" / "figures" / "from_init.png").exists()


def test_a_store_without_init_has_no_such_section(tiny_store, tmp_path):
    assert from_init_frame(tiny_store).empty and figure_from_init(tiny_store) is None
    page = write_report(tiny_store, tmp_path / "report")["html"].read_text()
    assert "W - W0" not in page
