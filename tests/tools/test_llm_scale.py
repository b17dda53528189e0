"""A LLaMA-shaped model (grouped-query attention, gated feed-forward, sharded like LLaMA-2-7B so a
layer spans two files) as one Dask task per layer on a LocalCluster of 2 workers: the record is the
one-process analysis, bit for bit (docs/llm-scale.md)."""

import logging

import pandas as pd
import pytest

import specbound
from specbound.tools.bench import write_llama_checkpoint

pytest.importorskip("dask.distributed")


def test_per_layer_dask_tasks_give_the_one_process_analysis(tmp_path):
    from dask.distributed import LocalCluster

    from specbound.sweep.run import run_sweep
    from specbound.sweep.sources import expand_sources
    from specbound.sweep.store import Store

    folder, _ = write_llama_checkpoint(tmp_path / "llama-small", L=4, N=96, H=6, H_kv=2, d_ff=260, vocab=64,
                                       shard_bytes=400_000)
    assert len(list(folder.glob("*.safetensors"))) >= 2
    direct = specbound.analyze(folder, threads=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster:
        report = run_sweep(expand_sources([str(folder)]), tmp_path / "store", scheduler=cluster.scheduler_address,
                           per_layer="always", progress=False)
    assert len(report.written) == 1 and not report.failed
    store = Store(tmp_path / "store")
    (key,) = store.keys()
    assert store.load_meta(key)["run"]["mode"] == "dask-per-layer"
    record = store.load(key)
    pd.testing.assert_frame_equal(record.matrices.drop(columns=["key", "source"]), direct.matrices, check_exact=True)
    row = store.table().iloc[0]
    for name, value in direct.bounds.items():
        assert row[name] == value, name
