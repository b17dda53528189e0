"""Two-tower analyses (``towers.json``) and saved tables under attack: a tower's name is a plain name
(letters, digits, ``_``, ``-``), never a path, so ``TowerAnalyses.load`` reads and ``save`` writes
only inside the folder it is given (``../x``, an absolute path, a separator, an empty name, a
number or a subfolder linking out are one line); a saved table's column holding text where numbers
are expected (schema 1's ``alpha`` as strings) is refused on load, never re-saved."""

import json
import os
import shutil

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import specbound
from specbound.errors import SpecboundError
from specbound.records.analysis import Analysis
from specbound.records.towers import TowerAnalyses
from support.fuzz import FUZZ, clean_outcome
from support.numpy_bert import write_tiny_bert


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    model = write_tiny_bert(tmp_path_factory.mktemp("towers") / "m", seed=0, L=1, N=8, H=2, d_ff=12)
    return specbound.analyze(model, threads=1)


@pytest.fixture(scope="module")
def saved(analysis, tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    TowerAnalyses({"text": analysis, "vision": analysis}).save(root / "both")
    analysis.save(root / "outside")  # an analysis a hostile towers.json may try to reach
    return root


def snapshot(root):
    """Every path under ``root`` with its size and mtime: what a test compares before and after."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            st_ = os.lstat(os.path.join(folder, name))
            out[os.path.join(folder, name)] = (st_.st_size, st_.st_mtime_ns)
    return out


def test_a_saved_pair_reopens(saved, analysis):
    back = TowerAnalyses.load(saved / "both")
    assert list(back) == ["text", "vision"] and back["text"].all_bounds() == analysis.all_bounds()


NAMES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["..", ".", "../outside", "/etc", "a/b", "a\\b", "", " ", "text/..", "text\x00", "~", "-x", "text" * 20]
    ),
    st.integers(),
    st.none(),
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
)


@FUZZ
@given(names=st.lists(NAMES, min_size=1, max_size=3))
def test_any_tower_names_load_inside_the_folder_or_are_one_line(saved, tmp_path_factory, names):
    folder = tmp_path_factory.mktemp("t") / "both"
    shutil.copytree(saved / "both", folder)
    (folder / "towers.json").write_text(json.dumps({"schema_version": 3, "towers": names}))
    before = snapshot(saved.parent)
    outcome = clean_outcome(TowerAnalyses.load, folder)
    plain = all(isinstance(n, str) and n in ("text", "vision") for n in names) and len(set(names)) == len(names)
    if plain:
        assert isinstance(outcome, TowerAnalyses), outcome
    else:
        assert isinstance(outcome, SpecboundError), (names, outcome)
    assert snapshot(saved.parent) == before


@pytest.mark.parametrize("name", ["../outside", "/tmp", "a/b", "", "..", 3, None])
def test_save_never_writes_outside(analysis, tmp_path, name):
    before = snapshot(tmp_path)
    outcome = clean_outcome(lambda: TowerAnalyses({name: analysis}).save(tmp_path / "out" / "in"))
    assert isinstance(outcome, SpecboundError) and "tower name" in str(outcome)
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


def test_a_tower_subfolder_linking_out_is_refused(saved, tmp_path, analysis):
    folder = shutil.copytree(saved / "both", tmp_path / "both")
    shutil.rmtree(folder / "vision")
    (folder / "vision").symlink_to(saved / "outside")
    outcome = clean_outcome(TowerAnalyses.load, folder)
    assert isinstance(outcome, SpecboundError) and "link" in str(outcome)
    outcome = clean_outcome(TowerAnalyses({"text": analysis, "vision": analysis}).save, folder)
    assert isinstance(outcome, SpecboundError) and "link" in str(outcome)


def _with_table(saved, tmp_path, table, edit):
    folder = shutil.copytree(saved / "outside", tmp_path / "a")
    path = folder / f"{table}.parquet"
    frame = pd.read_parquet(path)
    edit(frame)
    frame.to_parquet(path, index=False)
    return folder


def _schema_1_alpha(frame):
    frame["alpha"] = frame.pop("downstream_factor").astype(str)  # schema 1's name, as text


@pytest.mark.parametrize("table", ["layers", "matrices"])
def test_schema_1_alpha_of_strings_is_refused(saved, tmp_path, table):
    folder = _with_table(saved, tmp_path, table, _schema_1_alpha)
    outcome = clean_outcome(Analysis.load, folder)
    assert isinstance(outcome, SpecboundError), outcome
    assert "downstream_factor" in str(outcome) and "not numeric" in str(outcome)


def test_schema_1_alpha_of_numbers_still_loads(saved, tmp_path):
    folder = _with_table(saved, tmp_path, "layers", lambda f: f.insert(1, "alpha", f.pop("downstream_factor")))
    assert isinstance(clean_outcome(Analysis.load, folder), Analysis)


@FUZZ
@given(
    table=st.sampled_from(["matrices", "layers", "singular_values"]),
    pick=st.integers(0, 100),
    kind=st.sampled_from(["str", "bool", "object"]),
)
def test_any_numeric_column_holding_non_numbers_is_refused(saved, tmp_path_factory, table, pick, kind):
    frame = pd.read_parquet(saved / "outside" / f"{table}.parquet")
    numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])]
    column = numeric[pick % len(numeric)]

    def edit(f):
        f[column] = {
            "str": f[column].astype(str),
            "bool": f[column].notna(),
            "object": pd.Series([[1.0]] * len(f), dtype=object),
        }[kind]

    folder = _with_table(saved, tmp_path_factory.mktemp("c"), table, edit)
    outcome = clean_outcome(Analysis.load, folder)
    assert isinstance(outcome, SpecboundError), (table, column, kind)
