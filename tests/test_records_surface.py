"""What a researcher touches in a notebook: the Analysis' text and HTML views, its bounds as one
table, reopening saved results, its figures without a store, the tensor names of every matrix, the
package's completion list and the progress bar."""

import base64
import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file, save_file
from support.numpy_bert import write_tiny_bert

import specbound
from specbound.bounds import REGISTRY
from specbound.cli import main
from specbound.io.default_checkpoint import DEFAULT_NAME, default_checkpoint
from specbound.records.schema import DERIVED_COLUMNS, RENAMED_COLUMNS
from specbound.records.view import fmt, format_summary, short_name
from specbound.tools.miniatures import write_miniatures


@pytest.fixture(scope="module")
def default():
    return specbound.analyze(threads=1, jobs=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = write_tiny_bert(tmp_path_factory.mktemp("surface") / "tiny", seed=3, L=3, N=16, H=4, d_ff=24)
    return folder, specbound.analyze(folder, threads=1, jobs=1)


# --- names and text -------------------------------------------------------------------------------


def test_default_checkpoint_is_named_by_its_model(default):
    assert default.source == f"{DEFAULT_NAME} (embedded default)"
    assert default.location == str(default_checkpoint())
    doc = default.to_dict()
    assert doc["source"] == default.source and doc["location"] == default.location


def test_str_is_the_cli_summary(default):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["analyze", "--threads", "1", "--jobs", "1", "--no-progress"]) == 0
    assert str(default) == out.getvalue().rstrip("\n") == format_summary(default)


def test_repr_is_one_short_line(default):
    text = repr(default)
    assert "\n" not in text and len(text) < 200
    assert text.startswith(f"<specbound.Analysis of {DEFAULT_NAME}") and "spectral_adaptive=" in text


def paragraphs(text: str) -> list[str]:
    """The summary's lines with each wrapped paragraph joined (a continuation line starts with two
    spaces and then text; a table's lines start with more spaces, or none)."""
    out: list[str] = []
    for line in text.splitlines():
        if out and line.startswith("  ") and not line.startswith("   ") and out[-1] and not out[-1].startswith(" "):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def test_summary_lines_fit_100_columns(default, tiny):
    """No line of the first screen exceeds 100 columns (two once exceeded 200)."""
    folder, _ = tiny
    gap = specbound.analyze(folder, n=1000, margin=0.5, threads=1, jobs=1)
    for text in (str(default), str(gap)):
        assert max(map(len, text.splitlines())) <= 100


def test_summary_header_names_only_the_columns_it_has(default, tiny):
    folder, _ = tiny
    text = str(default)
    header = next(l for l in paragraphs(text) if l.startswith("bounds ("))
    assert "gap" not in header and "from init" not in header  # neither column is in this table
    gap = specbound.analyze(folder, n=1000, margin=0.5, threads=1, jobs=1)
    lines = paragraphs(str(gap))
    gap_header = next(l for l in lines if l.startswith("bounds ("))
    table_head = lines[lines.index(gap_header) + 1]
    assert "gap =" in gap_header and "gap" in table_head.split()
    # one legend paragraph says what Lambda, the downstream factor and xi are, just above the per-layer
    # table; the downstream factor is the paper's alpha_l, named so that no reader takes it for
    # WeightWatcher's alpha
    lines = paragraphs(text)
    legend = next(i for i, l in enumerate(lines) if l.startswith("Lambda ="))
    assert "downstream_factor =" in lines[legend] and "alpha_l" in lines[legend] and "xi =" in lines[legend]
    assert lines[legend + 1].split()[:2] == ["Lambda", "downstream_factor"] and "xi" in lines[legend + 1].split()
    assert "alpha" not in lines[legend + 1]


@pytest.mark.parametrize(
    "x, text",
    [
        (20573.03, "20573"),
        (1.498623e12, "1.4986e+12"),
        (0.93440, "0.93440"),
        (384.0, "384.00"),
        (1330.22, "1330.2"),
        (99999.6, "1.0000e+05"),
        (0.000999, "9.9900e-04"),
        (-5.5, "-5.5000"),
        (7, "7"),
        (float("nan"), "-"),
        (0.0, "0"),
    ],
)
def test_numbers_in_one_format(x, text):
    assert fmt(x) == text
    if isinstance(x, float) and math.isfinite(x) and x:
        assert float(text) == pytest.approx(x, rel=5e-5)  # five significant digits


def test_every_float_of_the_summary_has_five_significant_digits(default):
    body = str(default).split("\n", 4)[4]  # past the header (option values such as rank_tol=1e-10)
    numbers = re.findall(r"(?<![\w=*/.-])-?\d+\.\d+(?:e[+-]\d+)?(?![\w%])", body)
    assert numbers
    for n in numbers:
        digits = re.sub(r"e.*$", "", n).replace("-", "").replace(".", "").lstrip("0")
        assert len(digits) == 5 or (n.startswith("0.") and len(re.sub(r"^0\.0*", "", n)) == 5), n


@pytest.mark.parametrize(
    "source, name",
    [
        (
            "/home/u/.cache/huggingface/hub/models--google--bert_uncased_L-2_H-128_A-2/snapshots/0123abcd",
            "google/bert_uncased_L-2_H-128_A-2",
        ),
        ("/data/runs/exp1/step-1000", "step-1000"),
        ("/data/runs/exp1/step-1000/model.safetensors", "step-1000/model.safetensors"),
        ("google/bert_uncased_L-2_H-128_A-2", "google/bert_uncased_L-2_H-128_A-2"),
        ("google/bert_uncased_L-2_H-128_A-2@" + "0123abcd" * 5, "google/bert_uncased_L-2_H-128_A-2@0123abcd"),
        ("all-MiniLM-L6-v2 (embedded default)", "all-MiniLM-L6-v2 (embedded default)"),
    ],
)
def test_short_names(source, name):
    assert short_name(source) == name
    assert len(short_name("/x/" + "a" * 100)) == 48


# --- notebook view ----------------------------------------------------------------------------------


def test_repr_html_has_headline_roles_and_a_figure(default):
    page = default._repr_html_()
    assert "spectral_adaptive" in page and "edelman" in page and fmt(default.bounds["edelman"]) in page
    for role in ("QK", "OV", "FF_in", "FF_out"):
        assert f"<td>{role}</td>" in page
    images = re.findall(r'<img alt="([^"]+)"[^>]*src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 1 and "Singular values" in images[0][0]
    assert base64.b64decode(images[0][1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in page and "https://" not in page  # nothing fetched from outside
    assert 'class="sb-scroll"' in page  # wide tables scroll in their box


def test_repr_html_without_matplotlib(default, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    page = default._repr_html_()
    assert "<img" not in page and "spectral_adaptive" in page


# --- tables -------------------------------------------------------------------------------------------


def test_bounds_frame_is_every_bound(default):
    frame = default.bounds_frame()
    every = default.all_bounds()
    assert list(frame["bound"]) == list(every)  # headline first
    assert list(frame.columns) == ["bound", "group", "title", "reference", "value", "log10_value"]
    np.testing.assert_array_equal(frame["value"], [every[k] for k in frame["bound"]])
    # Two rounding paths: log10_value is the bound's own natural log (a sum of logs where it has
    # one) over ln 10, value its linear-space product.  Each is within a few hundred roundings of the
    # exact number, so they agree to 1e-13 in log10 (here: 1 ulp).  A relative 1e-15 allowed 4.6 ulps
    # at log10 = 16.5 and would not have allowed one at a bound near 1 (log10 near 0).
    np.testing.assert_allclose(frame["log10_value"], np.log10(frame["value"]), rtol=1e-14, atol=1e-13)
    for row in frame.itertuples():
        assert (row.group, row.title, row.reference) == (
            REGISTRY[row.bound].group,
            REGISTRY[row.bound].title,
            REGISTRY[row.bound].reference,
        )


def test_bounds_frame_with_gap_and_init(tiny, tmp_path):
    folder, _ = tiny
    init = write_tiny_bert(tmp_path / "init", seed=99, L=3, N=16, H=4, d_ff=24)
    a = specbound.analyze(folder, init=init, n=1000, margin=0.5, threads=1, jobs=1)
    frame = a.bounds_frame().set_index("bound")
    for name, g in a.gap_bound["bounds"].items():
        assert frame.loc[name, "gap"] == g["gap"] and frame.loc[name, "vacuous"] == g["vacuous"]
    for name, value in a.from_init.items():
        assert frame.loc[name, "from_init"] == value


def test_save_then_load_round_trips(tiny, tmp_path):
    _, a = tiny
    a.save(tmp_path / "out")
    b = specbound.Analysis.load(tmp_path / "out")
    for name in ("matrices", "layers", "singular_values"):
        pd.testing.assert_frame_equal(getattr(b, name), getattr(a, name), check_exact=True)
    assert b.bounds == a.bounds and b.baselines == a.baselines and b.adaptive_variants == a.adaptive_variants
    assert (b.source, b.location, b.model, b.options) == (a.source, a.location, a.model, a.options)
    assert b.to_dict() == a.to_dict() and str(b) == str(a)


def _as_schema(folder, version):
    """Rewrite a saved analysis as ``version`` (1 or 2) wrote it: without schema 3's
    ``lipschitz_factor`` columns, and (schema 1) the downstream factor under its old name ``alpha``
    (``log10_alpha``) in the tables and the document."""

    old = {new: old for old, new in RENAMED_COLUMNS.items()} if version == 1 else {}
    for name in ("matrices", "layers"):
        for ext in ("parquet", "csv"):
            path = folder / f"{name}.{ext}"
            table = pd.read_parquet(path) if ext == "parquet" else pd.read_csv(path)
            assert set(RENAMED_COLUMNS.values()) <= set(table.columns)
            table = table.rename(columns=old).drop(columns=[c for c in DERIVED_COLUMNS if c in table.columns])
            table.to_parquet(path, index=False) if ext == "parquet" else table.to_csv(path, index=False)
    doc = json.loads((folder / "summary.json").read_text())
    doc["schema_version"] = version
    for name in ("matrices", "layers"):
        doc[name] = [{old.get(k, k): v for k, v in row.items() if k not in DERIVED_COLUMNS} for row in doc[name]]
    (folder / "summary.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("version", [1, 2])
def test_a_folder_saved_with_an_older_schema_loads(tiny, tmp_path, version):
    """Schema 1 named the downstream factor ``alpha``; schemas 1 and 2 had no ``lipschitz_factor``
    columns (a plain model's are its spectral and Frobenius norms): such a folder reopens with today's
    columns, the same numbers, and saves again as schema 3."""
    _, a = tiny
    a.save(tmp_path / "old")
    _as_schema(tmp_path / "old", version)
    columns = pd.read_parquet(tmp_path / "old" / "matrices.parquet").columns
    assert ("alpha" in columns) == (version == 1) and "lipschitz_factor" not in columns
    b = specbound.Analysis.load(tmp_path / "old")
    for name in ("matrices", "layers"):
        pd.testing.assert_frame_equal(getattr(b, name), getattr(a, name), check_exact=True)
        assert "alpha" not in getattr(b, name).columns and "log10_alpha" not in getattr(b, name).columns
    assert str(b) == str(a) and b.to_dict() == a.to_dict() and b.to_dict()["schema_version"] == 3


def test_no_output_names_a_column_alpha(tiny, tmp_path):
    """WeightWatcher's alpha is a power-law exponent: no table, JSON key or first-screen column of
    ours is called alpha (the downstream factor is ``downstream_factor``)."""
    _, a = tiny
    doc = a.to_dict()
    keys = {k for row in doc["layers"] + doc["matrices"] for k in row}
    assert "downstream_factor" in keys and "log10_downstream_factor" in keys
    assert not any("alpha" in k for k in keys)
    for name in ("matrices", "layers"):
        assert not any("alpha" in c for c in getattr(a, name).columns)
    verbose = format_summary(a, verbose=True)
    headers = [
        line.split()
        for line in verbose.splitlines()  # the table heads, not the legend line
        if line.lstrip().startswith(("Lambda", "layer")) and not line.startswith("Lambda =")
    ]
    assert headers and not any("alpha" in h for row in headers for h in row)


def test_load_restores_non_finite_bounds_and_the_gap(tiny, tmp_path):
    folder, _ = tiny
    a = specbound.analyze(folder, n=1000, margin=0.5, threads=1, jobs=1)
    a.baselines["spectral_product"] = math.inf  # as an overflowed product would be
    a.save(tmp_path / "g")
    b = specbound.Analysis.load(tmp_path / "g")
    assert b.baselines["spectral_product"] == math.inf and b.gap_bound == a.gap_bound


def test_load_of_a_folder_without_results_is_one_line(tmp_path):
    with pytest.raises(specbound.SpecboundError, match="no summary.json"):
        specbound.Analysis.load(tmp_path)


def test_no_column_is_named_index_and_shapes_agree(default, tmp_path):
    assert "index" not in default.singular_values.columns and "sv_index" in default.singular_values.columns
    for name in ("matrices", "layers", "singular_values"):
        assert "index" not in getattr(default, name).columns
    # per matrix, sv_index runs 1..k
    counts = default.singular_values.groupby("matrix")["sv_index"].agg(["min", "max", "size"])
    assert (counts["min"] == 1).all() and (counts["max"] == counts["size"]).all()
    # JSON and Parquet describe a matrix's shape the same way (rows, cols), JSON keeps schema 1's shape
    doc = default.to_dict()
    for row, (_, rec) in zip(doc["matrices"], default.matrices.iterrows()):
        assert (row["rows"], row["cols"]) == (rec["rows"], rec["cols"]) and row["shape"] == [row["rows"], row["cols"]]
        assert row["tensors"] == rec["tensors"]


def test_saved_tables_concatenate_into_one_tidy_frame(tmp_path):
    """Two analyses saved side by side read back as one frame, told apart by their source column."""
    frames = []
    for seed in (1, 2):
        folder = write_tiny_bert(tmp_path / f"m{seed}", seed=seed)
        specbound.analyze(folder, threads=1, jobs=1).save(tmp_path / f"out{seed}")
        frames.append(pd.read_parquet(tmp_path / f"out{seed}" / "matrices.parquet"))
    both = pd.concat(frames, ignore_index=True)
    assert set(both["source"]) == {str(tmp_path / "m1"), str(tmp_path / "m2")}
    assert both.groupby("source").size().tolist() == [len(frames[0])] * 2


# --- tensor names: the named slices are the analysed matrices ---------------------------------------


def _slice(name_text):
    name, a, b = re.fullmatch(r"(.+)\[(\d+):(\d+)\]", name_text).groups()
    return name, int(a), int(b)


def _check_tensor_names(analysis, tensors, layouts):
    """Rebuild every matrix from the tensors its ``tensors`` entry names and compare its norms.

    ``layouts``: role suffix -> "linear" ((out, in) storage) or "conv1d" ((in, out)); the bracket is
    the head's slice of the output features (q, k, v, fused qkv) or of o's input features.
    """

    def out_cols(name, a, b):  # the head's output features, as an (N, d) factor
        w = tensors[name].astype(np.float64)
        return w[a:b, :].T if layouts(name) == "linear" else w[:, a:b]

    def o_rows(name, a, b):  # W_O^h, (d, N)
        w = tensors[name].astype(np.float64)
        return w[:, a:b].T if layouts(name) == "linear" else w[a:b, :]

    for rec in analysis.matrices.itertuples():
        parts = rec.tensors.split("|")
        if rec.role == "QK":
            (q, qa, qb), (k, ka, kb) = map(_slice, parts)
            m = out_cols(q, qa, qb) @ out_cols(k, ka, kb).T
        elif rec.role == "OV":
            (v, va, vb), (o, oa, ob) = map(_slice, parts)
            m = out_cols(v, va, vb) @ o_rows(o, oa, ob)
        else:
            assert len(parts) == 1 and "[" not in parts[0]
            m = tensors[parts[0]].astype(np.float64)
        s = np.linalg.svd(m, compute_uv=False)
        assert s[0] == pytest.approx(rec.spectral_norm, rel=1e-5), rec.tensors
        assert np.sqrt(np.sum(s**2)) == pytest.approx(rec.frobenius_norm, rel=1e-5), rec.tensors


def test_tensor_names_of_a_bert(tiny):
    folder, a = tiny
    tensors = load_file(str(folder / "model.safetensors"))
    assert a.matrices["tensors"].notna().all()
    assert a.matrices.loc[0, "tensors"] == (
        "encoder.layer.0.attention.self.query.weight[0:4]|encoder.layer.0.attention.self.key.weight[0:4]"
    )
    _check_tensor_names(a, tensors, lambda name: "linear")


def test_tensor_names_of_a_fused_gpt2(tmp_path):
    L, N, H, d_ff = 2, 12, 3, 20
    rng = np.random.default_rng(7)
    tensors = {}
    for l in range(L):
        for name, shape in (
            ("attn.c_attn", (N, 3 * N)),
            ("attn.c_proj", (N, N)),
            ("mlp.c_fc", (N, d_ff)),
            ("mlp.c_proj", (d_ff, N)),
        ):
            tensors[f"h.{l}.{name}.weight"] = (0.3 * rng.standard_normal(shape)).astype(np.float32)
    folder = tmp_path / "gpt2"
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": L,
                "n_embd": N,
                "n_head": H,
                "n_inner": d_ff,
                "activation_function": "gelu_new",
            }
        )
    )
    a = specbound.analyze(folder, threads=1, jobs=1)
    d = N // H
    assert (
        a.matrices.loc[1, "tensors"]
        == f"h.0.attn.c_attn.weight[{d}:{2 * d}]|h.0.attn.c_attn.weight[{N + d}:{N + 2 * d}]"
    )
    _check_tensor_names(a, tensors, lambda name: "conv1d")


# --- figures without a store ------------------------------------------------------------------------


def test_one_model_figures(tiny):
    _, a = tiny
    fig = a.plot.spectra()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["QK (per head)", "OV (per head)", "FF_in", "FF_out"]
    for ax, role in zip(axes, ("QK", "OV", "FF_in", "FF_out")):
        assert len(ax.get_lines()) == (a.matrices["role"] == role).sum()  # one line per matrix
        assert ax.get_yscale() == "log"
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [f"layer {l}" for l in range(a.model["L"])]
    assert fig.get_figwidth() <= 7.5
    curves = a.plot.contributions()
    qk = curves.axes[0]
    assert qk.get_xlabel() == "Schatten index p" and qk.get_ylabel() == "C(p) / C(0)"
    # every curve starts at C(0)/C(0) = 1 and the dots sit at each matrix's p*
    lines = qk.get_lines()
    n_qk = (a.matrices["role"] == "QK").sum()
    assert all(l.get_ydata()[0] == pytest.approx(1.0) for l in lines[:n_qk])
    dots = lines[n_qk]
    np.testing.assert_allclose(sorted(dots.get_xdata()), sorted(a.matrices.loc[a.matrices.role == "QK", "p_star"]))
    heat = a.plot.p_star().axes[0].get_images()[0].get_array()
    assert heat[0, 0] == pytest.approx(a.matrices[(a.matrices.role == "QK") & (a.matrices.layer == 0)]["p_star"].mean())


# --- the package and the progress bar ---------------------------------------------------------------


def test_dir_lists_the_api():
    names = dir(specbound)
    assert {"analyze", "Analysis", "AnalysisOptions", "SpecboundError", "__version__"} <= set(names)
    assert specbound.AnalysisOptions is __import__("specbound.options").options.AnalysisOptions


def test_progress_true_shows_a_bar_with_its_total(tiny, capsys):
    folder, a = tiny
    b = specbound.analyze(folder, progress=True, threads=1, jobs=1)
    err = capsys.readouterr().err
    frames = [f for f in re.split(r"[\r\n]", err) if "layers" in f]
    assert frames and "0/3" in frames[0]  # the total is known from the first frame
    assert "3/3" in frames[-1]
    assert b.bounds == a.bounds


def test_cli_bar_shows_its_total_from_the_first_frame(tiny):
    folder, _ = tiny
    env = {**os.environ, "PYTHONPATH": str(Path(specbound.__file__).resolve().parents[1]), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "specbound.cli", "analyze", str(folder), "--progress", "--quiet", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    frames = [f for f in re.split(r"[\r\n]", proc.stderr) if "layers" in f]
    assert frames and all("/3" in f for f in frames) and "3/3" in frames[-1]


def test_values_beyond_float64_print_from_their_log():
    assert fmt(math.inf, 600.0712) == "10^600.07" and fmt(None, 12.5) == "10^12.50"
    assert fmt(math.inf) == "inf" and fmt(None) == "-"


def test_load_reads_a_null_bound_with_its_log_as_infinite(tiny, tmp_path):
    _, a = tiny
    a.save(tmp_path / "n")
    doc = json.loads((tmp_path / "n" / "summary.json").read_text())
    doc["baselines"]["spectral_product"] = None  # how a value beyond float64 is written (strict JSON)
    doc.setdefault("log10_bounds", {})["spectral_product"] = 400.0
    doc["baselines"]["bft"] = None  # null without a log: unknown
    doc["log10_bounds"].pop("bft", None)
    (tmp_path / "n" / "summary.json").write_text(json.dumps(doc))
    b = specbound.Analysis.load(tmp_path / "n")
    assert b.baselines["spectral_product"] == math.inf and math.isnan(b.baselines["bft"])


def test_the_first_screen_says_why_every_p_star_is_zero(default, tmp_path):
    """MiniLM chooses p* = 0 everywhere: the summary says why (the downstream factors) and points
    to a model where p* varies; that model's summary has no such line and does vary."""

    text = str(default)
    line = next(x for x in paragraphs(text) if x.startswith("every matrix chose p* = 0"))
    assert "downstream factor (up to 2.8291e+22 here)" in line and "bert_uncased_L-10_H-128_A-2" in line
    write_miniatures(tmp_path, layout="folders", depths=(10,), widths=(128,))
    narrow = specbound.analyze(tmp_path / "bert_uncased_L-10_H-128_A-2", threads=1, jobs=1)
    assert (narrow.matrices["p_star"] > 0).any()
    assert "every matrix chose p* = 0" not in str(narrow)


def test_plots_compose_into_the_callers_axes(tiny):
    """Every plot takes ax= and returns its Axes (matplotlib's convention); one role's panel
    holds one line per matrix of that role, and the figure-level call is unchanged."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    _, a = tiny
    fig = Figure()
    left, middle, right = fig.subplots(1, 3)
    assert a.plot.spectra(role="OV", ax=left) is left
    assert len(left.lines) == int((a.matrices["role"] == "OV").sum())  # one spectrum per OV head
    assert a.plot.contributions(role="FF_in", ax=middle) is middle
    assert len(middle.lines) == int((a.matrices["role"] == "FF_in").sum()) + 2  # + the p* dots and the C(0) line
    assert a.plot.p_star(ax=right) is right and right.images
    assert a.plot.spectra(role="QK").get_title().startswith("QK")  # a panel of its own: a new figure's Axes
    assert hasattr(a.plot.spectra(), "savefig")  # no ax, no role: the whole figure as before
    with pytest.raises(specbound.SpecboundError, match="no role .XX."):
        a.plot.spectra(role="XX")


def test_a_long_location_is_shortened_on_the_first_screen(tiny, tmp_path):
    """CI installs the default under a deep venv path: the 'from' line must still fit 100 columns."""

    folder, _ = tiny
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "tiny"
    shutil.copytree(folder, deep)
    result = specbound.analyze(deep, threads=1, jobs=1)
    text = str(result)
    assert max(map(len, text.splitlines())) <= 100
    assert str(result.location) == str(deep)  # the full path stays in the result
    assert "..." in text.splitlines()[0] + text.splitlines()[1]
