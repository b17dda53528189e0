"""``specbound bench``: the full analysis against the dense reference method, in one process.

The dense method is what the paper's reference code does: materialise every per-head ``N x N``
product and take its full SVD.  Both run on the same synthetic BERT-base-shaped checkpoint
(L=12, N=768, 12 heads, d_ff=3072, float32 safetensors written here), BLAS pinned to ``threads``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

BERT_BASE = dict(L=12, N=768, H=12, d_ff=3072)


def write_bert_checkpoint(folder: str | Path, *, L: int, N: int, H: int, d_ff: int, vocab: int = 512,
                          seed: int = 0) -> Path:
    """A random BERT-shaped checkpoint (config.json + model.safetensors, float32) in ``folder``.

    Weights are Gaussian with std 0.02 (BERT's initialiser), plus the biases, LayerNorms and
    embeddings a real checkpoint carries, so the loader's accounting is exercised too.
    """
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def gauss(*shape):
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    tensors = {"embeddings.word_embeddings.weight": gauss(vocab, N),
               "embeddings.position_embeddings.weight": gauss(64, N),
               "embeddings.LayerNorm.weight": np.ones(N, np.float32),
               "embeddings.LayerNorm.bias": np.zeros(N, np.float32)}
    linears = {"attention.self.query": (N, N), "attention.self.key": (N, N), "attention.self.value": (N, N),
               "attention.output.dense": (N, N), "intermediate.dense": (d_ff, N), "output.dense": (N, d_ff)}
    for layer in range(L):
        for name, (out_dim, in_dim) in linears.items():
            tensors[f"encoder.layer.{layer}.{name}.weight"] = gauss(out_dim, in_dim)
            tensors[f"encoder.layer.{layer}.{name}.bias"] = np.zeros(out_dim, np.float32)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[f"encoder.layer.{layer}.{ln}.weight"] = np.ones(N, np.float32)
            tensors[f"encoder.layer.{layer}.{ln}.bias"] = np.zeros(N, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"model_type": "bert", "architectures": ["BertModel"], "num_hidden_layers": L,
              "hidden_size": N, "num_attention_heads": H, "intermediate_size": d_ff,
              "hidden_act": "gelu", "vocab_size": vocab}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run_bench(*, repeats: int = 3, threads: int = 1, workdir: str | None = None) -> dict:
    """Time the analysis (median of ``repeats``) and the dense reference (once) on BERT-base shape."""
    from .analysis import analyze

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = write_bert_checkpoint(Path(tmp) / "bert-base-random", **BERT_BASE)
        runs = [_timed(lambda: analyze(folder, threads=threads)) for _ in range(repeats)]
        seconds = statistics.median(t for t, _ in runs)
        fast = runs[0][1]
        peak_fast = _peak_rss_mb()
        dense_seconds, dense = _timed(lambda: analyze(folder, threads=threads, method="dense"))
    rel = {name: abs(fast.bounds[name] - dense.bounds[name]) / abs(dense.bounds[name]) for name in fast.bounds}
    return {
        "scenario": "bert-base-shaped random checkpoint (L=12, N=768, H=12, d_ff=3072, float32)",
        "threads": threads,
        "repeats": repeats,
        "seconds": seconds,
        "seconds_all": [t for t, _ in runs],
        "dense_seconds": dense_seconds,
        "speedup_vs_dense": dense_seconds / seconds,
        "peak_rss_mb": peak_fast,
        "bounds": fast.bounds,
        "max_relative_bound_difference_vs_dense": max(rel.values()),
    }


def run_miniatures_bench(*, threads: int = 1, workdir: str | None = None, depths=None, widths=None) -> dict:
    """The BERT-Miniatures-shaped sweep against the dense reference, on the same checkpoints, in one run.

    Writes the 24 random checkpoints (not timed), sweeps them into a fresh results store (timed:
    planning and hashing, every analysis, every record written), then analyses each checkpoint
    again with the dense reference method (timed per checkpoint), BLAS pinned to ``threads``.
    """
    from .analysis import analyze
    from .miniatures import DEPTHS, WIDTHS, write_miniatures
    from .sources import expand_sources
    from .store import Store
    from .sweep import run_sweep

    depths, widths = depths or DEPTHS, widths or WIDTHS
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        family = Path(tmp) / "family"
        write_seconds, _ = _timed(lambda: write_miniatures(family, layout="folders", depths=depths, widths=widths))
        groups = ",".join(map(str, depths)), ",".join(map(str, widths))
        sources = expand_sources([str(family / f"bert_uncased_L-{{{groups[0]}}}_H-{{{groups[1]}}}_A-{{H/64}}")])
        cpu = time.process_time()  # every thread of this process: hashing and writing included
        sweep_seconds, report = _timed(lambda: run_sweep(sources, Path(tmp) / "store", threads=threads,
                                                         progress=False))
        sweep_cpu = time.process_time() - cpu
        if report.failed:
            raise RuntimeError(f"the benchmark sweep failed: {report.failed}")
        table = Store(Path(tmp) / "store").table().set_index("source")
        rows = []
        for source in sources:
            cpu = time.thread_time()
            dense_seconds, dense = _timed(lambda: analyze(source.target, threads=threads, method="dense"))
            dense_cpu = time.thread_time() - cpu
            rec = table.loc[source.name]
            rel = max(abs(rec[name] - value) / abs(value) for name, value in dense.bounds.items())
            rows.append({"source": source.name, "L": int(rec["L"]), "N": int(rec["N"]),
                         "sweep_seconds": float(rec["seconds"]), "dense_seconds": dense_seconds,
                         "speedup": dense_seconds / float(rec["seconds"]),
                         "sweep_cpu_seconds": float(rec["cpu_seconds"]), "dense_cpu_seconds": dense_cpu,
                         "max_relative_bound_difference": rel})
        peak = _peak_rss_mb()
    dense_total = sum(r["dense_seconds"] for r in rows)
    speedups = sorted(r["speedup"] for r in rows)
    return {
        "scenario": f"BERT-Miniatures-shaped family: {len(rows)} random checkpoints, L in {list(depths)}, "
                    f"N in {list(widths)}, N/64 heads, d_ff=4N, float32",
        "threads": threads,
        "checkpoints": len(rows),
        "family_write_seconds": write_seconds,
        "sweep_seconds": sweep_seconds,
        "sweep_analysis_seconds": sum(r["sweep_seconds"] for r in rows),
        "dense_seconds": dense_total,
        "speedup_vs_dense": dense_total / sweep_seconds,
        "sweep_cpu_seconds": sweep_cpu,
        "dense_cpu_seconds": sum(r["dense_cpu_seconds"] for r in rows),
        "cpu_speedup_vs_dense": sum(r["dense_cpu_seconds"] for r in rows) / sweep_cpu,
        "load_average_1min": os.getloadavg()[0],
        "per_checkpoint_speedup_median": statistics.median(speedups),
        "per_checkpoint_speedup_min": speedups[0],
        "per_checkpoint_speedup_max": speedups[-1],
        "peak_rss_mb": peak,
        "max_relative_bound_difference_vs_dense": max(r["max_relative_bound_difference"] for r in rows),
        "per_checkpoint": rows,
    }


def format_miniatures_bench(report: dict) -> str:
    """The text of ``specbound bench --scenario miniatures``: totals, then one line per checkpoint."""
    lines = [
        f"scenario          {report['scenario']}",
        f"BLAS threads      {report['threads']}",
        f"sweep, total      {report['sweep_seconds']:.2f} s for {report['checkpoints']} checkpoints "
        f"(planning, hashing, analyses, records; analyses alone {report['sweep_analysis_seconds']:.2f} s)",
        f"dense reference   {report['dense_seconds']:.2f} s (the same checkpoints, one after the other)",
        f"speedup vs dense  {report['speedup_vs_dense']:.1f}x total; per checkpoint median "
        f"{report['per_checkpoint_speedup_median']:.1f}x (min {report['per_checkpoint_speedup_min']:.1f}x, "
        f"max {report['per_checkpoint_speedup_max']:.1f}x)",
        f"CPU time          sweep {report['sweep_cpu_seconds']:.2f} s (all threads), dense "
        f"{report['dense_cpu_seconds']:.2f} s: {report['cpu_speedup_vs_dense']:.1f}x",
        f"peak RSS          {report['peak_rss_mb']:.0f} MB",
        f"max rel. diff     {report['max_relative_bound_difference_vs_dense']:.2e} (sweep vs dense bounds)",
        f"load average      {report['load_average_1min']:.2f} at the end (2 cores: above 1, other work shared them)",
        "",
        f"{'L':>3} {'N':>4} {'sweep s':>9} {'dense s':>9} {'speedup':>8}",
    ]
    for r in report["per_checkpoint"]:
        lines.append(f"{r['L']:>3} {r['N']:>4} {r['sweep_seconds']:>9.3f} {r['dense_seconds']:>9.3f} "
                     f"{r['speedup']:>7.1f}x")
    return "\n".join(lines)


def format_bench(report: dict) -> str:
    return "\n".join([
        f"scenario          {report['scenario']}",
        f"BLAS threads      {report['threads']}",
        f"specbound         {report['seconds']:.3f} s (median of {report['repeats']})",
        f"dense reference   {report['dense_seconds']:.3f} s",
        f"speedup vs dense  {report['speedup_vs_dense']:.1f}x",
        f"peak RSS          {report['peak_rss_mb']:.0f} MB",
        f"bounds            " + ", ".join(f"{k}={v:.6g}" for k, v in report["bounds"].items()),
        f"max rel. diff     {report['max_relative_bound_difference_vs_dense']:.2e} (fast vs dense bounds)",
    ])
