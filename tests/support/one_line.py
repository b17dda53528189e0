"""Shared checks of the per-stage error tests (tests/<stage>/test_<stage>_errors.py): bad input gives
one clear line on stderr and exit status 2 from the CLI, never a traceback, and the Python API
raises SpecboundError with the same message."""

import json
import struct

import pytest
from safetensors.numpy import load_file, save_file

import specbound
from specbound import SpecboundError
from specbound.cli import main

WEIGHTS = "model.safetensors"


INDEX = "model.safetensors.index.json"


def run_cli(capsys, *args, command="analyze"):
    capsys.readouterr()  # drop anything a fixture printed
    rc = main([command, *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, out, err, needles):
    assert rc == 2, (rc, out, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("specbound: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def assert_api_error(needles, *args, **kwargs):
    with pytest.raises(SpecboundError) as info:
        specbound.analyze(*args, threads=1, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# Edits that break a copy of the healthy tiny BERT.  Each returns (source to analyse, needles that
# the message must contain).


def config_of(folder):
    return json.loads((folder / "config.json").read_text())


def write_config(folder, **changes):
    config = config_of(folder)
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def edit_tensors(folder, edit):
    tensors = load_file(str(folder / WEIGHTS))
    edit(tensors)
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})


def data_start(path):
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + n


def assert_broken_checkpoint_error(breaker, folder, capsys):
    """``breaker(folder)`` damages a copy of a healthy checkpoint and names the words its error must
    hold: the command line and the API both refuse it with that one line."""
    source, needles = breaker(folder)
    line = assert_one_line_error(*run_cli(capsys, source), needles)
    assert assert_api_error(needles, source) == line.removeprefix("specbound: error: ")
