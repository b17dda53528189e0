"""`specbound analyze` on the embedded default checkpoint (all-MiniLM-L6-v2): the text summary,
the JSON schema, the tables written by --out, and what the analysis imports."""

import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the base install's tomli (pyproject.toml: python_version < '3.11')
    import tomli as tomllib

from support.numpy_bert import write_tiny_bert

import specbound
from specbound.cli import main
from specbound.io.default_checkpoint import default_checkpoint
from specbound.sweep.store import Store
from specbound.tools import doc_pages

ROLES = ("QK", "OV", "FF_in", "FF_out")
MATRIX_KEYS = {
    "layer",
    "head",
    "role",
    "shape",
    "rank",
    "spectral_norm",
    "frobenius_norm",
    "nuclear_norm",
    "stable_rank",
    "norm_2_1",
    "norm_1_1",
    "p_star",
    "contribution",
    "downstream_factor",
    "gamma",
}
SRC = str(Path(specbound.__file__).resolve().parents[1])  # the sources under test, for subprocesses


def run_main(*args):
    """``main(["analyze", *args])`` with its stdout/stderr captured (usable in module fixtures)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["analyze", *map(str, args)])
    return rc, out.getvalue(), err.getvalue()


def assert_path_line(line, prefix, path):
    """The first screen prints ``path`` whole when it fits 100 columns, else its home as ~ and its
    middle elided: what is left must be the path's own head and tail, and the line at most 100."""
    assert line.startswith(prefix) and len(line) <= 100, line
    shown = line[len(prefix) :]
    if shown == path:
        return
    home = os.path.expanduser("~")
    if shown.startswith("~") and path.startswith(home + os.sep):
        path = "~" + path[len(home) :]
    if shown == path:
        return
    head, sep, tail = shown.partition("...")
    assert sep and path.startswith(head) and path.endswith(tail) and len(head) > 10 and len(tail) > 40, (line, path)


def _reject_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


@pytest.fixture(scope="module")
def api():
    return specbound.analyze(threads=1)


@pytest.fixture(scope="module")
def text_run():
    return run_main("--threads", "1")


@pytest.fixture(scope="module")
def json_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("cli") / "out"
    rc, out, err = run_main("--format", "json", "--threads", "1", "--out", out_dir)
    return rc, out, err, out_dir


# --- text -----------------------------------------------------------------------------------------


def test_text_summary_has_the_bounds(text_run, api):
    rc, out, err = text_run
    assert rc == 0 and err == ""
    # the embedded default was analysed: named by its model, its folder on the next line
    assert out.splitlines()[0] == "specbound: all-MiniLM-L6-v2 (embedded default)"
    assert_path_line(out.splitlines()[1], "from     ", str(default_checkpoint()))
    for name in ("spectral_adaptive", "edelman"):
        match = re.search(rf"^\s*{name}\s+(?:[a-z_]+\s+)?([-+0-9.eE]+)\s", out, re.MULTILINE)
        assert match, f"no line for {name} in:\n{out}"
        # printed with 5 significant digits: within half a unit of the fifth
        assert float(match.group(1)) == pytest.approx(api.bounds[name], rel=5e-5)


def test_the_first_screen_says_where_to_read_which_number_to_report(text_run):
    """The demo prints thirteen numbers and says which to cite: right under the
    bounds table, the output names the page that does, and the page exists and ships (``specbound
    docs interpreting``)."""

    _, out, _ = text_run
    lines = out.splitlines()
    pointer = next(i for i, line in enumerate(lines) if line.startswith("which number to report"))
    assert pointer < next(i for i, line in enumerate(lines) if line.startswith("per layer"))
    assert "specbound docs interpreting (docs/interpreting.md)" in " ".join(lines[pointer : pointer + 2])
    assert "## Which number" in doc_pages.page_path("interpreting").read_text()


def test_text_summary_has_the_per_role_p_star_distribution(text_run, api):
    _, out, _ = text_run
    m = api.options["grid_m"]
    assert f"m={m}" in out
    section = out[out.index("per role") :]
    for role in ROLES:
        p_stars = api.matrices.loc[api.matrices["role"] == role, "p_star"]
        line = next(l for l in section.splitlines() if l.split() and l.split()[0] == role)
        counts = Counter(Fraction(round(p * m), m) for p in p_stars)
        for p, n in counts.items():
            assert f"p*={p}: {n}" in line, (role, line)
        # the per-role matrix count is printed too
        assert line.split()[1] == str(len(p_stars))


# --- JSON -----------------------------------------------------------------------------------------


def test_json_schema(json_run, api):
    rc, out, err, _ = json_run
    assert rc == 0 and err == ""
    doc = json.loads(out, parse_constant=_reject_constant)  # strict JSON: no NaN/Infinity

    model = doc["model"]
    assert {"family", "L", "N", "H", "d_head", "d_ff"} <= set(model)
    assert (model["family"], model["L"], model["N"], model["H"], model["d_head"], model["d_ff"]) == (
        "bert",
        6,
        384,
        12,
        32,
        1536,
    )

    assert set(doc["bounds"]) >= {"spectral_adaptive", "edelman"}
    for name, value in doc["bounds"].items():
        assert isinstance(value, float) and value == pytest.approx(api.bounds[name], rel=1e-12)

    rows = doc["matrices"]
    assert len(rows) == model["L"] * (2 * model["H"] + 2)
    N, d_ff = model["N"], model["d_ff"]
    shapes = {"QK": [N, N], "OV": [N, N], "FF_in": [N, d_ff], "FF_out": [d_ff, N]}
    for row in rows:
        assert MATRIX_KEYS <= set(row), MATRIX_KEYS - set(row)
        assert row["role"] in ROLES
        assert isinstance(row["layer"], int) and 0 <= row["layer"] < model["L"]
        if row["role"] in ("QK", "OV"):
            assert isinstance(row["head"], int) and 0 <= row["head"] < model["H"]
        else:
            assert row["head"] is None
        assert row["shape"] == shapes[row["role"]]
        assert isinstance(row["rank"], int) and 0 < row["rank"] <= min(row["shape"])
        for key in MATRIX_KEYS - {"layer", "head", "role", "shape", "rank"}:
            assert isinstance(row[key], float) and math.isfinite(row[key]), (key, row[key])
        assert 0 <= row["p_star"] <= 2

    # the same numbers as the API, row by row
    ours = api.matrices
    assert [r["role"] for r in rows] == list(ours["role"])
    for key in (
        "rank",
        "spectral_norm",
        "frobenius_norm",
        "nuclear_norm",
        "stable_rank",
        "norm_2_1",
        "norm_1_1",
        "p_star",
        "contribution",
        "downstream_factor",
        "gamma",
    ):
        np.testing.assert_allclose([r[key] for r in rows], ours[key].to_numpy(float), rtol=1e-12, err_msg=key)


# --- --out ----------------------------------------------------------------------------------------


def test_out_writes_every_table_and_the_summary(json_run):
    _, _, _, out_dir = json_run
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == sorted(
        [f"{t}.{ext}" for t in ("matrices", "layers", "singular_values") for ext in ("parquet", "csv")]
        + ["summary.json"]
    )  # no temp files left


def test_parquet_round_trips_to_the_api_numbers(json_run, api):
    _, _, _, out_dir = json_run
    for name, table in (("matrices", api.matrices), ("layers", api.layers), ("singular_values", api.singular_values)):
        back = pd.read_parquet(out_dir / f"{name}.parquet")
        assert back.columns[0] == "source" and set(back["source"]) == {api.source}  # tidy: says whose rows
        pd.testing.assert_frame_equal(back.drop(columns="source"), table, check_exact=False, rtol=1e-12, atol=0)
    back = pd.read_parquet(out_dir / "matrices.parquet").drop(columns="source")
    assert back["head"].isna().sum() == 2 * api.model["L"]  # FF rows keep a null head
    # the singular values of one matrix are its norms' ingredients
    sv = pd.read_parquet(out_dir / "singular_values.parquet")
    first = sv[sv["matrix"] == 0]["sigma"].to_numpy()
    assert np.sqrt(np.sum(first**2)) == pytest.approx(back.loc[0, "frobenius_norm"], rel=1e-12)
    assert first.max() == pytest.approx(back.loc[0, "spectral_norm"], rel=1e-15)


def test_csv_and_summary_json_agree(json_run, api):
    rc, out, _, out_dir = json_run
    csv = pd.read_csv(out_dir / "matrices.csv")
    assert list(csv.columns) == ["source", *api.matrices.columns]
    for col in ("spectral_norm", "norm_1_1", "contribution", "downstream_factor"):
        np.testing.assert_allclose(csv[col], api.matrices[col], rtol=1e-12, err_msg=col)
    assert json.loads((out_dir / "summary.json").read_text()) == json.loads(out)


def test_text_with_out_says_where(tmp_path):
    rc, out, err = run_main("--threads", "1", "--out", tmp_path / "t")
    assert rc == 0 and err == ""
    assert f"written to {tmp_path / 't'}" in out
    assert (tmp_path / "t" / "summary.json").is_file()


# --- processes and imports ------------------------------------------------------------------------


def _python(*args):
    """Run the test's interpreter on the sources under test (PYTHONPATH=SRC), one BLAS thread."""
    env = {**os.environ, "PYTHONPATH": SRC, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def _lazy_modules() -> list[str]:
    """The modules pyproject.toml keeps out of module level (ruff's banned-module-level-imports)."""
    project = tomllib.loads((Path(SRC).parent / "pyproject.toml").read_text())
    return project["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-module-level-imports"]


def test_analysis_imports_none_of_the_lazy_modules():
    """An analysis of local files loads none of the modules declared lazy (torch, transformers, matplotlib,
    huggingface_hub, gguf, tqdm, scipy.stats, ...): the declaration in pyproject.toml is what this checks."""
    lazy = _lazy_modules()
    assert {"torch", "transformers", "matplotlib", "onnx", "huggingface_hub", "tqdm"} <= set(lazy)
    code = (
        "import specbound, sys; assert specbound.__file__.startswith(sys.argv[1]), specbound.__file__; "
        "specbound.analyze(threads=1); "
        "heavy = [m for m in sys.argv[2:] if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    proc = _python("-c", code, SRC, *lazy)
    assert proc.returncode == 0, proc.stderr


def test_import_specbound_is_cheap():
    code = (
        "import specbound, sys; "
        "heavy = [m for m in ('numpy', 'pandas', 'scipy', 'pyarrow', 'torch', 'transformers', 'matplotlib', "
        "'onnx') if m in sys.modules]; assert not heavy, heavy; "
        "ours = sorted(m for m in sys.modules if m.startswith('specbound')); "
        "assert ours == ['specbound', 'specbound.errors'], ours"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr


def test_help_loads_the_parser_only():
    """``specbound --help`` imports the command line, its options and errors, and no stage: each command
    imports its own when it runs (why cli.py may import inside functions: pyproject.toml's per-file-ignores)."""
    code = (
        "import contextlib, io, sys\n"
        "from specbound.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "ours = sorted(m for m in sys.modules if m.startswith('specbound'))\n"
        "assert ours == ['specbound', 'specbound.cli', 'specbound.errors', 'specbound.options'], ours\n"
        "assert 'numpy' not in sys.modules\n"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr


def test_real_process_exit_status_and_single_line(tmp_path):
    proc = _python("-m", "specbound.cli", "analyze", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("specbound: error: ")


def test_progress_bar_on_request_only(tmp_path):
    """A layers bar on stderr with --progress (by default only on a terminal); stdout unchanged."""
    rc, out, err = run_main("--threads", "1", "--progress", "--format", "json")
    assert rc == 0 and "layers" in err and "6/6" in err
    rc2, out2, err2 = run_main("--threads", "1", "--no-progress", "--format", "json")
    assert rc2 == 0 and err2 == ""
    assert json.loads(out)["bounds"] == json.loads(out2)["bounds"]


# --- quiet, verbose, abbreviations, sweep options ---------------------------------------------------


def test_quiet_prints_the_headline_bounds_only(api):
    rc, out, err = run_main("--threads", "1", "--quiet", "--progress")  # --progress still wins over --quiet
    assert rc == 0 and "layers" in err
    lines = out.splitlines()
    assert [l.split()[0] for l in lines] == list(api.bounds)
    for line in lines:
        name, value = line.split()
        assert float(value) == pytest.approx(api.bounds[name], rel=5e-5)


def test_verbose_adds_every_matrix_with_its_tensors(api, text_run):
    rc, out, err = run_main("--threads", "1", "--verbose")
    assert rc == 0 and out.startswith(text_run[1].rstrip("\n"))  # the summary, then more
    section = out[out.index("\nevery matrix\n") + 1 :].splitlines()[2:]  # past the title and the header
    assert len(section) == len(api.matrices)
    assert (
        "encoder.layer.0.attention.self.query.weight[0:32]|encoder.layer.0.attention.self.key.weight[0:32]"
        in section[0]
    )


def test_quiet_and_verbose_exclude_each_other():
    rc, out, err = run_main("--quiet", "--verbose")
    assert rc == 2 and "not allowed with" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "--n", "1000", "--marg", "0.5"],  # an abbreviation of --margin
        ["analyze", "--prog"],  # of --progress
        ["sweep", "x", "--no-prog"],  # of --no-progress
        ["sweep", "x", "--thr", "1"],  # of --threads
    ],
)
def test_no_argument_abbreviations(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and err.count("\n") == 1


def test_sweep_gap_options_land_in_the_records(tmp_path, capsys):
    write_tiny_bert(tmp_path / "m", seed=0)
    args = ["sweep", str(tmp_path / "m"), "--store", str(tmp_path / "s"), "--no-progress", "--threads", "1"]
    assert main(args + ["--n", "5000", "--margin", "0.25", "--delta", "0.01"]) == 0
    assert main(args) == 0  # the same weights without the gap options: another record
    store = Store(tmp_path / "s")
    metas = [store.load_meta(k) for k in store.keys()]
    assert len(metas) == 2
    gap = next(m for m in metas if "gap_bound" in m["analysis"])
    assert {k: gap["options"][k] for k in ("n", "margin", "delta")} == {"n": 5000, "margin": 0.25, "delta": 0.01}
    assert gap["analysis"]["gap_bound"]["parameters"]["n"] == 5000
    assert gap["analysis"]["gap_bound"]["parameters"]["delta"] == 0.01
    direct = specbound.analyze(tmp_path / "m", n=5000, margin=0.25, delta=0.01, threads=1)
    stored = gap["analysis"]["gap_bound"]["bounds"]["spectral_adaptive"]["gap"]
    assert stored == pytest.approx(direct.gap_bound["bounds"]["spectral_adaptive"]["gap"], rel=1e-12)
    plain = next(m for m in metas if "gap_bound" not in m["analysis"])
    assert "n" not in plain["options"]
