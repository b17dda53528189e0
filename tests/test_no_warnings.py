"""A normal analysis tells the user about its numbers in its output (assumptions, summary), never
through a Python warning on stderr: the command line is run with every warning an error, on the
embedded default model and on a tiny rotary model (grouped-query LLaMA, 2048 positions: the product
bound), each with a gap bound."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.families import save_family

import specbound

SRC = str(Path(specbound.__file__).resolve().parents[1])


def _analyze(*args):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-m",
            "specbound.cli",
            "analyze",
            *map(str, args),
            "--n",
            "1000000",
            "--margin",
            "1",
            "--threads",
            "1",
            "--jobs",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_the_default_model_warns_nothing():
    run = _analyze()
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and "spectral_adaptive" in run.stdout


def test_a_rotary_model_warns_nothing(tmp_path):
    pytest.importorskip("transformers")

    save_family("llama", tmp_path / "llama")
    run = _analyze(tmp_path / "llama")
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and "rotary" in run.stdout
