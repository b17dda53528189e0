"""The run store: a run's folder appears whole or not at all, re-runs skip finished runs, and
folders left by killed runs are cleaned up."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from specbound.study import runs
from specbound.study.grid import RunConfig

CONFIG = RunConfig(
    task="fmnist", depth=1, width=32, train_size=192, lr=1e-3, batch_size=32, weight_decay=0.0, dropout=0.0, seed=0
)


def _fake_train(calls, fail=False):
    def train_run(config, task, out_dir):
        calls.append(config)
        for sub in ("init", "model"):
            (out_dir / sub).mkdir()
        if fail:
            raise KeyboardInterrupt("killed halfway")  # what a Ctrl-C mid-run looks like
        np.save(out_dir / "train_margins.npy", np.ones(3, dtype=np.float32))
        return {"margin": 0.5}

    return train_run


@pytest.fixture
def no_data(monkeypatch):
    monkeypatch.setattr(runs, "load_task", lambda name: None)  # where train_and_record looks it up


def test_a_failed_run_leaves_nothing(tmp_path, monkeypatch, no_data):
    calls = []
    monkeypatch.setattr("specbound.study.train.train_run", _fake_train(calls, fail=True))
    with pytest.raises(KeyboardInterrupt):
        runs.train_and_record(CONFIG, tmp_path)
    assert list((tmp_path / runs.RUNS_DIR).iterdir()) == []
    assert runs.load_records(tmp_path) == []


def test_a_finished_run_is_skipped(tmp_path, monkeypatch, no_data):
    calls = []
    monkeypatch.setattr("specbound.study.train.train_run", _fake_train(calls))
    assert runs.train_and_record(CONFIG, tmp_path) is True
    assert runs.train_and_record(CONFIG, tmp_path) is False
    assert len(calls) == 1
    path = runs.run_path(tmp_path, CONFIG)
    assert path.name == CONFIG.name and runs.is_trained(path)
    doc = json.loads((path / "config.json").read_text())
    assert doc["key"] == CONFIG.key and RunConfig(**doc["config"]) == CONFIG
    assert [p.name for p in (tmp_path / runs.RUNS_DIR).iterdir()] == [CONFIG.name]  # no temp left


def test_stale_temp_folders_of_dead_processes_are_removed(tmp_path):
    folder = tmp_path / runs.RUNS_DIR
    folder.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    stale = folder / f"{runs.TMP_PREFIX}{CONFIG.name}+{dead}+abcd1234+{socket.gethostname()}"
    live = folder / f"{runs.TMP_PREFIX}{CONFIG.name}+{os.getpid()}+abcd1234+{socket.gethostname()}"
    stale.mkdir()
    live.mkdir()
    assert runs.remove_stale_temps(tmp_path) == [stale]
    assert not stale.exists() and live.exists()


def test_json_is_written_atomically(tmp_path, monkeypatch):
    target = tmp_path / "analysis.json"
    runs.write_json_atomic(target, {"a": 1})

    def broken_dump(doc, f, **kwargs):
        f.write('{"half": ')
        raise RuntimeError("disk full")

    monkeypatch.setattr(runs.json, "dump", broken_dump)
    with pytest.raises(RuntimeError):
        runs.write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["analysis.json"]
