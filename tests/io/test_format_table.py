"""The format table (specbound.io.formats) is what every reader of file names reads: each row's
openers exist, its extra is a dependency group of the package, a folder holding any of its files
opens as that format, and a weights file of every suffix is named with its folder in titles."""

import tomllib
from pathlib import Path

import pytest

from specbound import SpecboundError
from specbound.io import open_checkpoint
from specbound.io.formats import FOLDER_FILES, FORMATS, INDEX_FILES, WEIGHT_SUFFIXES, _function, format_of
from specbound.records.view import short_name

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_every_row_names_real_openers_and_extras(fmt):
    assert callable(_function(fmt.opener))
    assert fmt.folder_opener is None or callable(_function(fmt.folder_opener))
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert fmt.extra is None or fmt.extra in extras, fmt.extra
    assert all(format_of(Path(f"w{s}")) is fmt for s in fmt.suffixes)


def test_names_are_unique_across_formats():
    assert len(set(WEIGHT_SUFFIXES)) == len(WEIGHT_SUFFIXES)
    assert len(set(FOLDER_FILES + INDEX_FILES)) == len(FOLDER_FILES + INDEX_FILES)


@pytest.mark.parametrize("suffix", WEIGHT_SUFFIXES)
def test_a_weights_file_is_named_with_its_folder(suffix):
    assert short_name(f"/data/runs/step-100/weights{suffix}") == f"step-100/weights{suffix}"
    assert short_name("/data/runs/step-100") == "step-100"


@pytest.mark.parametrize("name", FOLDER_FILES + INDEX_FILES)
def test_a_folder_where_a_weights_file_belongs_is_refused(tmp_path, name):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / name).mkdir(parents=True)
    with pytest.raises(SpecboundError, match="is a folder, not a file"):
        open_checkpoint(tmp_path)
