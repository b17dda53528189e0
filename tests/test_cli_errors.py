"""The command line's own errors (output paths, flags) and the one place it turns environment
errors into one line."""

import json
import pathlib
import shutil
import socket

import pytest
from support.hub_server import isolate_hub_environment
from support.one_line import assert_one_line_error, run_cli

import specbound
import specbound.pipeline
import specbound.sweep.run
from specbound import SpecboundError
from specbound.cli import main


def test_out_is_a_file(tiny_bert_dir, tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("keep me")
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--out", target), [str(target), "is a file", "folder"])
    assert target.read_text() == "keep me"


def test_out_cannot_be_created(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    target = tmp_path / "taken" / "sub"  # a folder below a file
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--out", target), ["cannot write", str(target)])


# --- commands that write onto an existing file or an unwritable place ----------------------------------


@pytest.mark.parametrize("command", ["plot", "report"])
def test_plot_and_report_onto_a_file(tiny_store, tmp_path, capsys, command):
    target = tmp_path / "taken"
    target.write_text("keep me")
    assert_one_line_error(*run_cli(capsys, "--store", tiny_store.root, "--out", target, command=command), [str(target)])
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("command", ["plot", "report"])
def test_plot_and_report_into_an_unwritable_folder(tiny_store, tmp_path, capsys, monkeypatch, command):
    """PermissionError (simulated: the tests may run as root, who may write anywhere)."""

    def deny(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "mkdir", deny)
    assert_one_line_error(
        *run_cli(capsys, "--store", tiny_store.root, "--out", tmp_path / "figs", command=command),
        ["Permission denied", "check the permissions"],
    )


def test_miniatures_onto_a_file(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("")
    assert_one_line_error(*run_cli(capsys, target, command="miniatures"), [str(target)])


@pytest.mark.parametrize("command", ["plot", "report"])
def test_unknown_bound(tiny_store, tmp_path, capsys, command):
    assert_one_line_error(
        *run_cli(capsys, "--store", tiny_store.root, "--out", tmp_path / "o", "--bound", "nonsense", command=command),
        ["unknown bound(s) nonsense", "spectral_adaptive"],
    )


@pytest.mark.parametrize("command", ["scaling", "report"])
@pytest.mark.parametrize("value", ["nan", "1", "0", "-0.5", "inf"])
def test_confidence_outside_the_unit_interval(tiny_store, tmp_path, capsys, command, value):
    assert_one_line_error(
        *run_cli(capsys, "--store", tiny_store.root, "--confidence", value, command=command),
        ["--confidence", "(0, 1)", repr(value)],
    )


def test_analysis_save_onto_a_file(tiny_bert_dir, tmp_path):
    target = tmp_path / "taken"
    target.write_text("")
    with pytest.raises(SpecboundError, match="cannot write the tables to"):
        specbound.analyze(tiny_bert_dir, threads=1).save(target)


# --- the one place environment errors become one line ---------------------------------------------------


@pytest.mark.parametrize(
    "error, needles",
    [
        (PermissionError(13, "Permission denied", "/x/y"), ["cannot run specbound analyze (/x/y): Permission denied"]),
        (OSError(5, "Input/output error"), ["Input/output error", "I/O error"]),
        (MemoryError(), ["ran out of memory"]),
        (RecursionError("maximum recursion depth exceeded"), ["nested too deeply"]),
    ],
)
def test_environment_errors_are_one_line(tiny_bert_dir, capsys, monkeypatch, error, needles):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(specbound.pipeline, "analyze", fail)
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir), needles)


def test_a_bug_keeps_its_traceback(tiny_bert_dir, monkeypatch):
    """Only what the environment raises becomes one line; a programming error is not hidden."""

    monkeypatch.setattr(specbound.pipeline, "analyze", lambda *a, **k: {}["missing"])
    with pytest.raises(KeyError):
        main(["analyze", str(tiny_bert_dir)])


def test_ctrl_c_in_a_sweep_is_one_line(tiny_family, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(specbound.sweep.run, "analyze_task", interrupted)
    rc, out, err = run_cli(
        capsys, tiny_family / "bert_uncased_L-1_H-32_A-2", "--store", tmp_path / "s", command="sweep"
    )
    assert rc == 130 and "Traceback" not in err
    assert err.splitlines() == [
        "specbound: interrupted; the records finished so far are in the store: run the same command again to continue"
    ]


def test_specbound_warnings_are_one_line(tiny_store, tmp_path, capsys):
    """A corrupt record is reported as one warning line and the command goes on."""

    root = shutil.copytree(tiny_store.root, tmp_path / "store")
    victim = sorted((root / "records").iterdir())[0]
    (victim / "record.json").write_text("{")
    rc, out, err = run_cli(capsys, "--store", root, command="scaling")
    assert rc == 0, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"specbound: warning: record {victim.name} in {root} cannot be read")


# --- --n in scientific notation, and a path that is neither a local folder nor a reachable hub id --------


def test_n_accepts_integral_scientific_notation(tiny_bert_dir, tmp_path, capsys):
    rc, _, err = run_cli(capsys, tiny_bert_dir, "--n", "1e6", "--margin", "1", "--format", "json", "--out", tmp_path)
    assert rc == 0, err

    assert json.loads((tmp_path / "summary.json").read_text())["gap_bound"]["parameters"]["n"] == 1_000_000


@pytest.mark.parametrize(
    "text, needles",
    [
        ("1.5", ["--n", "positive integer", "'1.5'", "1e6"]),
        ("2.5e0", ["positive integer", "'2.5e0'"]),
        ("1e-3", ["positive integer"]),
        ("nan", ["positive integer"]),
        ("0e3", ["positive integer"]),
        ("1e301", ["at most 1e300", "'1e301'"]),
        ("1e999999999999", ["at most 1e300"]),
    ],
)
def test_n_that_is_not_a_whole_number_or_is_huge_is_one_line(tiny_bert_dir, capsys, text, needles):
    assert_one_line_error(*run_cli(capsys, tiny_bert_dir, "--n", text, "--margin", "1"), needles)


def test_a_missing_folder_named_like_a_hub_id_says_both(tmp_path, capsys, monkeypatch):
    """``m/gemma2_qs`` is no local folder, and the hub cannot be reached: the line says both."""

    isolate_hub_environment(monkeypatch, tmp_path)
    with socket.socket() as s:  # a port nothing listens on: the network is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(
        *run_cli(capsys, "m/gemma2_qs"),
        [
            "could not fetch m/gemma2_qs",
            "the hub could not be reached",
            "no local folder or file m/gemma2_qs exists",
            str(tmp_path),
        ],
    )
