"""Every figure and the report render from stored records alone (no checkpoint is opened)."""

import base64
import io
import re

import pandas as pd
import pytest

import specbound.io.dispatch
import specbound.pipeline
import specbound.report.html
import specbound.report.plots
from specbound.cli import main
from specbound.records.plot import figure_contributions
from specbound.records.style import natural_order
from specbound.report.html import write_report
from specbound.report.plots import (
    HEADLINE,
    build_figures,
    figure_bound_scaling,
    figure_bounds_side_by_side,
    pick_record,
)

EXPECTED = {
    "spectral_decay": ("singular value index i", r"singular value $\sigma_i$"),
    "bounds_vs_width": ("hidden size N", "bound / bound at smallest N"),
    "bounds_vs_depth": ("depth L", "bound / bound at smallest L"),
    "norms_vs_width": ("hidden size N", "(2,1)-norm"),
    "contribution_curves": ("Schatten index p", "C(p) / C(0)"),
    "p_star_heatmap": ("layer", "role"),
    "bounds_side_by_side": ("bound value (log scale)", "checkpoint (depth L, hidden size N)"),
}


@pytest.fixture
def no_checkpoints(monkeypatch):
    """Opening any checkpoint fails: plots and reports must read records only."""

    def refuse(*args, **kwargs):
        raise AssertionError("a plot or report opened a checkpoint")

    monkeypatch.setattr(specbound.io.dispatch, "open_checkpoint", refuse)
    monkeypatch.setattr(specbound.pipeline, "open_checkpoint", refuse)


def test_every_figure_has_its_axes(tiny_store, no_checkpoints):
    figures = build_figures(tiny_store)
    assert set(figures) == set(EXPECTED)
    for name, (xlabel, ylabel) in EXPECTED.items():
        ax = figures[name].axes[0]
        assert (ax.get_xlabel(), ax.get_ylabel()) == (xlabel, ylabel), name
    scaling = figures["bounds_vs_width"].axes[0]
    assert scaling.get_yscale() == "log"
    # one line per (bound, fixed L), each starting at 1
    lines = [l for l in scaling.get_lines() if len(l.get_xdata()) > 1]
    assert len(lines) == 2 * 3 and all(l.get_ydata()[0] == 1 for l in lines)
    assert [a.get_ylabel() for a in figures["norms_vs_width"].axes[:3]] == ["(2,1)-norm", "(1,1)-norm", "spectral norm"]
    assert [a.get_title() for a in figures["contribution_curves"].axes] == [
        "QK (per head)",
        "OV (per head)",
        "FF_in",
        "FF_out",
    ]
    # the heat map shows the stored p* (mean over heads) of the largest model
    key = pick_record(tiny_store)
    mats = tiny_store.load(key, tables=("matrices",)).matrices
    image = figures["p_star_heatmap"].axes[0].get_images()[0].get_array()
    assert image[0, 0] == pytest.approx(mats[(mats.role == "QK") & (mats.layer == 0)]["p_star"].mean())


def test_report_is_self_contained(tiny_store, tmp_path, no_checkpoints):
    paths = write_report(tiny_store, tmp_path / "rep", model="bert_uncased_L-1_H-32_A-2", fixed_L=2)
    written = sorted(paths["figures"].iterdir())
    assert [p.name for p in written] == sorted(f"{n}.{ext}" for n in EXPECTED for ext in ("pdf", "png"))
    for path in written:  # every figure as PNG and PDF
        assert path.read_bytes()[:8].startswith(b"\x89PNG" if path.suffix == ".png" else b"%PDF"), path
    page = paths["html"].read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<img") == len(EXPECTED)
    sources = re.findall(r'src="([^"]*)"', page)
    assert all(s.startswith("data:image/png;base64,") for s in sources)  # nothing outside the file
    assert base64.b64decode(sources[0].split(",", 1)[1])[:4] == b"\x89PNG"
    assert "spectral_adaptive" in page and "slope in L (fixed N)" in page
    md = paths["markdown"].read_text()
    assert "## Scaling" in md and "| source | L | N |" in md and "](figures/bounds_vs_width.png)" in md
    assert (paths["figures"] / "bounds_vs_width.pdf").stat().st_size > 0


def test_cli_plot_and_report(tiny_store, tmp_path, capsys, monkeypatch):
    calls = []  # the CLI only passes its arguments on (the drawing itself is tested above)
    monkeypatch.setattr(specbound.report.plots, "render_all", lambda store, out, **kw: calls.append((out, kw)) or [out])
    monkeypatch.setattr(
        specbound.report.html,
        "write_report",
        lambda store, out, **kw: calls.append((out, kw)) or {"html": "r.html", "markdown": "r.md", "figures": "f"},
    )
    assert (
        main(
            [
                "plot",
                "--store",
                str(tiny_store.root),
                "--out",
                "f",
                "--model",
                "m",
                "--fixed-l",
                "2",
                "--bound",
                "edelman",
            ]
        )
        == 0
    )
    assert main(["report", "--store", str(tiny_store.root), "--out", "r", "--confidence", "0.9"]) == 0
    assert calls == [
        ("f", {"model": "m", "fixed_L": 2, "bounds": ["edelman"]}),
        ("r", {"model": None, "fixed_L": None, "bounds": None, "confidence": 0.9}),
    ]
    assert "report: r.html" in capsys.readouterr().out
    monkeypatch.undo()
    assert main(["plot", "--store", str(tmp_path / "empty")]) == 2
    assert "no records" in capsys.readouterr().err
    assert main(["plot", "--store", str(tiny_store.root), "--model", "nothing-like-this"]) == 2
    assert "names 0 records" in capsys.readouterr().err


def test_the_headline_bound_is_drawn_last_and_distinct(tiny_store, no_checkpoints):
    """The spectrum-adaptive bound equals some of its variants on every row (spectral_shared without
    sharing, spectral_fixed_p2 where p* = 2): it is drawn on top, as the one open black ring, first in
    the legend, so the variants it equals show inside it instead of hiding it."""

    fig = figure_bounds_side_by_side(tiny_store)
    ax = fig.axes[0]
    lines = ax.get_lines()
    table = tiny_store.table()
    assert table["spectral_shared"].to_numpy() == pytest.approx(table[HEADLINE].to_numpy(), rel=1e-9)  # what hid it
    ring = max(lines, key=lambda l: l.get_zorder())
    assert list(ring.get_xdata()[::-1]) == pytest.approx(list(natural_order_values(table, HEADLINE)))
    assert ring.get_markerfacecolor() == "none" and ring.get_markersize() > 1.5 * max(
        l.get_markersize() for l in lines if l is not ring
    )
    assert all(l.get_marker() != ring.get_marker() for l in lines if l is not ring)
    legend = fig.legends[0]
    assert (
        legend.get_texts()[0].get_text().startswith("Spectrum-adaptive (Sakai")
        and "headline" in legend.get_texts()[0].get_text()
    )


def natural_order_values(table, name):
    return natural_order(table)[name].to_numpy(float)


def test_axis_labels_are_mathtext_not_underscores(tiny_store, no_checkpoints):
    """No axis label shows a literal underscore (sigma_i, P_m): subscripts are mathtext ($\\sigma_i$)."""

    figures = build_figures(tiny_store)
    for name, fig in figures.items():
        for text in (t for ax in fig.axes for t in (ax.get_xlabel(), ax.get_ylabel())):
            assert "_" not in re.sub(r"\$[^$]*\$", "", text), (name, text)
    assert "$P_m$" in figures["contribution_curves"]._suptitle.get_text()


def test_the_p_star_cells_are_legible(tiny_store, no_checkpoints):
    """The heat map's cell labels are at least the axes' tick size at a small depth."""
    ax = build_figures(tiny_store)["p_star_heatmap"].axes[0]
    assert ax.texts and min(t.get_fontsize() for t in ax.texts) >= 9


def test_a_model_name_with_dollars_does_not_break_the_mathtext():
    """The contribution figure's title mixes mathtext ($P_m$) with the model's name, taken as plain text."""

    curves = pd.DataFrame(
        {"matrix": [0] * 3, "layer": [0] * 3, "role": ["QK"] * 3, "p": [0.0, 1.0, 2.0], "c_over_c0": [1.0, 2.0, 3.0]}
    )
    fig = figure_contributions(curves, pd.DataFrame({"p_star": [0.0]}), "runs/$HOME/$x_1", grid_m=1, n_layers=1)
    fig.savefig(io.BytesIO(), format="png")  # a bad mathtext string raises here
    assert fig._suptitle.get_text().endswith(r"runs/\$HOME/\$x_1")


def test_the_store_figures_compose_into_the_caller_s_axes(tiny_store, no_checkpoints):
    """The store-level figures take ``ax=``: each single-panel one draws into the Axes it is
    given (a notebook's grid of panels), adds no Axes and no figure, and returns the caller's Figure with
    the same lines as when it makes its own."""
    from matplotlib.figure import Figure

    for draw in (
        lambda **kw: figure_bound_scaling(tiny_store, x="N", **kw),
        lambda **kw: figure_bounds_side_by_side(tiny_store, **kw),
    ):
        own = draw()
        fig = Figure()
        left, right = fig.subplots(1, 2)
        assert draw(ax=right) is fig and len(fig.axes) == 2 and not left.get_lines()
        theirs = [(list(line.get_xdata()), list(line.get_ydata())) for line in right.get_lines()]
        assert theirs == [(list(line.get_xdata()), list(line.get_ydata())) for line in own.axes[0].get_lines()]
        assert theirs and not fig.legends  # the legend stays inside the caller's Axes
