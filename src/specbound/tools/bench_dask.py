"""``specbound bench --scenario llama70b-layer``: one LLaMA-2-70B-shaped layer through the Dask path.

A one-layer bf16 checkpoint of the 70B shape (N = 8192, 64 query / 8 key-value heads, d_ff = 28672;
about 1.7 GB) is written, swept as one Dask task per layer on a LocalCluster of one single-threaded
worker under the memory limit docs/llm-scale.md recommends (``--memory-limit 4GiB``), as
``specbound sweep --per-layer always --scheduler ...`` runs it, and the worker's peak resident set is
read back.  Then, in a fresh process, the same layer's stages are timed one after the other against
their floors (the llama7b scenario's stage table, at one BLAS thread).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ..errors import SpecboundError
from ..pipeline import open_model
from ..sweep.run import run_sweep
from ..sweep.sources import expand_sources
from ..sweep.store import Store
from .bench import (
    _llama_tensor_shapes,
    _peak_rss_mb,
    _stage_seconds,
    _timed,
    format_stage_floors,
    machine_rates,
    stage_floors,
    write_llama_checkpoint,
)

# LLaMA-2-70B: 80 layers, N = 8192, 64 query heads sharing 8 key/value heads (d_h = 128), d_ff = 28672.
LLAMA_70B = dict(L=80, N=8192, H=64, H_kv=8, d_ff=28672)
# The embeddings are not analysed: a small vocabulary keeps the file at its layers' size.
_VOCAB = 64


def run_dask_layer_bench(
    *,
    shape: dict | None = None,
    layers: int = 1,
    memory_limit: str = "4GiB",
    workdir: str | None = None,
    stages: bool = True,
) -> dict:
    """Write ``layers`` layers of ``shape`` (default :data:`LLAMA_70B`), sweep them as per-layer Dask
    tasks on one worker process with one thread and ``memory_limit``, and (``stages``) time layer 0's
    stages in a fresh process.  Returns the record's seconds, the worker's peak RSS, the bounds and
    the stage table's figures (the keys :func:`~.bench.format_stage_floors` reads)."""

    from dask.distributed import Client, LocalCluster

    shape = dict(shape or LLAMA_70B)
    full_layers, shape["L"] = shape["L"], layers
    need = 2 * sum(int(np.prod(s)) for _, s in _llama_tensor_shapes(vocab=_VOCAB, **shape))
    base = Path(workdir or tempfile.gettempdir())
    free = shutil.disk_usage(base).free
    if free < 1.05 * need:
        raise SpecboundError(
            f"the {layers}-layer checkpoint needs {need / 1e9:.1f} GB but {base} has "
            f"{free / 1e9:.1f} GB free: pass --workdir DIR on a larger disk"
        )
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        write_seconds, (folder, nbytes) = _timed(
            lambda: write_llama_checkpoint(Path(tmp) / "llama70b-layer-bf16", vocab=_VOCAB, **shape)
        )
        with (
            LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=True,
                memory_limit=memory_limit,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster) as client,
        ):
            seconds, report = _timed(
                lambda: run_sweep(
                    expand_sources([str(folder)]),
                    Path(tmp) / "store",
                    scheduler=cluster.scheduler_address,
                    per_layer="always",
                    threads=1,
                    progress=False,
                )
            )
            (worker_peak,) = client.run(_peak_rss_mb).values()
        if report.failed or len(report.written) != 1:
            raise SpecboundError(f"the Dask sweep of the {layers}-layer checkpoint failed: {report.failed}")
        store = Store(Path(tmp) / "store")
        (key,) = store.keys()
        record = store.load(key)
        run = record.meta["run"]
        probe = None
        if stages:
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            child = ctx.Process(target=_stages_child, args=(str(folder), queue))
            child.start()
            probe = queue.get()
            child.join()
    ff = record.matrices[record.matrices["role"].str.startswith("FF")]
    out = {
        "scenario": (
            f"llama-70b-shaped random bf16 checkpoint (L={layers} of {full_layers}, N={shape['N']}, "
            f"H={shape['H']}, H_kv={shape['H_kv']}, d_ff={shape['d_ff']}), {nbytes / 1e9:.2f} GB"
        ),
        "layers": layers,
        "mode": run["mode"],
        "memory_limit": memory_limit,
        "sweep_seconds": seconds,
        "record_seconds": float(run["seconds"]),
        "record_cpu_seconds": float(run["cpu_seconds"]),
        "seconds_per_layer": float(run["seconds"]) / layers,
        "worker_peak_rss_mb": worker_peak,
        "bounds": record.bounds,
        "ff_sv_methods": ff["sv_method"].value_counts().to_dict(),
        "max_ff_sv_rel_error_bound": float(ff["sv_rel_error_bound"].max()),
        "checkpoint_bytes": nbytes,
        "write_seconds": write_seconds,
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }
    if probe is not None:
        t = "1_blas_threads"
        out.update(
            {
                "stage_seconds_per_layer": {t: probe["wall"]},
                "stage_cpu_seconds_per_layer": {t: probe["cpu"]},
                "machine_rates": {t: probe["rates"]},
                "stage_floor_seconds_per_layer": {t: stage_floors(shape, probe["rates"])},
                "stage_floor_cpu_seconds_per_layer": {t: stage_floors(shape, probe["rates"], cpu=True)},
                "stage_peak_rss_mb": probe["peak_rss_mb"],
            }
        )
    return out


def _stages_child(folder: str, queue) -> None:
    """Layer 0's stages at one BLAS thread, one after the other, and the machine's rates right after."""

    model = open_model(folder)
    with threadpool_limits(limits=1):
        times = _stage_seconds(model, 0, "numpy")
        rates = machine_rates()
    model.ckpt.close()
    queue.put({**times, "rates": rates, "peak_rss_mb": _peak_rss_mb()})


def format_dask_layer_bench(report: dict) -> str:
    """The text of ``specbound bench --scenario llama70b-layer``."""
    lines = [
        f"scenario          {report['scenario']}",
        f"Dask sweep        {report['sweep_seconds']:.1f} s wall ({report['mode']}: one task per layer and one "
        f"that assembles, 1 worker process, 1 thread, memory limit {report['memory_limit']})",
        f"per layer         {report['seconds_per_layer']:.1f} s (the record's seconds: its layer tasks and the "
        f"assembly; {report['record_cpu_seconds']:.1f} CPU s)",
        f"worker peak RSS   {report['worker_peak_rss_mb']:.0f} MB",
        "bounds            " + ", ".join(f"{k}={v:.6g}" for k, v in report["bounds"].items()),
        f"FF spectra        {report['ff_sv_methods']}, proven relative error <= "
        f"{report['max_ff_sv_rel_error_bound']:.1e}",
        f"checkpoint        {report['checkpoint_bytes'] / 1e9:.2f} GB, written in {report['write_seconds']:.0f} s "
        f"(not timed), deleted afterwards",
        f"load average      {report['load_average_1min']:.2f} at the end on {report['cpu_count']} CPUs",
    ]
    if "stage_seconds_per_layer" in report:
        lines += [
            "",
            f"layer 0 again, one stage at a time in a fresh process (peak RSS {report['stage_peak_rss_mb']:.0f} MB):",
            format_stage_floors(report),
        ]
    return "\n".join(lines)
