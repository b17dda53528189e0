"""``specbound bench``: the full analysis against the dense reference method, in one process.

The dense method is what the paper's reference code does: materialise every per-head ``N x N``
product and take its full SVD.  Both run on the same synthetic BERT-base-shaped checkpoint
(L=12, N=768, 12 heads, d_ff=3072, float32 safetensors written here), BLAS pinned to ``threads``.
"""

from __future__ import annotations

import json
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
