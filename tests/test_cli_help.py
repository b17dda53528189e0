"""The command line a new user meets: bare `specbound` prints the overview, every subcommand has a
description and every option a help line, near-miss spellings get the option meant, and an
optional package that is missing gets one install line that works for a wheel."""

import argparse
import contextlib
import io
import sys

import pytest

import specbound
from specbound.cli import _parser, main
from specbound.errors import SpecboundError


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _commands(parser, name="specbound"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}")


def test_bare_specbound_prints_the_overview():
    rc, out, err = _run()
    assert rc == 0 and not err
    for command in ("analyze", "sweep", "scaling", "paper", "plot", "report", "study", "bench", "arch"):
        assert command in out


def test_every_subcommand_has_a_description_and_every_option_help():
    missing = []
    for name, parser in _commands(_parser()):
        if not parser.description:
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{name} {action.option_strings or action.dest}: no help")
    assert not missing, missing


def test_analyze_help_names_every_kind_of_source():
    helptext = next(p for n, p in _commands(_parser()) if n == "specbound analyze").format_help()
    for word in ("folder", ".safetensors", ".gguf", ".onnx", "hub id"):
        assert word in helptext


@pytest.mark.parametrize(
    "typed, meant", [("--grid_m", "--grid-m"), ("--gird-m", "--grid-m"), ("--rank_tol", "--rank-tol")]
)
def test_a_near_miss_gets_the_option_meant(typed, meant):
    rc, _, err = _run("analyze", typed, "5")
    assert rc == 2 and f"did you mean {meant}?" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_option_gets_no_guess():
    rc, _, err = _run("analyze", "--frobnicate")
    assert rc == 2 and "unrecognized arguments: --frobnicate" in err and "did you mean" not in err


def test_missing_matplotlib_is_one_install_line(monkeypatch, tiny_bert_dir):
    """As on a base install: the notebook call says `pip install 'specbound[plot]'`."""

    tiny_analysis = specbound.analyze(tiny_bert_dir)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    with pytest.raises(SpecboundError, match=r"pip install 'specbound\[plot\]'"):
        tiny_analysis.plot.spectra()


@pytest.mark.parametrize("command", ["plot", "report"])
def test_a_command_missing_an_optional_package_says_which_extra(command, monkeypatch, tiny_store, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = _run(command, "--store", str(tiny_store.root), "--out", str(tmp_path / "out"))
    assert rc == 2 and "pip install 'specbound[plot]'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
