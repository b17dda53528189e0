"""Hostile stores: a bound beyond float64 is stored as null with its finite log10 and reaches no
output as an infinity (the scaling fits use the logs; the report writes 10^k); a record file that is
a FIFO or /dev/zero is refused before it is read; a record altered after it was written (its weights
digest, a bound, a dimension, a table) is caught by its checksum and quarantined like a damaged one,
and the next sweep recomputes it; values out of every reader's range (L = 10^400, list labels,
Infinity) are refused by the schema even in a record without a checksum."""

import json
import os
import shutil
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import FUZZ, JSON, clean_outcome
from support.numpy_bert import write_tiny_bert

from specbound.cli import main
from specbound.errors import SpecboundWarning
from specbound.records.style import png_base64
from specbound.records.view import markdown_table
from specbound.report.html import _records_table
from specbound.report.plots import build_figures
from specbound.report.scaling import scaling_table
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import Source
from specbound.sweep.store import Store, meta_checksum

HUGE = (2, 16)  # the member with weights of 1e30: its Edelman-style bound is about 10^372


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    root = tmp_path_factory.mktemp("huge_family")
    sources = []
    for L in (1, 2):
        for N in (8, 16):
            folder = write_tiny_bert(
                root / f"m_L{L}_N{N}", seed=10 * L + N, L=L, N=N, H=2, d_ff=2 * N, std=1e30 if (L, N) == HUGE else 0.3
            )
            sources.append(Source(f"m_L{L}_N{N}", str(folder), {"L": L, "N": N}))
    return sources


@pytest.fixture(scope="module")
def store(family, tmp_path_factory):
    root = tmp_path_factory.mktemp("huge_store") / "store"
    assert len(run_sweep(family, root, progress=False).written) == 4
    return root


def _copy(store, tmp_path):
    return shutil.copytree(store, tmp_path / "store")


def _huge_key(root):
    table = Store(root).table()
    return table[(table["L"] == HUGE[0]) & (table["N"] == HUGE[1])]["key"].iloc[0]


def test_a_bound_beyond_float64_is_null_with_its_log10(store):
    meta = Store(store).load_meta(_huge_key(store))
    assert meta["bounds"]["edelman"] is None and 300 < meta["log10_bounds"]["edelman"] < 1000
    table = Store(store).table()
    numbers = table.select_dtypes("number").to_numpy(float)
    assert not np.isinf(numbers).any()  # NaN (null) where a value overflowed, never an infinity
    assert np.isfinite(table["log10_edelman"]).all()


def test_scaling_fits_every_record_from_the_logs(store, capsys):
    fits = scaling_table(Store(store))
    pooled = fits[(fits["role"] == "all") & (fits["bound"] == "edelman")]
    assert (pooled["points"] == 4).all() and np.isfinite(pooled["slope"]).all()
    for fmt in ("text", "json", "csv", "markdown"):
        assert main(["scaling", "--store", str(store), "--format", fmt, "--detail"]) == 0
        out = capsys.readouterr().out.lower()
        assert "inf" not in out.replace("info", "") and "nan" not in out, fmt


def test_the_report_writes_no_infinity(store):
    """The report's bounds table says 10^k for a bound beyond float64, and every figure draws (a
    value near 10^300 on a log axis used to make matplotlib's ticks overflow)."""
    pytest.importorskip("matplotlib")

    text = markdown_table(_records_table(Store(store), Store(store).bound_names()))
    assert "10^" in text and "inf" not in text.lower() and "nan" not in text.lower()
    figures = build_figures(Store(store))
    assert len(figures) >= 6
    for name, fig in figures.items():
        assert png_base64(fig, dpi=20), name


def test_no_fit_is_said_in_words(store, tmp_path, capsys):
    """Two records on the diagonal (L=1 N=8, L=2 N=16): no depth has two widths nor width two
    depths, so no slope exists; the summary says so in words, never ``nan``."""

    root = Store(_copy(store, tmp_path))
    table = root.table()
    for _, row in table.iterrows():
        if (row["L"], row["N"]) not in ((1, 8), HUGE):
            shutil.rmtree(root.records_dir / row["key"])
    assert main(["scaling", "--store", str(root.root)]) == 0
    out = capsys.readouterr().out
    assert "no fit (no two positive values at two L at one fixed N)" in out and "nan" not in out.lower()


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder"])
def test_a_record_file_that_is_no_regular_file_is_set_aside_unread(store, tmp_path, kind):
    root = _copy(store, tmp_path)
    key = sorted(p.name for p in (root / "records").iterdir())[0]
    target = root / "records" / key / "record.json"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev_zero":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    with pytest.warns(SpecboundWarning, match="cannot be read"):
        keys = clean_outcome(Store(root).keys)
    assert key not in keys and len(keys) == 3


def test_a_table_file_that_is_a_fifo_is_set_aside_unread(store, tmp_path):
    root = _copy(store, tmp_path)
    key = sorted(p.name for p in (root / "records").iterdir())[0]
    (root / "records" / key / "matrices.parquet").unlink()
    os.mkfifo(root / "records" / key / "matrices.parquet")
    with pytest.warns(SpecboundWarning, match="not a regular file"):
        assert key not in clean_outcome(Store(root).keys)


def _edit(path, change):
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


ALTERATIONS = {
    "weights_digest": lambda m: m.update(weights_sha256="0" * 64),
    "a_bound": lambda m: m["bounds"].update(spectral_adaptive=m["bounds"]["spectral_adaptive"] / 2),
    "a_dimension": lambda m: m["model"].update(N=m["model"]["N"] * 2),
    "a_label": lambda m: m["labels"].update(L=99),
    "the_timing": lambda m: m["run"].update(seconds=0.0),
}


@pytest.mark.parametrize("what", sorted(ALTERATIONS))
def test_an_altered_record_is_quarantined_and_recomputed(store, family, tmp_path, what):
    root = _copy(store, tmp_path)
    key = sorted(p.name for p in (root / "records").iterdir())[0]
    _edit(root / "records" / key / "record.json", ALTERATIONS[what])
    with pytest.warns(SpecboundWarning, match="altered after it was written"):
        assert key not in Store(root).keys()
    assert any(p.name.startswith(key) for p in (root / "quarantine").iterdir())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_sweep(family, root, progress=False)
    assert report.written == [key]  # recomputed, the other three kept


def test_a_table_swapped_for_another_records_is_caught_when_read(store, tmp_path):
    root = _copy(store, tmp_path)
    first, second = sorted(p.name for p in (root / "records").iterdir())[:2]
    shutil.copy(root / "records" / second / "matrices.parquet", root / "records" / first / "matrices.parquet")
    with pytest.warns(SpecboundWarning, match="SHA-256"):
        outcome = clean_outcome(Store(root).load, first)
    assert "SHA-256" in str(outcome) and "set aside" in str(outcome)


# Values out of the readers' range, in a record written without a checksum (as before it had one):
# the schema refuses them itself.
OUT_OF_RANGE = {
    "L_10e400": lambda m: m["model"].update(L=10**400),
    "L_bool": lambda m: m["model"].update(L=True),
    "N_zero": lambda m: m["model"].update(N=0),
    "list_label": lambda m: m["labels"].update(L=[1, 2]),
    "dict_label": lambda m: m["labels"].update(L={"a": 1}),
    "label_10e400": lambda m: m["labels"].update(L=10**400),
    "labels_a_list": lambda m: m.update(labels=[1]),
    "bound_a_string": lambda m: m["bounds"].update(edelman="large"),
    "bound_a_list": lambda m: m["bounds"].update(edelman=[1.0]),
    "log10_a_string": lambda m: m["log10_bounds"].update(edelman="x"),
    "grid_m_float": lambda m: m["analysis"]["options"].update(grid_m=4.5),
    "digest_not_hex": lambda m: m.update(weights_sha256="zz"),
}


@pytest.mark.parametrize("what", sorted(OUT_OF_RANGE))
def test_out_of_range_values_are_refused_without_a_checksum(store, tmp_path, what):
    root = _copy(store, tmp_path)
    key = sorted(p.name for p in (root / "records").iterdir())[0]

    def change(meta):
        del meta["checksum"]
        OUT_OF_RANGE[what](meta)

    _edit(root / "records" / key / "record.json", change)
    with pytest.warns(SpecboundWarning, match="cannot be read"):
        assert key not in clean_outcome(Store(root).keys)


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN"])
def test_non_standard_json_numbers_are_refused(store, tmp_path, literal):
    root = _copy(store, tmp_path)
    key = sorted(p.name for p in (root / "records").iterdir())[0]
    path = root / "records" / key / "record.json"
    meta = json.loads(path.read_text())
    del meta["checksum"]
    text = json.dumps(meta).replace('"spectral_adaptive": ', f'"spectral_adaptive": {literal}, "x": ', 1)
    path.write_text(text)
    with pytest.warns(SpecboundWarning, match="non-standard JSON constant"):
        assert key not in Store(root).keys()


def test_a_legacy_record_without_checksum_is_still_read(store, tmp_path):
    root = _copy(store, tmp_path)
    key = sorted(p.name for p in (root / "records").iterdir())[0]
    _edit(root / "records" / key / "record.json", lambda m: m.pop("checksum"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert key in Store(root).keys()


def test_the_checksum_is_of_the_written_contents(store):
    for key in Store(store).keys():
        meta = Store(store).load_meta(key)
        assert meta["checksum"] == meta_checksum(meta) and set(meta["tables"]) == {
            "matrices",
            "layers",
            "singular_values",
            "curves",
        }


FIELDS = [
    ("model", "L"),
    ("model", "N"),
    ("model", "family"),
    ("model", "H"),
    ("labels", "L"),
    ("bounds", "edelman"),
    ("log10_bounds", "edelman"),
    ("run", "seconds"),
    ("analysis", "options"),
    ("options", "grid_m"),
    ("source",),
    ("weights_sha256",),
    ("labels",),
    ("bounds",),
]


@FUZZ
@given(field=st.sampled_from(FIELDS), value=JSON | st.integers(-(2**80), 2**80) | st.just(10**400))
def test_any_value_in_a_legacy_record(store, tmp_path_factory, field, value):
    """Without a checksum to catch the edit, any JSON value under any field a reader uses: the
    store's table, the fits and the report table see a sound record or none, and hold no infinity."""

    root = shutil.copytree(store, tmp_path_factory.mktemp("legacy") / "store")
    key = sorted(p.name for p in (root / "records").iterdir())[0]

    def change(meta):
        del meta["checksum"]
        node = meta
        for part in field[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[field[-1]] = value

    _edit(root / "records" / key / "record.json", change)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = clean_outcome(Store(root).table)
        assert not isinstance(table, Exception)
        assert not np.isinf(table.select_dtypes("number").to_numpy(float)).any()
        clean_outcome(scaling_table, Store(root))
        clean_outcome(_records_table, Store(root), Store(root).bound_names())
