"""``specbound bench --scenario threads``: ``specbound.analyze()`` with its defaults against
``threads=1`` and the other ways of spending the cores, in one process, idle or under load.

The defaults take one layer per usable core (``jobs="auto"``) with one BLAS thread each, so BLAS
threads x jobs is at most the usable cores.  The other contenders: ``threads=1``; one layer at a time
with one BLAS thread; one layer at a time with as many BLAS threads as usable cores.  The contenders are
timed interleaved (one run of each, ``repeats`` times), so a change of load hits them alike; the report
gives each one's median, fastest and slowest seconds and its ratio to ``threads=1``, the usable cores,
the cgroup's CPU quota and whether every contender gave the same bounds (to 1e-12).  ``load=K`` starts
K busy processes for the length of the measurement, to time the contenders on cores other jobs share.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ..pipeline import analyze, available_cores, cgroup_cpu_quota

# label -> analyze() keywords.  "defaults" is what a user who passes nothing gets.
CONTENDERS = {
    "defaults": {},
    "threads=1": {"threads": 1},
    "jobs=1 threads=1": {"jobs": 1, "threads": 1},
    "jobs=1 threads=cores (old default)": {"jobs": 1, "threads": "cores"},
}
_SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def run_threads_bench(*, repeats: int = 5, load: int = 0, source=None, max_load_seconds: float = 600.0) -> dict:
    """Median seconds of each :data:`CONTENDERS` entry on ``source`` (default: the embedded
    checkpoint), ``repeats`` interleaved rounds, with ``load`` busy processes running meanwhile
    (each stops by itself after ``max_load_seconds`` and is terminated at the end)."""

    analyze(source, **CONTENDERS["defaults"])  # warm: imports, page cache, the pinned files' hashes
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN.format(seconds=max_load_seconds)]) for _ in range(load)]
    seconds: dict[str, list[float]] = {label: [] for label in CONTENDERS}
    bounds: dict[str, dict] = {}
    try:
        for _ in range(repeats):
            for label, keywords in CONTENDERS.items():
                keywords = {k: available_cores() if v == "cores" else v for k, v in keywords.items()}
                start = time.perf_counter()
                result = analyze(source, **keywords)
                seconds[label].append(time.perf_counter() - start)
                bounds[label] = result.all_bounds()
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.wait()
    reference = statistics.median(seconds["threads=1"])
    rows = [
        {
            "contender": label,
            "median_s": statistics.median(times),
            "min_s": min(times),
            "max_s": max(times),
            "ratio_to_threads_1": statistics.median(times) / reference,
            "runs": len(times),
        }
        for label, times in seconds.items()
    ]
    return {
        "scenario": f"analyze() on {'the embedded default' if source is None else Path(source).name}, "
        f"{repeats} interleaved rounds, {load} busy process(es) beside it",
        "usable_cores": available_cores(),
        "cgroup_cpu_quota": cgroup_cpu_quota(),
        "load_processes": load,
        "rows": rows,
        "same_numbers": all(_close(b, bounds["threads=1"]) for b in bounds.values()),
    }


def _close(a: dict, b: dict) -> bool:
    """The same bounds up to the order of BLAS's sums (two BLAS threads may split a product differently)."""
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-12) for k in a)


def format_threads_bench(report: dict) -> str:
    """The text of ``specbound bench --scenario threads``."""
    quota = report["cgroup_cpu_quota"]
    lines = [
        f"scenario          {report['scenario']}",
        f"usable cores      {report['usable_cores']} (cgroup CPU quota: {'none' if quota is None else quota})",
        f"{'contender':<36}{'median s':>10}{'min s':>9}{'max s':>9}{'/ threads=1':>13}",
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['contender']:<36}{row['median_s']:>10.2f}{row['min_s']:>9.2f}{row['max_s']:>9.2f}"
            f"{row['ratio_to_threads_1']:>13.2f}"
        )
    lines.append(f"same bounds from every contender (to 1e-12): {'yes' if report['same_numbers'] else 'NO'}")
    return "\n".join(lines)
