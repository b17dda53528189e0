"""Every small file specbound reads (a model's config.json, a --config file, adapter_config.json,
towers.json, modules.json) goes through one regular-file, size-limited reader: a FIFO (which would
block the read), /dev/zero (which never ends it), a folder, a file past the limit or JSON nested
100,000 deep is one line and exit 2 within seconds, never a hang, a fill of memory or a
RecursionError."""

import json
import os

import pytest

import specbound
from support.fuzz import clean_outcome, time_limit
from support.numpy_bert import write_tiny_bert
from support.one_line import assert_one_line_error, run_cli
from specbound.errors import SpecboundError
from specbound.io.base import MAX_SMALL_FILE_BYTES, read_regular_file
from specbound.records.towers import TOWERS_FILE_MAX_BYTES

HOSTILE = ("fifo", "dev_zero", "folder", "oversize", "deep")


def make_hostile(path, kind, limit):
    """Replace ``path`` by a hostile thing of ``kind``."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "oversize":
        with open(path, "wb") as handle:  # sparse: no disk used
            handle.truncate(limit + 1)
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)


NEEDLE = {
    "fifo": "not a regular file",
    "dev_zero": "not a regular file",
    "folder": "not a regular file",
    "oversize": "bytes, more than any",
    "deep": "nested more than",
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_the_reader_itself(tmp_path, kind):
    path = tmp_path / "f.json"
    make_hostile(path, kind, 10**6)
    with time_limit(10), pytest.raises(SpecboundError) as info:
        data = read_regular_file(path, 10**6, "test file", "fix it")
        specbound.io.base.decode_json(data, "the test file", "fix it")
    assert "\n" not in str(info.value) and NEEDLE[kind] in str(info.value)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("small") / "m", seed=0, L=1, N=8, H=2, d_ff=12)


@pytest.mark.parametrize("kind", HOSTILE)
def test_config_json(model, tmp_path, capsys, kind):
    folder = tmp_path / "m"
    folder.mkdir()
    os.symlink(model / "model.safetensors", folder / "model.safetensors")
    make_hostile(folder / "config.json", kind, MAX_SMALL_FILE_BYTES)
    with time_limit(20):
        outcome = run_cli(capsys, folder)
    # a folder named config.json is "no config.json": the folder holds none
    assert_one_line_error(*outcome, [] if kind == "folder" else ["config.json", NEEDLE[kind]])


@pytest.mark.parametrize("kind", HOSTILE)
def test_config_option_file(model, tmp_path, capsys, kind):
    path = tmp_path / "c.json"
    make_hostile(path, kind, MAX_SMALL_FILE_BYTES)
    with time_limit(20):
        outcome = run_cli(capsys, model, "--config", path)
    assert_one_line_error(*outcome, ["--config", NEEDLE[kind]])


@pytest.mark.parametrize("kind", HOSTILE)
def test_adapter_config(model, tmp_path, capsys, kind):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    make_hostile(folder / "adapter_config.json", kind, MAX_SMALL_FILE_BYTES)
    with time_limit(20):
        outcome = run_cli(capsys, folder, "--base", model)
    assert_one_line_error(*outcome, ["adapter_config.json", NEEDLE[kind]])


@pytest.mark.parametrize("kind", HOSTILE)
def test_towers_json(tmp_path, kind):
    make_hostile(tmp_path / "towers.json", kind, TOWERS_FILE_MAX_BYTES)
    outcome = clean_outcome(specbound.TowerAnalyses.load, tmp_path)
    assert isinstance(outcome, SpecboundError) and "towers.json" in str(outcome)
    assert NEEDLE[kind] in str(outcome)


@pytest.mark.parametrize("kind", HOSTILE)
def test_sentence_transformers_modules_json(tmp_path, kind):
    make_hostile(tmp_path / "modules.json", kind, 1 << 20)
    outcome = clean_outcome(specbound.analyze, tmp_path, threads=1)
    assert isinstance(outcome, SpecboundError) and "modules.json" in str(outcome)
    assert NEEDLE[kind] in str(outcome)


@pytest.mark.parametrize("module", ["1_Pooling", "2_Dense"])
@pytest.mark.parametrize("kind", HOSTILE)
def test_sentence_transformers_module_configs(tmp_path, kind, module):
    """A Pooling or Dense module's config.json (read whenever modules.json names the module): one line naming it."""
    entries = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(entries))
    for entry in entries[1:]:
        (tmp_path / entry["path"]).mkdir()
    make_hostile(tmp_path / module / "config.json", kind, 1 << 20)
    outcome = clean_outcome(specbound.analyze, tmp_path, threads=1)
    assert isinstance(outcome, SpecboundError) and "config.json" in str(outcome) and module in str(outcome)
    assert NEEDLE[kind] in str(outcome)


def test_a_config_integer_past_the_int_string_limit_is_named(tmp_path):
    (tmp_path / "c.json").write_text('{"a": ' + "9" * 5000 + "}")
    with pytest.raises(SpecboundError, match="more than 4,300 digits"):
        specbound.io.base.load_json(tmp_path / "c.json", "test file", "fix it")


def test_towers_json_of_every_json_shape_is_one_line(tmp_path):
    """A towers.json of any JSON value: one line, naming the file."""
    for doc in (
        None,
        1,
        "text",
        [],
        {},
        {"towers": None},
        {"towers": {}},
        {"towers": [1]},
        {"towers": [""]},
        {"towers": ["../x"]},
        {"towers": ["/etc"]},
        {"towers": ["a/b"]},
        {"towers": [".."]},
        {"towers": ["text", "text"]},
        {"towers": ["x"] * 1000},
        {"towers": [[]]},
        {"towers": [True]},
    ):
        (tmp_path / "towers.json").write_text(json.dumps(doc))
        outcome = clean_outcome(specbound.TowerAnalyses.load, tmp_path)
        assert isinstance(outcome, SpecboundError) and "towers.json" in str(outcome), doc


@pytest.mark.parametrize("kind", HOSTILE)
def test_sweep_config(tmp_path, capsys, kind):
    make_hostile(tmp_path / "s.toml", kind, MAX_SMALL_FILE_BYTES)
    if kind == "deep":  # TOML, not JSON: nested arrays are the TOML reader's own one line
        (tmp_path / "s.toml").write_text("sources = " + "[" * 100_000 + "]" * 100_000)
    with time_limit(20):
        outcome = run_cli(
            capsys, "--config", tmp_path / "s.toml", "--store", tmp_path / "st", "--dry-run", command="sweep"
        )
    assert_one_line_error(*outcome, ["sweep config"] + ([] if kind == "deep" else [NEEDLE[kind]]))
