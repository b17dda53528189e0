"""The embedded default checkpoint: its files are pinned by sha256 and checked before they are read;
a missing package or a changed file is one line that says how to install or repair it."""

from __future__ import annotations

import hashlib
import importlib

import pytest

from specbound import SpecboundError
from specbound.cli import main
from specbound.io import default_checkpoint as dc


def test_the_installed_package_matches_the_pins():
    folder = dc.default_checkpoint()
    for name, expected in dc.PINNED_SHA256.items():  # an independent hash of each pinned file
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == expected


def _fake_package(tmp_path, monkeypatch, *, config_suffix: bytes = b"", drop: str | None = None):
    """A copy of the package on sys.path ahead of the real one: its config.json changed, or a file
    dropped; the weights are a symlink to the real (pinned) file."""
    real = dc.default_checkpoint()
    package = tmp_path / dc.DEFAULT_PACKAGE
    (package / "model_files").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model_files" / "config.json").write_bytes((real / "config.json").read_bytes() + config_suffix)
    (package / "model_files" / "model.safetensors").symlink_to(real / "model.safetensors")
    if drop is not None:
        (package / "model_files" / drop).unlink()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, dc.DEFAULT_PACKAGE, raising=False)  # find_spec reads it first
    importlib.invalidate_caches()
    return package / "model_files"


def test_a_changed_file_is_one_line_naming_it(tmp_path, monkeypatch):
    folder = _fake_package(tmp_path, monkeypatch, config_suffix=b" ")
    with pytest.raises(SpecboundError) as err:
        dc.default_checkpoint()
    message = str(err.value)
    assert "\n" not in message and "config.json" in message and str(folder) in message
    assert dc.PINNED_SHA256["config.json"][:16] in message and "--force-reinstall" in message


def test_a_missing_file_is_one_line(tmp_path, monkeypatch):
    _fake_package(tmp_path, monkeypatch, drop="model.safetensors")
    with pytest.raises(SpecboundError, match=r"model\.safetensors .* found missing; reinstall"):
        dc.default_checkpoint()


def test_the_unchanged_copy_is_accepted(tmp_path, monkeypatch):
    folder = _fake_package(tmp_path, monkeypatch)
    assert dc.default_checkpoint() == folder


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(dc, "DEFAULT_PACKAGE", "specbound_no_such_package")
    with pytest.raises(SpecboundError) as err:
        dc.default_checkpoint()
    message = str(err.value)
    assert "\n" not in message and dc.INSTALL in message and "Apache-2.0" in message


def test_the_cli_prints_the_mismatch_as_one_line(tmp_path, monkeypatch, capsys):
    _fake_package(tmp_path, monkeypatch, config_suffix=b"\n")
    assert main(["analyze", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json" in err
