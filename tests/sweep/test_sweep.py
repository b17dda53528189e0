"""Sweeps: local and on Dask give identical records; re-runs skip; a killed sweep loses nothing."""

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from support.numpy_bert import write_tiny_bert
from support.tiny_models import TINY_PATTERN

import specbound
import specbound.sweep.store
from specbound.cli import main
from specbound.errors import SpecboundError
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import TABLES, Store
from specbound.tools.miniatures import write_miniatures

SRC = str(Path(specbound.__file__).resolve().parents[1])


def assert_same_records(a: Store, b: Store):
    assert a.keys() == b.keys() and a.keys()
    for key in a.keys():
        ra, rb = a.load(key), b.load(key)
        strip = lambda meta: {k: v for k, v in meta.items() if k not in ("run", "checksum")}  # noqa: E731 (how, not what; the checksum covers both)
        assert strip(ra.meta) == strip(rb.meta), key
        for name in TABLES:
            pd.testing.assert_frame_equal(ra.tables[name], rb.tables[name], check_exact=True)


@pytest.fixture(scope="module")
def sources(tiny_family):
    return expand_sources([str(tiny_family / TINY_PATTERN)])


@pytest.fixture(scope="module")
def local_store(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("local") / "store"
    report = run_sweep(sources, root, progress=False)
    assert len(report.written) == len(sources) == 6 and not report.failed
    return Store(root)


def test_local_records_match_a_direct_analysis(local_store, sources):
    table = local_store.table()
    assert list(zip(table["L"], table["N"])) == [(1, 32), (1, 64), (2, 32), (2, 64), (3, 32), (3, 64)]
    direct = specbound.analyze(sources[3].target, threads=1)
    row = table[(table["L"] == 2) & (table["N"] == 64)].iloc[0]
    assert row["spectral_adaptive"] == direct.bounds["spectral_adaptive"]
    assert row["edelman"] == direct.bounds["edelman"]
    record = local_store.load(row["key"])
    # the stored table is the analysis' table with its record's key and source first (tidy over a store)
    assert list(record.matrices.columns[:2]) == ["key", "source"]
    assert set(record.matrices["key"]) == {row["key"]} and set(record.matrices["source"]) == {row["source"]}
    pd.testing.assert_frame_equal(record.matrices.drop(columns=["key", "source"]), direct.matrices, check_exact=True)
    assert record.meta["labels"] == {"L": 2, "H": 64, "A": 4}


def test_dask_local_cluster_gives_identical_records(local_store, sources, tmp_path):
    report = run_sweep(sources, tmp_path / "dask", workers=2, progress=False)
    assert report.mode.startswith("dask LocalCluster(2") and len(report.written) == 6
    assert_same_records(local_store, Store(tmp_path / "dask"))
    assert {Store(tmp_path / "dask").load_meta(k)["run"]["mode"] for k in local_store.keys()} == {"dask"}


def test_per_layer_tasks_on_an_existing_scheduler_give_identical_records(local_store, sources, tmp_path):
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    ) as cluster:
        report = run_sweep(
            sources, tmp_path / "layers", scheduler=cluster.scheduler_address, per_layer="always", progress=False
        )
    assert len(report.written) == 6 and not report.failed
    st = Store(tmp_path / "layers")
    assert_same_records(local_store, st)
    assert {st.load_meta(k)["run"]["mode"] for k in st.keys()} == {"dask-per-layer"}


def test_rerun_skips_and_failures_are_reported(local_store, sources, tmp_path, capsys):
    bad = tmp_path / "not_a_model"
    bad.mkdir()
    twin = shutil.copytree(sources[0].target, tmp_path / "twin")  # the same weights under another name
    again = run_sweep(sources + expand_sources([str(bad), str(twin)]), local_store.root, progress=True)
    assert again.written == [] and len(again.skipped) == 6 and again.duplicates == [str(twin)]
    assert len(again.failed) == 1 and again.failed[0][0] == str(bad) and "config.json" in again.failed[0][1]
    assert len(local_store) == 6
    err = capsys.readouterr().err
    assert "checkpoints" in err and "matrices" in err and "7/7" in err  # the progress bars, complete
    # a second option set is another record per checkpoint
    more = run_sweep(sources[:2], local_store.root, option_sets=[{}, {"grid_m": 4}], progress=False)
    assert len(more.skipped) == 2 and len(more.written) == 2 and len(local_store) == 8
    assert sorted(local_store.table()["grid_m"])[:2] == [4, 4]


def test_rerun_reads_no_weights_again(local_store, sources, monkeypatch):
    remembered = local_store.load_digests()  # one hash per weight file, by path, size, mtime, inode
    for source in sources:
        path = str(Path(source.target, "model.safetensors").resolve())
        assert any(k.startswith(path + "|") for k in remembered), path
    monkeypatch.setattr(specbound.sweep.store, "_file_sha256", lambda *a: pytest.fail("re-hashed an unchanged file"))
    again = run_sweep(sources, local_store.root, progress=False)
    assert len(again.skipped) == 6 and again.written == []


def test_cli_sweep_with_a_config_file(tiny_family, tmp_path, capsys):
    cfg = tmp_path / "fam.toml"
    cfg.write_text(
        f'sources = ["{tiny_family}/bert_uncased_L-{{1..2}}_H-32_A-2"]\nstore = "out"\n[options]\nrank_tol = 1e-12\n'
    )
    assert main(["sweep", "--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("to do") == 2 and "layers=1 matrices=6  L=1\n" in out
    assert main(["sweep", "--config", str(cfg), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "2 analysed, 0 already in the store, 0 failed" in out
    st = Store(tmp_path / "out")
    assert [st.load_meta(k)["options"]["rank_tol"] for k in st.keys()] == [1e-12, 1e-12]
    assert main(["sweep"]) == 2
    assert "needs at least one SOURCE" in capsys.readouterr().err


def _records_complete(st: Store, expected: int):
    keys = st.keys()
    for key in keys:
        record = st.load(key)  # every table readable, record.json parseable
        assert record.key == key and len(record.matrices) == record.meta["matrices"]
    return keys


def test_a_sweep_killed_with_sigkill_loses_nothing(tmp_path):
    family = tmp_path / "family"  # enough members that the kill lands mid-way
    write_miniatures(family, layout="folders", depths=(4, 5, 6, 7), widths=(64, 96), head_size=16, vocab=16)
    store = Store(tmp_path / "store")
    cmd = [
        sys.executable,
        "-m",
        "specbound.cli",
        "sweep",
        str(family / "*"),
        "--store",
        str(store.root),
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not store.keys() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_at_kill = _records_complete(store, 8)
    assert 1 <= len(done_at_kill) < 8, "the kill should land after the first record and before the last"
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{8 - len(done_at_kill)} analysed, {len(done_at_kill)} already in the store" in rerun.stdout
    keys = _records_complete(store, 8)
    assert len(keys) == 8 and set(done_at_kill) <= set(keys)
    assert sorted(store.table()["source"]) == sorted(str(p) for p in family.iterdir())  # each once
    assert os.listdir(store.incoming_dir) == []  # the killed writer's leftovers are gone


def test_a_local_sweep_imports_neither_dask_nor_matplotlib(tiny_family, tmp_path):
    code = (
        "import sys; from specbound.sweep.sources import expand_sources; from specbound.sweep.run import run_sweep; "
        "import specbound.report.plots, specbound.report.html, specbound.report.scaling; "
        "r = run_sweep(expand_sources([sys.argv[1]]), sys.argv[2], progress=False); assert len(r.written) == 2; "
        "heavy = [m for m in ('dask', 'distributed', 'matplotlib', 'torch') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tiny_family / "bert_uncased_L-1_*"), str(tmp_path / "s")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_layers_in_parallel_give_identical_records(sources, tmp_path, capsys):
    run_sweep(sources, tmp_path / "one", progress=False)
    report = run_sweep(sources, tmp_path / "jobs", jobs=3, progress=True)
    assert len(report.written) == 6 and not report.failed
    assert_same_records(Store(tmp_path / "one"), Store(tmp_path / "jobs"))
    err = capsys.readouterr().err
    done, total = re.findall(r"matrices:.*?(\d+)/(\d+)", err)[-1]
    assert "6/6" in err and done == total  # both bars complete with layers run three at a time


def test_jobs_must_be_positive(sources, tmp_path):
    with pytest.raises(SpecboundError, match="jobs must be a positive integer"):
        run_sweep(sources, tmp_path / "store", jobs=0, progress=False)


def test_auto_jobs_sweep(sources, tmp_path):
    run_sweep(sources[:2], tmp_path / "one", progress=False)
    report = run_sweep(sources[:2], tmp_path / "auto", jobs="auto", progress=False)
    assert len(report.written) == 2
    assert_same_records(Store(tmp_path / "one"), Store(tmp_path / "auto"))


def test_a_sweep_from_initial_weights_keys_on_their_bytes(tmp_path):
    """``sweep --init``: the records equal ``analyze(..., init=...)``; the key holds the initial
    weights' digest (a different W0 is a different record, the same bytes elsewhere the same one)."""

    trained = write_tiny_bert(tmp_path / "trained", seed=1)
    init = write_tiny_bert(tmp_path / "init", seed=2)
    store = tmp_path / "store"
    assert main(["sweep", str(trained), "--init", str(init), "--store", str(store), "--no-progress"]) == 0
    st = Store(store)
    (key,) = st.keys()
    expected = specbound.analyze(trained, init=init, threads=1)
    stored = st.load_meta(key)["analysis"]["from_init"]
    assert stored == pytest.approx(expected.from_init, rel=1e-12)
    assert st.load_meta(key)["options"]["init"] == str(init)
    # the same initial weights under another name: the same record
    moved = tmp_path / "elsewhere"
    shutil.copytree(init, moved)
    assert main(["sweep", str(trained), "--init", str(moved), "--store", str(store), "--no-progress"]) == 0
    assert Store(store).keys() == [key]
    # other initial weights (same shapes): another record; no --init: another one again
    write_tiny_bert(moved, seed=3)
    assert main(["sweep", str(trained), "--init", str(moved), "--store", str(store), "--no-progress"]) == 0
    assert main(["sweep", str(trained), "--store", str(store), "--no-progress"]) == 0
    assert len(Store(store).keys()) == 3


def test_a_sweep_refuses_initial_weights_of_another_shape(tmp_path, capsys):
    trained = write_tiny_bert(tmp_path / "trained", seed=1)
    other = write_tiny_bert(tmp_path / "other", seed=2, N=32)
    assert main(["sweep", str(trained), "--init", str(other), "--store", str(tmp_path / "st"), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "do not match" in out and "failed:" in out


def test_a_sweep_on_the_torch_device_stores_the_same_records(tiny_family, tmp_path):
    """``sweep --device cpu``: the same keys, and the numbers within rounding of the numpy path's."""
    pytest.importorskip("torch")
    pattern = str(tiny_family / TINY_PATTERN)
    stores = {}
    for device in ("numpy", "cpu"):
        store = tmp_path / device
        assert (
            main(["sweep", pattern, "--store", str(store), "--device", device, "--no-progress", "--threads", "1"]) == 0
        )
        stores[device] = Store(store)
    assert stores["numpy"].keys() == stores["cpu"].keys() and len(stores["cpu"].keys()) == 6
    for key in stores["numpy"].keys():
        a, b = stores["numpy"].load_meta(key)["bounds"], stores["cpu"].load_meta(key)["bounds"]
        assert b == pytest.approx(a, rel=1e-12)
