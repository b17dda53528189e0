"""``specbound bench``: the full analysis against the dense reference method, in one process.

The dense method is what the paper's reference code does: materialise every per-head ``N x N``
product and take its full SVD.  Both run on the same synthetic BERT-base-shaped checkpoint
(L=12, N=768, 12 heads, d_ff=3072, float32 safetensors written here), BLAS pinned to ``threads``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import resource
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.linalg
from threadpoolctl import threadpool_limits

from ..compute import eigensolvers, spectra
from ..compute.eigensolvers import symmetric_eigenvalues
from ..compute.layer_spectra import rotary_qk_spectra
from ..compute.spectra import dense_spectrum
from ..errors import SpecboundError
from ..io import open_checkpoint
from ..options import EXACT_SVD, KernelOptions
from ..pipeline import analyze, available_cores, model_layer_spectra, open_model, read_layer
from ..sweep.run import run_sweep
from ..sweep.sources import expand_sources
from ..sweep.store import Store
from .miniatures import DEPTHS, WIDTHS, write_miniatures
from .synthetic import write_bert_checkpoint

BERT_BASE = dict(L=12, N=768, H=12, d_ff=3072)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 words (round to nearest even), as uint16."""
    u = x.view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def _peak_rss_mb() -> float:
    """This process image's peak resident set (``VmHWM``).  Not ``ru_maxrss``: Linux carries that
    across fork + exec, so a spawned child would report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def max_relative_bound_difference(bounds: dict, reference: dict) -> float:
    """Largest ``|b - r| / |r|`` over the bounds both dicts name (``nan`` when they share none)."""
    shared = [name for name in reference if name in bounds]
    return max((abs(bounds[n] - reference[n]) / max(abs(reference[n]), 1e-300) for n in shared), default=float("nan"))


def core_budgets(jobs: int | None) -> list[int]:
    """The core counts a benchmark times every contender at: one core, and ``jobs`` (default: all
    the cores this process may use) when that is more."""

    jobs = available_cores() if jobs is None else jobs
    return sorted({1, jobs})


def run_bench(
    *,
    repeats: int = 3,
    threads: int = 1,
    jobs: int | None = None,
    workdir: str | None = None,
    shape: dict | None = None,
) -> dict:
    """Time the analysis (median of ``repeats``), the dense reference and WeightWatcher's
    ``analyze()`` (once each) on BERT-base shape, at every core budget of :func:`core_budgets`.

    On ``c`` cores specbound and the dense reference analyse ``c`` layers at once (``jobs=c``,
    ``threads`` BLAS threads each) and WeightWatcher, which has no such option, gets
    ``c * threads`` BLAS threads: every contender uses the same cores as well as it can.
    ``shape`` (``L, N, H, d_ff``) replaces the BERT-base shape (tests use a tiny one).
    """

    budgets = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        shape = shape or BERT_BASE
        folder = write_bert_checkpoint(Path(tmp) / "bert-base-random", **shape)
        for cores in core_budgets(jobs):
            runs = [_timed_cpu(lambda: analyze(folder, threads=threads, jobs=cores)) for _ in range(repeats)]
            seconds, cpu_seconds = statistics.median(t for t, _, _ in runs), statistics.median(c for _, c, _ in runs)
            fast = runs[0][2]
            if cores == 1:  # VmHWM only grows: the analysis' own peak, before the dense method and WW
                peak_fast, one_core = _peak_rss_mb(), fast
            identical = fast.all_bounds() == one_core.all_bounds() and fast.matrices.equals(one_core.matrices)
            dense_seconds, dense_cpu, dense = _timed_cpu(
                lambda: analyze(folder, threads=threads, jobs=cores, method="dense")
            )
            ww_seconds, ww_note = _weightwatcher_seconds(folder, threads * cores)
            budgets.append(
                {
                    "cores": cores,
                    "jobs": cores,
                    "blas_threads_per_job": threads,
                    "seconds": seconds,
                    "seconds_all": [t for t, _, _ in runs],
                    "dense_seconds": dense_seconds,
                    "speedup_vs_dense": dense_seconds / seconds,
                    "cpu_seconds": cpu_seconds,
                    "dense_cpu_seconds": dense_cpu,
                    "cpu_speedup_vs_dense": dense_cpu / cpu_seconds,
                    "weightwatcher_seconds": ww_seconds,
                    "speedup_vs_weightwatcher": ww_seconds / seconds if ww_seconds else None,
                    "weightwatcher_note": ww_note,
                    "identical_to_one_core": identical,
                }
            )
        ff_gram, ff_svd = _feed_forward_paths(folder, threads)
    # The 2 L feed-forward spectra alone, each at its one-matrix CPU time: what the analysis cannot go
    # below while they are exact float64 spectra, so the dense method's CPU time over it caps the ratio.
    ff_cpu = 2 * shape["L"] * ff_gram["cpu"]
    return {
        "scenario": "bert-base-shaped random checkpoint ("
        + ", ".join(f"{k}={v}" for k, v in shape.items())
        + ", float32)",
        "threads": threads,
        "repeats": repeats,
        "budgets": budgets,
        "peak_rss_mb": peak_fast,
        "bounds": fast.bounds,
        "max_relative_bound_difference_vs_dense": max_relative_bound_difference(fast.bounds, dense.bounds),
        "ff_gram_seconds": ff_gram["wall"],
        "ff_svd_seconds": ff_svd["wall"],
        "ff_gram_speedup": ff_svd["wall"] / ff_gram["wall"],
        "ff_gram_cpu_seconds": ff_gram["cpu"],
        "ff_all_cpu_seconds": ff_cpu,
        "cpu_speedup_ceiling_vs_dense": budgets[0]["dense_cpu_seconds"] / ff_cpu,
        "ff_shape": [shape["N"], shape["d_ff"]],
        "load_average_1min": os.getloadavg()[0],
    }


def _feed_forward_paths(folder: Path, threads: int, repeats: int = 3) -> tuple[dict, dict]:
    """Median wall and CPU seconds (``{"wall", "cpu"}``) of one ``N x d_ff`` feed-forward spectrum by
    the Gram path and by the SVD."""

    w = open_checkpoint(folder).read("encoder.layer.0.intermediate.dense.weight").T

    def medians(kernel):
        runs = [_timed_cpu(lambda: dense_spectrum(w, kernel)) for _ in range(repeats)]
        return {"wall": statistics.median(r[0] for r in runs), "cpu": statistics.median(r[1] for r in runs)}

    with threadpool_limits(limits=threads):
        return medians(KernelOptions()), medians(EXACT_SVD)


def _weightwatcher_seconds(folder: Path, threads: int) -> tuple[float | None, str]:
    """WeightWatcher's ``analyze()`` on the same weights (a transformers BertModel), if installed."""
    try:
        import transformers
        import weightwatcher
    except ImportError:
        return None, "weightwatcher not installed: `make bench` (pip install -e '.[bench]') adds it"

    transformers.logging.set_verbosity_error()
    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    import torch

    model = transformers.BertModel.from_pretrained(str(folder))
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seconds, details = _timed(lambda: weightwatcher.WeightWatcher(model=model).analyze())
    finally:
        torch.set_num_threads(torch_threads)
    return seconds, (
        f"weightwatcher {weightwatcher.__version__} analyze(), defaults, {len(details)} layers, "
        f"{threads} BLAS thread{'s' if threads > 1 else ''}"
    )


def run_miniatures_bench(
    *, threads: int = 1, jobs: int | None = None, workdir: str | None = None, depths=None, widths=None
) -> dict:
    """The BERT-Miniatures-shaped sweep against the dense reference, on the same checkpoints, in one run.

    Writes the 24 random checkpoints (not timed), then at every core budget ``c`` of
    :func:`core_budgets`: sweeps them into a fresh results store (timed: planning and hashing,
    every analysis, every record written) with ``c`` layers at a time, and analyses each
    checkpoint again with the dense reference method, ``c`` layers at a time (timed per
    checkpoint); ``threads`` BLAS threads per job.
    """

    depths, widths = depths or DEPTHS, widths or WIDTHS
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        family = Path(tmp) / "family"
        write_seconds, _ = _timed(lambda: write_miniatures(family, layout="folders", depths=depths, widths=widths))
        groups = ",".join(map(str, depths)), ",".join(map(str, widths))
        sources = expand_sources([str(family / f"bert_uncased_L-{{{groups[0]}}}_H-{{{groups[1]}}}_A-{{H/64}}")])
        budgets = [
            _miniatures_at(sources, Path(tmp) / f"store-{cores}", cores, threads) for cores in core_budgets(jobs)
        ]
        peak = _peak_rss_mb()
    return {
        "scenario": f"BERT-Miniatures-shaped family: {len(sources)} random checkpoints, L in {list(depths)}, "
        f"N in {list(widths)}, N/64 heads, d_ff=4N, float32",
        "threads": threads,
        "checkpoints": len(sources),
        "family_write_seconds": write_seconds,
        "budgets": budgets,
        "peak_rss_mb": peak,
        "load_average_1min": os.getloadavg()[0],
    }


def _miniatures_at(sources, store: Path, cores: int, threads: int) -> dict:
    """One core budget of :func:`run_miniatures_bench`."""

    cpu = time.process_time()  # every thread of this process: hashing and writing included
    sweep_seconds, report = _timed(lambda: run_sweep(sources, store, threads=threads, jobs=cores, progress=False))
    sweep_cpu = time.process_time() - cpu
    if report.failed:
        raise RuntimeError(f"the benchmark sweep failed: {report.failed}")
    table = Store(store).table().set_index("source")
    rows = []
    for source in sources:
        cpu = time.process_time()
        dense_seconds, dense = _timed(lambda: analyze(source.target, threads=threads, jobs=cores, method="dense"))
        dense_cpu = time.process_time() - cpu
        rec = table.loc[source.name]
        rel = max_relative_bound_difference({name: rec[name] for name in dense.bounds}, dense.bounds)
        rows.append(
            {
                "source": source.name,
                "L": int(rec["L"]),
                "N": int(rec["N"]),
                "sweep_seconds": float(rec["seconds"]),
                "dense_seconds": dense_seconds,
                "speedup": dense_seconds / float(rec["seconds"]),
                "sweep_cpu_seconds": float(rec["cpu_seconds"]),
                "dense_cpu_seconds": dense_cpu,
                "max_relative_bound_difference": rel,
            }
        )
    dense_total = sum(r["dense_seconds"] for r in rows)
    speedups = sorted(r["speedup"] for r in rows)
    return {
        "cores": cores,
        "jobs": cores,
        "blas_threads_per_job": threads,
        "sweep_seconds": sweep_seconds,
        "sweep_analysis_seconds": sum(r["sweep_seconds"] for r in rows),
        "dense_seconds": dense_total,
        "speedup_vs_dense": dense_total / sweep_seconds,
        "sweep_cpu_seconds": sweep_cpu,
        "dense_cpu_seconds": sum(r["dense_cpu_seconds"] for r in rows),
        "cpu_speedup_vs_dense": sum(r["dense_cpu_seconds"] for r in rows) / sweep_cpu,
        "per_checkpoint_speedup_median": statistics.median(speedups),
        "per_checkpoint_speedup_min": speedups[0],
        "per_checkpoint_speedup_max": speedups[-1],
        "max_relative_bound_difference_vs_dense": max(r["max_relative_bound_difference"] for r in rows),
        "per_checkpoint": rows,
    }


def format_miniatures_bench(report: dict) -> str:
    """The text of ``specbound bench --scenario miniatures``: totals per core budget, then one line per
    checkpoint with a column group per budget."""
    lines = [f"scenario          {report['scenario']}"]
    for b in report["budgets"]:
        lines += [
            "",
            f"on {b['cores']} core{'s' if b['cores'] > 1 else ''} ({b['jobs']} layer(s) at a time, "
            f"{b['blas_threads_per_job']} BLAS thread(s) each)",
            f"sweep, total      {b['sweep_seconds']:.2f} s for {report['checkpoints']} checkpoints "
            f"(planning, hashing, analyses, records; analyses alone {b['sweep_analysis_seconds']:.2f} s)",
            f"dense reference   {b['dense_seconds']:.2f} s (the same checkpoints, one after the other)",
            f"speedup vs dense  {b['speedup_vs_dense']:.1f}x total; per checkpoint median "
            f"{b['per_checkpoint_speedup_median']:.1f}x (min {b['per_checkpoint_speedup_min']:.1f}x, "
            f"max {b['per_checkpoint_speedup_max']:.1f}x)",
            f"CPU time          sweep {b['sweep_cpu_seconds']:.2f} s (all threads), dense "
            f"{b['dense_cpu_seconds']:.2f} s: {b['cpu_speedup_vs_dense']:.1f}x",
            f"max rel. diff     {b['max_relative_bound_difference_vs_dense']:.2e} (sweep vs dense bounds)",
        ]
    lines += [
        "",
        f"peak RSS          {report['peak_rss_mb']:.0f} MB",
        f"load average      {report['load_average_1min']:.2f} at the end",
        "",
        f"{'L':>3} {'N':>4}"
        + "".join(f" | {'sweep s':>8} {'dense s':>8} {'speedup':>8}" for _ in report["budgets"])
        + "   ("
        + ", ".join(f"{b['cores']} core{'s' if b['cores'] > 1 else ''}" for b in report["budgets"])
        + ")",
    ]
    for i, r in enumerate(report["budgets"][0]["per_checkpoint"]):
        cells = "".join(
            f" | {b['per_checkpoint'][i]['sweep_seconds']:>8.3f} {b['per_checkpoint'][i]['dense_seconds']:>8.3f} "
            f"{b['per_checkpoint'][i]['speedup']:>7.1f}x"
            for b in report["budgets"]
        )
        lines.append(f"{r['L']:>3} {r['N']:>4}{cells}")
    return "\n".join(lines)


def format_bench(report: dict) -> str:
    lines = [
        f"scenario          {report['scenario']}",
        f"peak RSS          {report['peak_rss_mb']:.0f} MB",
        "bounds            " + ", ".join(f"{k}={v:.6g}" for k, v in report["bounds"].items()),
        f"max rel. diff     {report['max_relative_bound_difference_vs_dense']:.2e} (fast vs dense bounds)",
        f"FF spectrum       Gram {report['ff_gram_seconds']:.3f} s vs SVD {report['ff_svd_seconds']:.3f} s "
        f"({report['ff_gram_speedup']:.1f}x, one {report['ff_shape'][0]} x {report['ff_shape'][1]} matrix, "
        f"{report['threads']} BLAS thread)",
        f"FF ceiling        the {report['ff_all_cpu_seconds'] / report['ff_gram_cpu_seconds']:.0f} FF spectra alone "
        f"take {report['ff_all_cpu_seconds']:.2f} CPU s: at most {report['cpu_speedup_ceiling_vs_dense']:.1f}x the "
        f"dense method's CPU time on one core with every other stage free",
        f"load average      {report['load_average_1min']:.2f} at the end",
        "",
        f"{'cores':>5} {'specbound s':>12} {'dense s':>9} {'vs dense':>9} {'WeightWatcher s':>16} {'vs WW':>7}"
        f" {'CPU s':>8} {'dense CPU s':>12} {'CPU vs dense':>13}",
    ]
    for b in report["budgets"]:
        ww = (
            f"{b['weightwatcher_seconds']:>16.2f} {b['speedup_vs_weightwatcher']:>6.1f}x"
            if b["weightwatcher_seconds"]
            else f"{'-':>16} {'-':>7}"
        )
        lines.append(
            f"{b['cores']:>5} {b['seconds']:>12.3f} {b['dense_seconds']:>9.2f} "
            f"{b['speedup_vs_dense']:>8.1f}x {ww} {b['cpu_seconds']:>8.3f} {b['dense_cpu_seconds']:>12.2f} "
            f"{b['cpu_speedup_vs_dense']:>12.1f}x"
        )
    if not all(b["identical_to_one_core"] for b in report["budgets"]):
        lines.append("WARNING: the results on several cores differ from those on one core")
    lines += [
        "",
        f"specbound and the dense reference: --jobs = cores, {report['threads']} BLAS thread(s) per job "
        f"(median of {report['repeats']} runs / one run); WeightWatcher: BLAS threads = cores",
    ]
    if not report["budgets"][0]["weightwatcher_seconds"]:
        lines.append(f"WeightWatcher: {report['budgets'][0]['weightwatcher_note']}")
    return "\n".join(lines)


# --- llama7b: a LLaMA-7B-shaped checkpoint, written, streamed and timed -------------------------

# LLaMA-2-7B's depth, width and d_ff (32 layers, N = 4096, d_ff = 11008), its 32 query heads sharing
# 8 key/value heads as in LLaMA-3-8B / Mistral-7B (LLaMA-2-7B itself has 32 key/value heads).
LLAMA_7B = dict(L=32, N=4096, H=32, H_kv=8, d_ff=11008)
# ``--scenario large``: the llama7b scenario on this many layers (a LLaMA-7B layer's time and memory).
LARGE_LAYERS = 4
# Hugging Face's shard limit when LLaMA-2-7B was published: two files, a layer split between them.
SHARD_BYTES = 10 * 10**9
# Gaussian values drawn once and cut into tensors at random offsets: each matrix is a window of one
# i.i.d. N(0, 0.02^2) sequence (so i.i.d. Gaussian itself), and 6.7e9 fresh draws (minutes of CPU)
# are not needed.  At least this long, and never shorter than the largest analysed tensor (11008 x 4096
# at 7B; 28672 x 8192 at 70B takes a longer pool), so none of them repeats a value: a matrix whose rows
# wrap around the pool is far from Gaussian (a 70B feed-forward matrix cut from a 2^26 pool missed
# the Gram path's 1e-8 and fell back to a float64 SVD: 4.7 GB).
_POOL_VALUES = 1 << 26


def llama_vocab(shape: dict) -> int:
    """The synthetic LLaMA checkpoint's vocabulary: LLaMA's 32,000 at a real width, 64 for a tiny test shape."""
    return 32000 if shape["N"] >= 1024 else 64


def llama_scenario(shape: dict, vocab: int) -> str:
    """The checkpoint a LLaMA scenario analyses, in words (the report's ``scenario`` starts with it)."""
    return (
        f"llama-7b-shaped random bf16 checkpoint (L={shape['L']}, N={shape['N']}, H={shape['H']}, "
        f"H_kv={shape['H_kv']}, d_ff={shape['d_ff']}, vocab={vocab})"
    )


def _llama_tensor_shapes(L: int, N: int, H: int, H_kv: int, d_ff: int, vocab: int) -> list[tuple[str, tuple]]:
    """Every tensor of a LLaMA checkpoint in the order Hugging Face saves them."""
    d = N // H
    shapes = [("model.embed_tokens.weight", (vocab, N))]
    for layer in range(L):
        p = f"model.layers.{layer}."
        shapes += [
            (p + "self_attn.q_proj.weight", (H * d, N)),
            (p + "self_attn.k_proj.weight", (H_kv * d, N)),
            (p + "self_attn.v_proj.weight", (H_kv * d, N)),
            (p + "self_attn.o_proj.weight", (N, H * d)),
            (p + "mlp.gate_proj.weight", (d_ff, N)),
            (p + "mlp.up_proj.weight", (d_ff, N)),
            (p + "mlp.down_proj.weight", (N, d_ff)),
            (p + "input_layernorm.weight", (N,)),
            (p + "post_attention_layernorm.weight", (N,)),
        ]
    return shapes + [("model.norm.weight", (N,)), ("lm_head.weight", (vocab, N))]


def write_llama_checkpoint(
    folder: str | Path,
    *,
    L: int,
    N: int,
    H: int,
    H_kv: int,
    d_ff: int,
    vocab: int = 32000,
    shard_bytes: int = SHARD_BYTES,
    seed: int = 0,
) -> tuple[Path, int]:
    """A random LLaMA-shaped bf16 checkpoint sharded as Hugging Face shards LLaMA-2-7B: tensors in
    saving order, a new ``model-0000k-of-0000n.safetensors`` whenever the next tensor would pass
    ``shard_bytes`` (so a layer may span two files), and ``model.safetensors.index.json``.

    Streamed: one tensor in memory at a time.  Returns the folder and the bytes written.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shapes = _llama_tensor_shapes(L, N, H, H_kv, d_ff, vocab)
    analysed = max(int(np.prod(shape)) for name, shape in shapes if len(shape) == 2 and ".layers." in name)
    pool = _to_bf16(0.02 * rng.standard_normal(max(_POOL_VALUES, analysed), dtype=np.float32))
    shards, size = [[]], 0
    for name, shape in shapes:
        nbytes = 2 * int(np.prod(shape))
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map, total = {}, 0
    one = _to_bf16(np.ones(1, np.float32))[0]
    for k, shard in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in shard:
            nbytes = 2 * int(np.prod(shape))
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = fname
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(folder / fname, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for name, shape in shard:
                count = int(np.prod(shape))
                if len(shape) == 1:  # norm weights: ones, as initialised
                    f.write(np.full(count, one, np.uint16).tobytes())
                    continue
                # A window starting at a random offset, wrapping around the pool: only tensors
                # longer than the pool (the embeddings, which no bound reads) repeat values.
                start = int(rng.integers(0, pool.size))
                while count > 0:
                    piece = pool[start : start + count]
                    f.write(piece.tobytes())
                    count -= piece.size
                    start = 0
        total += 8 + len(blob) + offset
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": L,
        "hidden_size": N,
        "num_attention_heads": H,
        "num_key_value_heads": H_kv,
        "head_dim": N // H,
        "intermediate_size": d_ff,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "torch_dtype": "bfloat16",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder, total


def _row_block_norm_1_1(a: np.ndarray, b: np.ndarray) -> float:
    """The reference path's (1,1)-norm: 1 MB row blocks of ``B.T @ A`` (the benchmark compares the
    512 x 512 tiles of :func:`specbound.compute.spectra._streamed_norm_1_1` with it)."""
    n_rows, n_cols = a.shape[1], b.shape[1]
    step = min(max(1, (1 << 17) // max(n_rows, 1)), max(n_cols, 1))
    total = 0.0
    buffer = np.empty((step, n_rows))
    for j in range(0, n_cols, step):
        block = b[:, j : j + step].T
        out = buffer[: block.shape[0]]
        np.matmul(block, a, out=out)
        total += float(np.abs(out, out=out).sum())
    return total


class _ReferenceKernels:
    """Within the block, the reference path's kernels: NumPy's one-stage ``eigvalsh`` at every order
    and the (1,1)-norm in 1 MB row blocks."""

    def __enter__(self):

        self._saved = (eigensolvers.TWO_STAGE_MIN, spectra._streamed_norm_1_1)
        eigensolvers.TWO_STAGE_MIN = 1 << 62
        spectra._streamed_norm_1_1 = _row_block_norm_1_1
        return self

    def __exit__(self, *exc):

        eigensolvers.TWO_STAGE_MIN, spectra._streamed_norm_1_1 = self._saved


# Per-matrix columns compared with the reference path.
_COMPARED = ("spectral_norm", "frobenius_norm", "nuclear_norm", "stable_rank", "norm_2_1", "norm_1_1")


def _llama7b_child(folder: str, threads: int, jobs: int, device: str, queue) -> None:
    """The timed analysis, in a fresh process so that its peak RSS is its own."""

    start, cpu = time.perf_counter(), time.process_time()
    stamps = [start]
    result = analyze(
        folder,
        threads=threads,
        jobs=jobs,
        device=device,
        progress=lambda done, total: stamps.append(time.perf_counter()),
    )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    m = result.matrices
    queue.put(
        {
            "seconds": seconds,
            "cpu_seconds": cpu,
            "analysis_stamps": [t - start for t in stamps[1:]],
            "peak_rss_mb": _peak_rss_mb(),
            "bounds": result.all_bounds(),
            "ff_sv_methods": m[m["role"].str.startswith("FF")]["sv_method"].value_counts().to_dict(),
            "max_ff_sv_rel_error_bound": float(m["sv_rel_error_bound"].max()),
            "matrices": m[["layer", "head", "role", *_COMPARED]].to_dict("list"),
        }
    )


def _timed_cpu(fn):
    """``(wall seconds, CPU seconds of the whole process (every BLAS thread), result)``."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


class _StageClock:
    """Wall and process-CPU seconds per named stage, summed over calls.  On a shared machine the
    CPU seconds are what a stage costs; the wall seconds also hold the waits for a free core."""

    def __init__(self):
        self.wall, self.cpu = {}, {}

    def __call__(self, stage: str, fn):
        wall, cpu, out = _timed_cpu(fn)
        self.wall[stage] = self.wall.get(stage, 0.0) + wall
        self.cpu[stage] = self.cpu.get(stage, 0.0) + cpu
        return out


def _stage_seconds(model, layer: int, device: str) -> dict:
    """One layer's stages, one after the other: reading the attention factors, the per-head cores,
    the (1,1)-norms, and per feed-forward matrix its reading, Gram product, eigenvalues and the
    column-norm / abs-sum passes (on a torch device the Gram product and its eigenvalues are timed
    together, under "gram").  Returns ``{"wall": {stage: s}, "cpu": {stage: s}}``."""

    clock = _StageClock()
    weights = clock("read_attention", lambda: read_layer(model, layer))
    kv = np.arange(weights.q.shape[0]) // (weights.q.shape[0] // weights.k.shape[0])

    kernel = KernelOptions(device=device)

    def attention(with_norm_1_1):
        return (
            spectra.factored_spectra(weights.q, weights.k, kernel, b_index=kv, with_norm_1_1=with_norm_1_1),
            spectra.factored_spectra(weights.v, weights.o, kernel, a_index=kv, with_norm_1_1=with_norm_1_1),
        )

    clock("attention_cores", lambda: attention(False))
    if model.rotary is not None:  # QK quantities valid at every relative position (docs/rotary.md)
        clock("rotary_qk", lambda: rotary_qk_spectra(weights, kv, model.rotary, rank_tol=kernel.rank_tol))
    clock("norm_1_1", lambda: attention(True))
    for stage in ("norm_1_1",):  # the second call redid the cores: keep only the norms' share
        clock.wall[stage] -= clock.wall["attention_cores"]
        clock.cpu[stage] -= clock.cpu["attention_cores"]
    for role in weights.ff:
        w = clock("read_ff", lambda: weights.ff.compact(role))
        short = w if w.shape[0] <= w.shape[1] else w.T
        clock("ff_norms", lambda: spectra.column_sq_norms_and_abs_sum(w))
        if device != "numpy":
            clock("gram", lambda: spectra.gram_singular_values(short, kernel=kernel))
            continue
        gram = clock("gram", lambda: spectra.blocked_gram(short, min(spectra._GRAM_BLOCK, short.shape[1])))
        clock("eigenvalues", lambda: symmetric_eigenvalues(gram, overwrite=True))
    return {"wall": clock.wall, "cpu": clock.cpu}


def _reference_child(folder: str, layers: list[int], probe_layers: list[int], device: str, queue) -> None:
    """The reference path on ``layers``, and the stage times of ``probe_layers`` at 1 and 2 BLAS
    threads (one layer at a time)."""

    model = open_model(folder)
    reference = {}
    start, cpu = time.perf_counter(), time.process_time()
    kernel = KernelOptions()
    with threadpool_limits(limits=1), _ReferenceKernels():
        for layer in layers:
            spectra = model_layer_spectra(model, layer, kernel)
            rows = [("QK", h, s) for h, s in enumerate(spectra.qk)] + [("OV", h, s) for h, s in enumerate(spectra.ov)]
            rows += [(role, None, s) for role, s in spectra.ff.items()]
            for role, head, s in rows:
                reference[(layer, role, head)] = {
                    "spectral_norm": s.spectral_norm,
                    "frobenius_norm": s.frobenius_norm,
                    "nuclear_norm": s.nuclear_norm(kernel.rank_tol),
                    "stable_rank": s.stable_rank,
                    "norm_2_1": s.norm_2_1,
                    "norm_1_1": s.norm_1_1,
                }
    reference_seconds, reference_cpu = time.perf_counter() - start, time.process_time() - cpu
    stages, rates = {}, {}
    for threads in (1, 2):
        if device != "numpy":
            import torch

            torch.set_num_threads(threads)
        with threadpool_limits(limits=threads):
            stages[threads] = [_stage_seconds(model, layer, device) for layer in probe_layers]
            rates[threads] = machine_rates()
    model.ckpt.close()
    queue.put(
        {
            "reference": {f"{l}|{r}|{h}": v for (l, r, h), v in reference.items()},
            "reference_seconds": reference_seconds,
            "reference_cpu_seconds": reference_cpu,
            "rates": {f"{t}_blas_threads": r for t, r in rates.items()},
            "stages": {t: [r["wall"] for r in runs] for t, runs in stages.items()},
            "stages_cpu": {t: [r["cpu"] for r in runs] for t, runs in stages.items()},
        }
    )


def _max_relative_difference(matrices: dict, reference: dict) -> tuple[float, int]:
    """Largest relative difference over the reference's matrices and the compared columns, and how
    many matrices were compared."""
    worst, count = 0.0, 0
    for i, (layer, role, head) in enumerate(zip(matrices["layer"], matrices["role"], matrices["head"])):
        head = None if role.startswith("FF") else int(head)
        ref = reference.get(f"{int(layer)}|{role}|{head}")
        if ref is None:
            continue
        count += 1
        for column in _COMPARED:
            a, b = float(matrices[column][i]), float(ref[column])
            if a != b:
                worst = max(worst, abs(a - b) / max(abs(a), abs(b)))
    return worst, count


def run_llama7b_bench(
    *,
    layers: int | None = None,
    threads: int = 1,
    jobs: int = 2,
    kernel: KernelOptions = KernelOptions(),
    workdir: str | None = None,
    reference_layers: int = 2,
    probe_layers: int = 2,
    shape: dict | None = None,
) -> dict:
    """Write a LLaMA-7B-shaped bf16 checkpoint, analyse it (every bound and baseline) in a fresh
    process, and compare ``reference_layers`` layers (the first and the last) with the reference
    path (:class:`_ReferenceKernels`: NumPy's one-stage eigenvalues, 1 MB (1,1)-norm blocks).
    Then time each stage of ``probe_layers`` layers at 1 and 2 BLAS threads.

    ``layers``: fewer layers than 32 (``--scenario large``: :data:`LARGE_LAYERS`; or where the disk
    cannot hold the 11.9 GB); the report then also gives the 32-layer time extrapolated from the
    per-layer time (marked as an extrapolation).  ``shape``
    replaces the 7B shape (tests use a tiny one).  ``kernel.device``: where the linear algebra runs.
    The checkpoint is deleted afterwards.
    """

    device = kernel.device
    shape = dict(shape or LLAMA_7B)
    full_layers = shape["L"]
    if layers is not None:
        shape["L"] = layers
    L, N = shape["L"], shape["N"]
    vocab = llama_vocab(shape)
    need = 2 * sum(int(np.prod(s)) for _, s in _llama_tensor_shapes(vocab=vocab, **shape))
    base = Path(workdir or tempfile.gettempdir())
    free = shutil.disk_usage(base).free
    if free < 1.05 * need:
        fits = max(0, int((free / 1.05 - 4 * vocab * N) // (need / L)))
        raise SpecboundError(
            f"the {L}-layer checkpoint needs {need / 1e9:.1f} GB but {base} has "
            f"{free / 1e9:.1f} GB free: pass --workdir DIR on a larger disk, or --layers "
            f"{max(fits, 1)} (the time for {full_layers} layers is then extrapolated)"
        )
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        write_seconds, (folder, nbytes) = _timed(
            lambda: write_llama_checkpoint(Path(tmp) / "llama7b-bf16", vocab=vocab, **shape)
        )
        queue = ctx.Queue()
        child = ctx.Process(target=_llama7b_child, args=(str(folder), threads, jobs, device, queue))
        child.start()
        out = queue.get()
        child.join()
        ref_layers = sorted({0, L - 1})[: max(1, reference_layers)]
        probes = list(range(min(probe_layers, L)))
        child = ctx.Process(target=_reference_child, args=(str(folder), ref_layers, probes, device, queue))
        child.start()
        ref = queue.get()
        child.join()
        shards = sorted(p.name for p in folder.glob("*.safetensors"))
    worst, compared = _max_relative_difference(out["matrices"], ref["reference"])

    def medians(stages):  # {threads: [{stage: seconds} per probed layer]} -> {threads: {stage: median}}
        return {
            f"{t}_blas_threads": {stage: statistics.median(r[stage] for r in runs) for stage in runs[0]}
            for t, runs in stages.items()
        }

    stage_wall, stage_cpu = medians(ref["stages"]), medians(ref["stages_cpu"])
    floors = {t: stage_floors(shape, rate) for t, rate in ref["rates"].items()}
    cpu_floors = {t: stage_floors(shape, rate, cpu=True) for t, rate in ref["rates"].items()}
    cores = min(jobs * threads, os.cpu_count() or 1)
    report = {
        "scenario": f"{llama_scenario(shape, vocab)}, {len(shards)} shards",
        "device": device,
        "threads": threads,
        "jobs": jobs,
        "layers": L,
        "seconds": out["seconds"],
        "cpu_seconds": out["cpu_seconds"],
        "cpu_seconds_over_cores": out["cpu_seconds"] / cores,
        "peak_rss_mb": out["peak_rss_mb"],
        "max_relative_difference_vs_reference": worst,
        "reference_layers": ref_layers,
        "reference_matrices_compared": compared,
        "reference_seconds": ref["reference_seconds"],
        "reference_cpu_seconds": ref["reference_cpu_seconds"],
        "checkpoint_bytes": nbytes,
        "shards": shards,
        "write_seconds": write_seconds,
        "layer_completion_seconds": out["analysis_stamps"],
        "stage_seconds_per_layer": stage_wall,
        "stage_cpu_seconds_per_layer": stage_cpu,
        "machine_rates": ref["rates"],
        "stage_floor_seconds_per_layer": floors,
        "stage_floor_cpu_seconds_per_layer": cpu_floors,
        "seconds_per_layer_one_at_a_time": {t: sum(v.values()) for t, v in stage_wall.items()},
        "cpu_seconds_per_layer_one_at_a_time": {t: sum(v.values()) for t, v in stage_cpu.items()},
        "ff_sv_methods": out["ff_sv_methods"],
        "max_ff_sv_rel_error_bound": out["max_ff_sv_rel_error_bound"],
        "bounds": out["bounds"],
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }
    if L < full_layers:
        report["extrapolated_seconds_all_layers"] = out["seconds"] * full_layers / L
        report["extrapolated_to_layers"] = full_layers
    return report


def format_llama7b_bench(report: dict) -> str:
    """The text of ``specbound bench --scenario llama7b``."""
    lines = [
        f"scenario          {report['scenario']}",
        f"analysis          {report['seconds']:.1f} s wall for {report['layers']} layers, every bound and "
        f"baseline ({report['jobs']} layer(s) at a time, {report['threads']} BLAS thread(s) each, "
        f"device {report['device']})",
        f"CPU time          {report['cpu_seconds']:.1f} s (all threads); / cores = "
        f"{report['cpu_seconds_over_cores']:.1f} s, the wall time on idle cores were the work spread perfectly",
    ]
    if "extrapolated_seconds_all_layers" in report:
        lines.append(
            f"extrapolated      {report['extrapolated_seconds_all_layers']:.0f} s for "
            f"{report['extrapolated_to_layers']} layers (EXTRAPOLATED from {report['layers']} layers)"
        )
    lines += [
        f"peak RSS          {report['peak_rss_mb']:.0f} MB",
        f"vs reference      max relative difference {report['max_relative_difference_vs_reference']:.2e} over "
        f"{report['reference_matrices_compared']} matrices of layers {report['reference_layers']} "
        f"(reference path: {report['reference_seconds']:.0f} s wall, {report['reference_cpu_seconds']:.0f} s CPU, "
        f"1 BLAS thread)",
        f"FF spectra        {report['ff_sv_methods']}, proven relative error <= "
        f"{report['max_ff_sv_rel_error_bound']:.1e}",
        f"checkpoint        {report['checkpoint_bytes'] / 1e9:.1f} GB in {len(report['shards'])} shards, "
        f"written in {report['write_seconds']:.0f} s (not timed), deleted afterwards",
        f"load average      {report['load_average_1min']:.2f} at the end on {report['cpu_count']} CPUs",
    ]
    for title, key in (("wall", "stage_seconds_per_layer"), ("CPU", "stage_cpu_seconds_per_layer")):
        stages = report[key]
        names = list(next(iter(stages.values())))
        lines += [
            "",
            f"one layer at a time, median {title} seconds per stage:",
            f"{'BLAS threads':>12} " + " ".join(f"{n:>16}" for n in names) + f" {'total':>8}",
        ]
        for threads, values in stages.items():
            lines.append(
                f"{threads.split('_')[0]:>12} "
                + " ".join(f"{values[n]:>16.2f}" for n in names)
                + f" {sum(values.values()):>8.2f}"
            )
    return "\n".join(lines + ["", format_stage_floors(report)])


def format_stage_floors(report: dict) -> str:
    """Each stage's median wall seconds per layer against its floor (its flops at the measured BLAS
    rate, or its bytes at the measured memory rate), per BLAS thread count: the gap left."""
    lines = [
        "each stage against its floor (per layer; floor = work / rate measured in this run; the CPU columns"
        " at the rates per CPU second, what to read on a shared machine):"
    ]
    for threads, floors in report["stage_floor_seconds_per_layer"].items():
        rate, cpu_floors = report["machine_rates"][threads], report["stage_floor_cpu_seconds_per_layer"][threads]
        wall, cpu = report["stage_seconds_per_layer"][threads], report["stage_cpu_seconds_per_layer"][threads]
        lines += [
            f"{threads.split('_')[0]} BLAS thread(s): dgemm {rate['flops_per_s'] / 1e9:.1f} GFLOP/s "
            f"({rate['flops_per_cpu_s'] / 1e9:.1f} per CPU s), memory copy {rate['bytes_per_s'] / 1e9:.1f} GB/s "
            f"({rate['bytes_per_cpu_s'] / 1e9:.1f} per CPU s)",
            f"  {'stage':<16} {'wall s':>8} {'floor s':>8} {'wall/floor':>10} {'CPU s':>8} {'floor s':>8} "
            f"{'CPU/floor':>10}  floor counts",
        ]
        rows = [(stage, wall[stage], cpu[stage], floors.get(stage), cpu_floors.get(stage)) for stage in wall]
        rows.append(
            (
                "total",
                sum(wall.values()),
                sum(cpu.values()),
                {"seconds": sum(f["seconds"] for f in floors.values()), "counts": ""},
                {"seconds": sum(f["seconds"] for f in cpu_floors.values())},
            )
        )
        for stage, w, c, floor, cpu_floor in rows:
            if floor is None:
                lines.append(f"  {stage:<16} {w:>8.2f} {'-':>8} {'-':>10} {c:>8.2f} {'-':>8} {'-':>10}  (no floor)")
                continue
            lines.append(
                f"  {stage:<16} {w:>8.2f} {floor['seconds']:>8.3g} {w / floor['seconds']:>9.1f}x "
                f"{c:>8.2f} {cpu_floor['seconds']:>8.3g} {c / cpu_floor['seconds']:>9.1f}x  {floor['counts']}"
            )
    return "\n".join(lines)


def machine_rates(size: int = 1536, repeats: int = 3) -> dict:
    """This machine's rates now, at the BLAS threads in force: a float64 ``size``-cube matrix product
    (flops per second, the BLAS-3 rate every Gram, eigensolver and (1,1) tile is held to) and a
    64 MB array copy (bytes read plus written per second); the best of ``repeats``."""
    rng = np.random.default_rng(0)
    a, b, out = rng.standard_normal((size, size)), rng.standard_normal((size, size)), np.empty((size, size))
    gemm = [_timed_cpu(lambda: np.matmul(a, b, out=out))[:2] for _ in range(repeats)]
    src, dst = np.ones(1 << 23), np.empty(1 << 23)
    copy = [_timed_cpu(lambda: np.copyto(dst, src))[:2] for _ in range(repeats)]
    flops, moved = 2.0 * size**3, 2.0 * src.nbytes
    return {
        "flops_per_s": flops / min(w for w, _ in gemm),
        "bytes_per_s": moved / min(w for w, _ in copy),
        "flops_per_cpu_s": flops / max(min(c for _, c in gemm), 1e-9),
        "bytes_per_cpu_s": moved / max(min(c for _, c in copy), 1e-9),
        "gemm_size": size,
        "copy_bytes": src.nbytes,
    }


def stage_floors(shape: dict, rates: dict, *, cpu: bool = False) -> dict:
    """Per stage of one LLaMA-shaped layer (``N``, ``H``, ``H_kv``, ``d_ff``; bf16 weights), the least
    time its necessary work takes at ``rates`` (:func:`machine_rates`): flops at the matrix-product
    rate, bytes at the memory rate.  Counts: a Gram ``G = W W^T`` of an ``n x k`` matrix is a symmetric
    rank-k update, ``n^2 k`` flops; eigenvalues of ``G`` are at least its reduction to tridiagonal
    form, ``4 n^3 / 3`` flops; the (1,1)-norm of a head's ``N x N`` product from ``d x N`` factors
    ``2 N^2 d`` flops; a head's QR cores about ``2 N d^2`` flops a factor; reading a tensor its bf16
    bytes once; the feed-forward norm passes the float32 matrices once.  ``cpu``: at the rates per CPU
    second (what a core does while it runs; the floor of a stage's CPU seconds on a shared machine)."""
    n, h, h_kv, d_ff = shape["N"], shape["H"], shape["H_kv"], shape["d_ff"]
    d = n // h
    flops, memory = (
        (rates["flops_per_cpu_s"], rates["bytes_per_cpu_s"]) if cpu else (rates["flops_per_s"], rates["bytes_per_s"])
    )
    short, wide = min(n, d_ff), max(n, d_ff)
    attention_values = 2 * n * h * d + 2 * n * h_kv * d
    counts = {
        "read_attention": (2 * attention_values / memory, f"{2 * attention_values / 1e6:.0f} MB of bf16 read once"),
        "attention_cores": (2 * (2 * h + 2 * h_kv) * n * d * d / flops, f"QR of {2 * h + 2 * h_kv} factors, {n} x {d}"),
        "norm_1_1": (2 * h * 2 * n * n * d / flops, f"{2 * h} products {n} x {d} x {n}"),
        "read_ff": (2 * 3 * n * d_ff / memory, f"{6 * n * d_ff / 1e6:.0f} MB of bf16 read once"),
        "ff_norms": (4 * 3 * n * d_ff / memory, f"{12 * n * d_ff / 1e6:.0f} MB of float32 passed once"),
        "gram": (3 * short * short * wide / flops, f"3 rank-{wide} updates of order {short}"),
        "eigenvalues": (3 * 4 * short**3 / 3 / flops, f"3 tridiagonal reductions of order {short}"),
    }
    return {stage: {"seconds": seconds, "counts": what} for stage, (seconds, what) in counts.items()}


# --- kernels: the measurements behind the kernel choices ---------------------------------------

KERNEL_SIZES = (768, 1024, 1536, 2048, 3072, 4096)


def run_kernels_bench(*, sizes=KERNEL_SIZES, threads: int = 1, repeats: int = 3, head_dim: int = 128) -> dict:
    """Time the candidate kernels at each size (the least CPU seconds of ``repeats`` runs, all threads
    of the process, which a shared machine's load does not inflate the way it does wall seconds;
    ``threads`` BLAS threads): the symmetric eigensolvers of a Gram matrix (NumPy's one-stage
    ``dsyevd``, OpenBLAS's two-stage ``dsyevd_2stage``, torch/MKL's ``eigvalsh``, SciPy's ``evd`` and
    ``evr`` drivers) and one head's ``N x N`` (1,1)-norm from ``head_dim x N`` factors in 1 MB row
    blocks against the tiles of :func:`specbound.compute.spectra._streamed_norm_1_1`.
    ``two_stage_min_measured``: the least measured order from which on the two-stage driver beat
    NumPy's at every larger measured order (what :data:`~specbound.compute.eigensolvers.TWO_STAGE_MIN`
    is set from; None if it never did).  The defaults of :mod:`specbound.compute.eigensolvers` and
    :mod:`specbound.compute.spectra` come from these numbers on the development machine; rerun on
    yours to check them."""

    def best(fn):
        return min(_timed_cpu(fn)[1] for _ in range(repeats))

    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(limits=threads):
        for n in sizes:
            x = rng.standard_normal((n, n + 64))
            g = x @ x.T
            times = {
                "numpy_dsyevd": best(lambda: np.linalg.eigvalsh(g)),
                "scipy_evd": best(lambda: scipy.linalg.eigh(g, eigvals_only=True, driver="evd")),
                "scipy_evr": best(lambda: scipy.linalg.eigh(g, eigvals_only=True, driver="evr")),
            }
            saved = eigensolvers.TWO_STAGE_MIN
            eigensolvers.TWO_STAGE_MIN = 0
            try:
                if eigensolvers._two_stage_driver() is not None:
                    times["openblas_dsyevd_2stage"] = best(lambda: eigensolvers.symmetric_eigenvalues(g))
            finally:
                eigensolvers.TWO_STAGE_MIN = saved
            try:
                import torch

                torch_threads = torch.get_num_threads()
                torch.set_num_threads(threads)
                gt = torch.from_numpy(g)
                times["torch_mkl_eigvalsh"] = best(lambda: torch.linalg.eigvalsh(gt))
                torch.set_num_threads(torch_threads)
            except ImportError:
                pass
            a, b = rng.standard_normal((head_dim, n)), rng.standard_normal((head_dim, n))
            norms = {
                "row_blocks_1MB": best(lambda: _row_block_norm_1_1(a, b)),
                "tiles_512": best(lambda: spectra._streamed_norm_1_1(a, b)),
            }
            block = rng.standard_normal((spectra._GRAM_BLOCK, n)).astype(np.float32).T  # a bf16 Linear's block
            product, lower = np.empty((n, n)), np.zeros((n, n), order="F")
            wide = np.asarray(block, dtype=np.float64)
            grams = {
                "numpy_matmul_float64": best(lambda: np.matmul(wide, wide.T, out=product)),
                "dsyrk_from_float32": best(lambda: spectra._block_gram(block, lower)),
            }
            rows.append(
                {
                    "n": n,
                    "eigenvalues": times,
                    "eigenvalues_fastest": min(times, key=times.get),
                    "chosen": eigensolvers.eigensolver_name(n),
                    "norm_1_1_one_head": norms,
                    "gram_block": grams,
                }
            )
    return {
        "threads": threads,
        "repeats": repeats,
        "head_dim": head_dim,
        "sizes": rows,
        "two_stage_min_measured": two_stage_crossover(rows),
        "two_stage_min_in_use": eigensolvers.TWO_STAGE_MIN,
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }


def two_stage_crossover(rows: list[dict]) -> int | None:
    """The least order ``n`` of ``rows`` (:func:`run_kernels_bench`'s, ascending) from which on the
    two-stage driver took less time than NumPy's ``dsyevd`` at every measured order; None if it was
    slower at the largest (or was not measured)."""
    found = None
    for r in reversed(rows):
        times = r["eigenvalues"]
        if times.get("openblas_dsyevd_2stage", float("inf")) >= times["numpy_dsyevd"]:
            break
        found = r["n"]
    return found


def format_kernels_bench(report: dict) -> str:
    lines = [
        f"least CPU seconds of {report['repeats']} runs, {report['threads']} BLAS thread(s), load average "
        f"{report['load_average_1min']:.2f} on {report['cpu_count']} CPUs",
        "",
        "eigenvalues of an n x n Gram matrix (CPU s):",
    ]
    names = sorted({k for r in report["sizes"] for k in r["eigenvalues"]})
    lines.append(f"{'n':>6} " + " ".join(f"{k:>22}" for k in names) + "   chosen")
    for r in report["sizes"]:
        cells = " ".join(f"{r['eigenvalues'][k]:>22.3f}" if k in r["eigenvalues"] else f"{'-':>22}" for k in names)
        lines.append(f"{r['n']:>6} {cells}   {r['chosen']}")
    crossover = report["two_stage_min_measured"]
    lines += [
        f"two-stage faster from n = {crossover} on (measured); TWO_STAGE_MIN in use: {report['two_stage_min_in_use']}"
        if crossover
        else f"two-stage not faster at the largest n measured; TWO_STAGE_MIN in use: {report['two_stage_min_in_use']}"
    ]
    lines += [
        "",
        f"(1,1)-norm of one n x n head product from {report['head_dim']} x n factors (CPU s):",
        f"{'n':>6} {'1 MB row blocks':>16} {'tiles <= 512':>16}",
    ]
    for r in report["sizes"]:
        v = r["norm_1_1_one_head"]
        lines.append(f"{r['n']:>6} {v['row_blocks_1MB']:>16.4f} {v['tiles_512']:>16.4f}")
    lines += [
        "",
        "one 512-column block of an n-row Gram matrix (CPU s): the product the old path formed (float64) "
        "and the lower-triangle rank-k update from the stored float32:",
        f"{'n':>6} {'numpy matmul':>16} {'dsyrk':>16}",
    ]
    for r in report["sizes"]:
        v = r["gram_block"]
        lines.append(f"{r['n']:>6} {v['numpy_matmul_float64']:>16.4f} {v['dsyrk_from_float32']:>16.4f}")
    return "\n".join(lines)
