"""``specbound bench --scenario large --against SRC``: the large scenario's analysis timed with this
code and with the code in another checkout, interleaved, in one run.

One LLaMA-7B-shaped bf16 checkpoint (:func:`specbound.tools.bench.write_llama_checkpoint`, ``layers``
layers) is written once; then ``repeats`` rounds each analyse it twice in fresh processes, once
importing specbound from this installation ("new") and once from ``SRC`` ("old", a checkout's folder
holding ``src/specbound`` or ``specbound``), in alternating order, so that a change of load hits both
alike.  Each child reports its wall and CPU seconds (its own process time: BLAS threads included) and
its bounds.  The report gives each side's medians, the ratios new / old, and the largest relative
difference between the two sides' bounds (the same numbers are expected unless the change meant to
move them).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import SpecboundError
from .bench import LLAMA_7B, llama_scenario, llama_vocab, max_relative_bound_difference, write_llama_checkpoint

# Run in each child: import specbound from its PYTHONPATH, analyse, print one JSON line.
_CHILD = """
import json, sys, time
import specbound
from specbound.pipeline import analyze
folder, threads = sys.argv[1], int(sys.argv[2])
start, cpu = time.perf_counter(), time.process_time()
result = analyze(folder, threads=threads, jobs=1)
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                  "bounds": {k: float(v) for k, v in result.all_bounds().items()},
                  "code": specbound.__file__}))
"""


def code_folder(src: str | Path) -> Path:
    """The folder to put on PYTHONPATH for the code at ``src``: ``src`` itself when it holds the
    ``specbound`` package, else ``src/src`` (a checkout's root)."""
    src = Path(src).expanduser().resolve()
    for folder in (src, src / "src"):
        if (folder / "specbound" / "__init__.py").is_file():
            return folder
    raise SpecboundError(
        f"--against {src}: expected a checkout of specbound (a folder holding src/specbound/ or "
        f"specbound/), found none; make one with `git worktree add --detach DIR COMMIT`"
    )


def _child(folder: Path, code: Path | None, threads: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code) if code else str(Path(__file__).resolve().parents[2])
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), str(threads)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecboundError(f"the analysis with the code at {env['PYTHONPATH']} failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ab_bench(
    against: str | Path,
    *,
    layers: int,
    repeats: int = 3,
    threads: int = 1,
    workdir: str | None = None,
    shape: dict | None = None,
) -> dict:
    """Medians of ``repeats`` interleaved rounds of new and old code on one ``layers``-layer LLaMA
    checkpoint (``shape`` replaces the 7B shape: tests use a tiny one)."""

    old = code_folder(against)
    shape = dict(shape or LLAMA_7B, L=layers)
    vocab = llama_vocab(shape)
    runs: dict[str, list[dict]] = {"new": [], "old": []}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder, nbytes = write_llama_checkpoint(Path(tmp) / "llama-bf16", vocab=vocab, **shape)
        for round_ in range(repeats):
            order = ("new", "old") if round_ % 2 == 0 else ("old", "new")
            for side in order:
                runs[side].append(_child(folder, old if side == "old" else None, threads))
    med = {
        side: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "cpu_seconds")} for side, rs in runs.items()
    }
    new_b, old_b = runs["new"][-1]["bounds"], runs["old"][-1]["bounds"]
    shared = set(new_b) & set(old_b)
    return {
        "scenario": f"{llama_scenario(shape, vocab)}, {nbytes / 1e9:.2f} GB",
        "layers": shape["L"],
        "repeats": repeats,
        "threads": threads,
        "new_code": runs["new"][0]["code"],
        "old_code": runs["old"][0]["code"],
        "median": med,
        "ratio_new_over_old": {k: med["new"][k] / med["old"][k] for k in ("seconds", "cpu_seconds")},
        "seconds": {side: [r["seconds"] for r in rs] for side, rs in runs.items()},
        "cpu_seconds": {side: [r["cpu_seconds"] for r in rs] for side, rs in runs.items()},
        "bounds_compared": len(shared),
        "bounds_only_new": sorted(set(new_b) - set(old_b)),
        "bounds_only_old": sorted(set(old_b) - set(new_b)),
        "max_bound_relative_difference": max_relative_bound_difference(new_b, old_b),
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }


def format_ab_bench(report: dict) -> str:
    """The text of ``specbound bench --scenario large --against SRC``."""
    med, ratio = report["median"], report["ratio_new_over_old"]
    lines = [
        f"scenario          {report['scenario']}",
        f"A/B               {report['repeats']} interleaved rounds, each side in a fresh process, "
        f"{report['threads']} BLAS thread(s), one layer at a time",
        f"new code          {Path(report['new_code']).parent}",
        f"old code          {Path(report['old_code']).parent}",
        f"{'':17} {'median wall s':>14} {'median CPU s':>14}",
        f"{'new':17} {med['new']['seconds']:>14.2f} {med['new']['cpu_seconds']:>14.2f}",
        f"{'old':17} {med['old']['seconds']:>14.2f} {med['old']['cpu_seconds']:>14.2f}",
        f"{'new / old':17} {ratio['seconds']:>14.3f} {ratio['cpu_seconds']:>14.3f}",
        f"per run (wall)    new {', '.join(f'{s:.1f}' for s in report['seconds']['new'])}; "
        f"old {', '.join(f'{s:.1f}' for s in report['seconds']['old'])}",
        f"bounds            {report['bounds_compared']} compared, largest relative difference "
        f"{report['max_bound_relative_difference']:.2e}"
        + (f"; only new: {', '.join(report['bounds_only_new'])}" if report["bounds_only_new"] else "")
        + (f"; only old: {', '.join(report['bounds_only_old'])}" if report["bounds_only_old"] else ""),
        f"load average      {report['load_average_1min']:.2f} at the end on {report['cpu_count']} CPUs",
    ]
    return "\n".join(lines)
