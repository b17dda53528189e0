"""specbound compare / specbound.compare: two or more models side by side.  Every number in its
tables is checked against the separate analyses it stands for (each bound, its ratio, each layer's
and each role's adaptive sum, their differences), on two folders, a base and its LoRA adapter, a
saved analysis and a store's record; the command line writes the tables and the figure; the
notebook view holds the tables and the figure."""

from __future__ import annotations

import json
import math

import pytest
from test_lora import _bert, build_adapter

import specbound
from specbound import SpecboundError
from specbound.cli import main
from specbound.report.compare import Comparison, compare, default_names
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store


def _analyze(source, **options):
    return specbound.analyze(source, threads=1, jobs=1, **options)


@pytest.fixture(scope="module")
def pair(tiny_bert_dir, tiny_bert_cls_dir):
    return _analyze(tiny_bert_dir), _analyze(tiny_bert_cls_dir)


def test_two_folders_side_by_side_equal_their_own_analyses(tiny_bert_dir, tiny_bert_cls_dir, pair):
    a, b = pair
    c = compare(tiny_bert_dir, tiny_bert_cls_dir, names=["small", "cls"], threads=1)
    bounds = c.bounds_frame()
    for name, value in a.all_bounds().items():
        assert bounds.loc[name, "small"] == pytest.approx(value, rel=1e-12)
        assert bounds.loc[name, "cls"] == pytest.approx(b.all_bounds()[name], rel=1e-12)
        assert bounds.loc[name, "cls / small"] == pytest.approx(b.all_bounds()[name] / value, rel=1e-9)
    layers = c.layers_frame()  # 2 layers against 3: the third is the second model's alone
    assert list(layers.index) == [0, 1, 2] and math.isnan(layers.loc[2, "small"])
    for layer, row in a.layers.set_index("layer").iterrows():
        assert layers.loc[layer, "small"] == pytest.approx(row["adaptive"])
        assert layers.loc[layer, "cls - small"] == pytest.approx(
            b.layers.set_index("layer").loc[layer, "adaptive"] - row["adaptive"]
        )
    roles = c.roles_frame()
    for role in ("QK", "OV", "FF_in", "FF_out"):  # a plain sum over the matrices table, the oracle
        mine = a.matrices.loc[a.matrices["role"] == role, "contribution"].sum()
        theirs = b.matrices.loc[b.matrices["role"] == role, "contribution"].sum()
        assert roles.loc[role, "small"] == pytest.approx(mine) and roles.loc[role, "cls"] == pytest.approx(theirs)
        assert roles.loc[role, "cls - small"] == pytest.approx(theirs - mine)
    assert roles["small"].sum() == pytest.approx(a.matrices["contribution"].sum())
    text = str(c)
    assert "B / A" in text and "B - A" in text and "per role" in text and max(map(len, text.splitlines())) <= 100
    assert any(line.split()[:2] == ["B", "cls"] for line in text.splitlines())  # the models table: B is cls


def test_a_saved_analysis_and_a_store_record_compare_as_the_checkpoint(tiny_bert_dir, pair, tmp_path):
    a, _ = pair
    a.save(tmp_path / "saved")
    (source,) = expand_sources([str(tiny_bert_dir)])
    run_sweep([source], tmp_path / "store", progress=False)
    c = compare(a, tmp_path / "saved", f"{tmp_path / 'store'}#{source.name}", names=["live", "saved", "stored"])
    bounds = c.bounds_frame()
    for name in ("saved", "stored"):
        assert bounds[f"{name} / live"].to_numpy() == pytest.approx(1.0, rel=1e-12)
    assert (c.layers_frame()["stored - live"].abs() < 1e-9).all()
    (key,) = Store(tmp_path / "store").keys()
    assert compare(a, f"{tmp_path / 'store'}#{key[:8]}").bounds_frame().iloc[:, -1].to_numpy() == pytest.approx(
        1.0, rel=1e-12
    )
    with pytest.raises(SpecboundError, match="no record with that key"):
        compare(a, f"{tmp_path / 'store'}#nothing-like-it")


def test_a_base_and_its_adapter(tmp_path):
    pytest.importorskip("peft")

    base, adapter, _ = build_adapter(tmp_path, _bert, seed=3, r=2, lora_alpha=4, target_modules=["query", "value"])
    c = compare(base, adapter, names=["base", "adapter"], base=str(base), threads=1)
    merged = _analyze(adapter, base=base)
    assert c.bounds_frame().loc["spectral_adaptive", "adapter"] == pytest.approx(
        merged.bounds["spectral_adaptive"], rel=1e-12
    )
    frame = c.bounds_frame()
    assert frame.loc["spectral_adaptive (W - W0)", "adapter"] == pytest.approx(
        merged.from_init["spectral_adaptive"], rel=1e-12
    )
    assert math.isnan(frame.loc["spectral_adaptive (W - W0)", "base"])  # the base has no W0
    assert "LoRA adapter" in c.models_frame().loc["adapter", "note"]


def test_cli_writes_tables_and_the_figure(tiny_bert_dir, tiny_bert_cls_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")

    out = tmp_path / "cmp"
    assert main(["compare", str(tiny_bert_dir), str(tiny_bert_cls_dir), "--out", str(out), "--threads", "1"]) == 0
    assert {p.name for p in out.iterdir()} == {"bounds.csv", "layers.csv", "roles.csv", "compare.png", "compare.pdf"}
    capsys.readouterr()
    assert main(["compare", str(tiny_bert_dir), str(tiny_bert_cls_dir), "--format", "json", "--threads", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["log10_bounds"]["spectral_adaptive"]) == set(doc["models"])
    assert main(["compare", str(tiny_bert_dir)]) == 2
    assert "two or more models" in capsys.readouterr().err


def test_figure_axes_and_notebook_view(pair):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    c = Comparison({"a": pair[0], "b": pair[1]})
    fig = Figure()
    ax = fig.add_subplot()
    assert c.plot_bounds(ax=ax) is ax and len(ax.lines) == 2  # composes into the caller's Axes
    ratios = Figure().add_subplot()
    assert c.plot_ratios(ax=ratios) is ratios
    (drawn,) = [line for line in ratios.lines if line.get_label() == "b / a"]  # the reference line at 1 aside
    expected = [b / a for a, b in zip(pair[0].all_bounds().values(), pair[1].all_bounds().values())]
    assert drawn.get_ydata()[: len(expected)] == pytest.approx(expected, rel=1e-9)
    assert c.plot_layers() is not None
    html = c._repr_html_()
    assert "<img src='data:image/png;base64," in html and "per role" in html and "b / a" in html
    with pytest.raises(SpecboundError, match="two or more models"):
        compare(pair[0])
    with pytest.raises(SpecboundError, match="one per model"):
        compare(pair[0], pair[1], names=["x"])


def test_default_names_are_short_and_distinct():
    assert default_names(["minis/bert_L-4", "minis/bert_L-8"]) == ["bert_L-4", "bert_L-8"]
    assert default_names(["a/model", "b/model"]) == ["a/model", "b/model"]
    assert default_names(["x", "x"]) == ["x #1", "x #2"]


def test_analyses_made_with_different_options_are_flagged(tiny_bert_dir, tiny_bert_cls_dir, pair, capsys):
    """compare says when two analyses were made with different options (the training
    page's grid_m=12 against the command line's default).  Each model's own defaults (its grid
    ceil(L + ln N), l_phi from its activation) are alike; a setting given differently is named, with
    each model's value, in the text, the notebook view and the JSON."""

    a, b = pair
    assert a.options["grid_m"] != b.options["grid_m"]  # two sizes, two default grids: not a difference
    assert Comparison({"a": a, "b": b}).option_differences() == {}
    assert "options differ" not in str(Comparison({"a": a, "b": b}))
    coarse = _analyze(tiny_bert_dir, grid_m=12, rank_tol=1e-8, n=1000, margin=0.5)
    c = Comparison({"default": a, "coarse": coarse})
    differ = c.option_differences()
    assert differ == {
        "grid_m": {"default": "default", "coarse": 12},
        "rank_tol": {"default": 1e-10, "coarse": 1e-8},
        "n": {"default": None, "coarse": 1000},
        "margin": {"default": None, "coarse": 0.5},
    }
    (line,) = [line for line in str(c).splitlines() if line.startswith("options differ")]
    assert "grid_m (A default, B 12)" in line and "rank_tol (A 1e-10, B 1e-08)" in line
    assert "grid_m (default default, coarse 12)" in c._repr_html_()
    assert c.to_dict()["options_differ"] == differ
    same = Comparison({"x": coarse, "y": _analyze(tiny_bert_cls_dir, grid_m=12, rank_tol=1e-8, n=1000, margin=0.5)})
    assert same.option_differences() == {}
    assert main(["compare", str(tiny_bert_dir), str(tiny_bert_dir), "--grid-m", "9", "--threads", "1"]) == 0
    assert "options differ" not in capsys.readouterr().out  # the command line analyses every model alike
