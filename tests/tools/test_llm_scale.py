"""A LLaMA-shaped model (grouped-query attention, gated feed-forward, sharded like LLaMA-2-7B so a
layer spans two files) as one Dask task per layer on a LocalCluster of 2 workers: the record is the
one-process analysis, bit for bit (docs/llm-scale.md)."""

import logging

import pandas as pd
import pytest

import specbound
from specbound.sweep.run import run_sweep
from specbound.sweep.sources import expand_sources
from specbound.sweep.store import Store
from specbound.tools.bench import write_llama_checkpoint
from specbound.tools.bench_dask import format_dask_layer_bench, run_dask_layer_bench

pytest.importorskip("dask.distributed")


def test_per_layer_dask_tasks_give_the_one_process_analysis(tmp_path):
    from dask.distributed import LocalCluster

    folder, _ = write_llama_checkpoint(
        tmp_path / "llama-small", L=4, N=96, H=6, H_kv=2, d_ff=260, vocab=64, shard_bytes=400_000
    )
    assert len(list(folder.glob("*.safetensors"))) >= 2
    direct = specbound.analyze(folder, threads=1)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    ) as cluster:
        report = run_sweep(
            expand_sources([str(folder)]),
            tmp_path / "store",
            scheduler=cluster.scheduler_address,
            per_layer="always",
            progress=False,
        )
    assert len(report.written) == 1 and not report.failed
    store = Store(tmp_path / "store")
    (key,) = store.keys()
    assert store.load_meta(key)["run"]["mode"] == "dask-per-layer"
    record = store.load(key)
    pd.testing.assert_frame_equal(record.matrices.drop(columns=["key", "source"]), direct.matrices, check_exact=True)
    row = store.table().iloc[0]
    for name, value in direct.bounds.items():
        assert row[name] == value, name


def test_the_70b_layer_scenario_on_a_tiny_shape(tmp_path):
    """``bench --scenario llama70b-layer``'s machinery on a tiny shape: the layers swept as per-layer Dask
    tasks on one worker (its peak RSS read back), the bounds those of a one-process analysis of the same
    checkpoint, then layer 0's stages against their floors."""

    shape = dict(L=80, N=96, H=6, H_kv=2, d_ff=260)
    report = run_dask_layer_bench(shape=shape, layers=2, workdir=str(tmp_path))
    assert report["mode"] == "dask-per-layer" and report["layers"] == 2 and report["memory_limit"] == "4GiB"
    assert "L=2 of 80" in report["scenario"] and 50 < report["worker_peak_rss_mb"] < 4096
    assert report["ff_sv_methods"] == {"gram": 6} and report["seconds_per_layer"] > 0
    folder, _ = write_llama_checkpoint(tmp_path / "same", **{**shape, "L": 2}, vocab=64)  # the same seed
    assert report["bounds"] == specbound.analyze(folder, threads=1).all_bounds()
    stages = report["stage_seconds_per_layer"]["1_blas_threads"]
    assert {"read_attention", "norm_1_1", "gram", "eigenvalues"} <= set(stages)
    assert set(report["stage_floor_seconds_per_layer"]["1_blas_threads"]) <= set(stages)
    text = format_dask_layer_bench(report)
    assert "dask-per-layer" in text and "worker peak RSS" in text and "  gram " in text
    assert list(tmp_path.iterdir()) == [tmp_path / "same"]  # the checkpoint and the store are deleted
