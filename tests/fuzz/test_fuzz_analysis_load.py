"""Analysis.load on hostile folders: the saved analysis is checked once, on load, against everything
its readers use (records/schema.py); a folder that fails is one SpecboundError line, and an Analysis
that loads never fails afterwards in ``str()``, ``repr()``, ``to_json()`` or ``save()`` (it used to
load and then raise KeyError, TypeError or OverflowError there)."""

import copy
import json
import os
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import specbound
from specbound.errors import SpecboundError
from specbound.records.analysis import Analysis
from support.fuzz import FUZZ, JSON, clean_outcome
from support.numpy_bert import write_tiny_bert


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    model = write_tiny_bert(root / "m", seed=0, L=2, N=8, H=2, d_ff=12)
    specbound.analyze(model, threads=1).save(root / "good")
    return root / "good"


def _summary(saved):
    return json.loads((saved / "summary.json").read_text())


def _use(analysis, out):
    """Everything a reopened analysis offers without drawing: every one must work."""
    str(analysis)
    repr(analysis)
    json.loads(analysis.to_json())
    analysis.bounds_frame()
    analysis.save(out)


def _outcome(folder, tmp_path):
    outcome = clean_outcome(Analysis.load, folder)
    if not isinstance(outcome, Exception):
        _use(outcome, tmp_path / "again")
    return outcome


def _with_summary(saved, tmp_path, doc=None, raw=None):
    folder = shutil.copytree(saved, tmp_path / "bad")
    (folder / "summary.json").write_text(raw if raw is not None else json.dumps(doc))
    return folder


def test_a_good_folder_reopens_to_the_same_numbers(saved, tmp_path):
    again = Analysis.load(saved)
    _use(again, tmp_path / "again")
    assert again.bounds == _summary(saved)["bounds"]


def test_a_null_bound_without_its_log_loads_as_unknown_and_prints(saved, tmp_path):
    """A bound stored null with no log10 is unknown (NaN), not refused; it prints as '-'."""
    doc = _summary(saved)
    doc["bounds"]["edelman"] = None
    doc["log10_bounds"].pop("edelman")
    again = Analysis.load(_with_summary(saved, tmp_path, doc))
    assert np.isnan(again.bounds["edelman"])
    _use(again, tmp_path / "again")


# (edit of summary.json, words the line must hold): each raised AttributeError, KeyError, TypeError,
# ValueError or OverflowError on load or afterwards before the schema check
SUMMARY_EDITS = {
    "options_a_list": (lambda d: d.update(options=[]), "options is list"),
    "options_a_number": (lambda d: d.update(options=10**29), "options is int"),
    "l_phi_nan_string": (lambda d: d["options"].update(l_phi="x"), "options['l_phi']"),
    "l_phi_missing": (lambda d: d["options"].pop("l_phi"), "options has no 'l_phi'"),
    "rank_tol_text": (lambda d: d["options"].update(rank_tol="x"), "options['rank_tol']"),
    "grid_m_huge": (lambda d: d["options"].update(grid_m=10**29), "options['grid_m']"),
    "model_missing": (lambda d: d.pop("model"), "model is NoneType"),
    "L_a_string": (lambda d: d["model"].update(L="2"), "model['L']"),
    "assumptions_a_number": (lambda d: d.update(assumptions=2.5), "assumptions"),
    "assumption_without_kind": (lambda d: d["assumptions"][0].pop("kind"), "assumptions"),
    "location_a_number": (lambda d: d.update(location=1.5), "'location'"),
    "log10_a_list": (lambda d: d["log10_bounds"].update(spectral_adaptive=[]), "log10_bounds"),
    "log10_null_object": (lambda d: d.update(log10_bounds=None), "log10_bounds"),
    "baseline_1e400": (lambda d: d["baselines"].update(bft=10**400), "baselines['bft']"),
    "baseline_text": (lambda d: d["baselines"].update(bft="x"), "baselines['bft']"),
    "unknown_bound": (lambda d: d["bounds"].update(mystery=1.0), "unknown bound 'mystery'"),
    "schema_version": (lambda d: d.update(schema_version=4), "schema version"),
    "schema_version_true": (lambda d: d.update(schema_version=True), "schema version"),
    "not_an_object": (lambda d: d.clear() or d.update(x=[1]), "schema version"),
    "gap_without_parameters": (lambda d: d.update(gap_bound={"bounds": {}}), "gap_bound"),
}


@pytest.mark.parametrize("case", sorted(SUMMARY_EDITS))
def test_a_hostile_summary_is_one_line(saved, tmp_path, case):
    edit, needle = SUMMARY_EDITS[case]
    doc = _summary(saved)
    edit(doc)
    outcome = _outcome(_with_summary(saved, tmp_path, doc), tmp_path)
    assert isinstance(outcome, SpecboundError) and needle in str(outcome), outcome


@pytest.mark.parametrize(
    "raw, needle",
    [
        ("[" * 100_000, "RecursionError"),
        ('{"schema_version": NaN}', "non-standard JSON constant NaN"),
        ('{"schema_version": 1, "x": ' + "9" * 5000 + "}", "ValueError"),
        ("\udcff", "UnicodeDecodeError"),
    ],
)
def test_an_unreadable_summary_is_one_line(saved, tmp_path, raw, needle):
    folder = shutil.copytree(saved, tmp_path / "bad")
    (folder / "summary.json").write_bytes(raw.encode("utf-8", "surrogateescape"))
    outcome = _outcome(folder, tmp_path)
    assert isinstance(outcome, SpecboundError) and needle in str(outcome), outcome


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_files_that_are_no_regular_files_are_not_read(saved, tmp_path, kind):
    folder = shutil.copytree(saved, tmp_path / "bad")
    target = folder / "matrices.parquet"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    outcome = _outcome(folder, tmp_path)
    assert isinstance(outcome, SpecboundError) and "not a regular file" in str(outcome), outcome


TABLE_EDITS = {
    "no_layer_column": ("matrices", lambda t: t.drop(columns=["layer"]), "no column 'layer'"),
    "rank_as_text": ("matrices", lambda t: t.assign(rank="x"), "'rank'"),
    "rows_nan": ("matrices", lambda t: t.assign(rows=np.nan), "'rows'"),
    "p_star_inf": ("matrices", lambda t: t.assign(p_star=np.inf), "'p_star'"),
    "p_star_3": ("matrices", lambda t: t.assign(p_star=3.0), "outside [0, 2]"),
    "layer_beyond_L": ("layers", lambda t: t.assign(layer=t["layer"] + 5), "beyond the model's L"),
    "no_xi": ("layers", lambda t: t.drop(columns=["xi"]), "no column 'xi'"),
    "ff_p_star_missing": ("layers", lambda t: t.assign(three_type_ff_p_star=np.nan), "missing values"),
    "role_numbers": ("singular_values", lambda t: t.assign(role=1), "not text"),
}


@pytest.mark.parametrize("case", sorted(TABLE_EDITS))
def test_a_hostile_table_is_one_line(saved, tmp_path, case):
    name, edit, needle = TABLE_EDITS[case]
    folder = shutil.copytree(saved, tmp_path / "bad")
    path = folder / f"{name}.parquet"
    edit(pd.read_parquet(path)).to_parquet(path, index=False)
    outcome = _outcome(folder, tmp_path)
    assert isinstance(outcome, SpecboundError) and needle in str(outcome), outcome


def _paths(doc, prefix=()):
    for key, value in doc.items():
        if key in ("matrices", "layers"):
            continue
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _paths(value, prefix + (key,))


@FUZZ
@given(data=st.data(), value=JSON | st.integers(-(2**80), 2**80) | st.just(10**400), delete=st.booleans())
def test_any_value_anywhere_in_the_summary(saved, tmp_path_factory, data, value, delete):
    doc = _summary(saved)
    path = data.draw(st.sampled_from(sorted(_paths(doc))))
    edited = copy.deepcopy(doc)
    node = edited
    for key in path[:-1]:
        node = node[key]
    if delete:
        node.pop(path[-1])
    else:
        node[path[-1]] = value
    tmp = tmp_path_factory.mktemp("load")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _outcome(_with_summary(saved, tmp, edited), tmp)
