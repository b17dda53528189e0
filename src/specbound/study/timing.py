"""How long the runs a grid still needs would take: an estimate from the CPU seconds measured in
a study folder's ``runs.csv`` (``specbound study --estimate``), never a measurement.

A run's CPU time (``cpu_seconds``: one thread, training, evaluation and flatness) is, at fixed
everything else, about linear in depth: the forward and backward passes cost one block per layer,
and the steps to the criterion change little along the measured depth axes.  For a run to do, the
measured runs of the same task that differ from it in depth alone (any seed) give, by least squares
in depth,

* ``expected``: ``cpu_seconds`` extrapolated to the run's depth (the steps as at the measured depths);
* ``capped``: CPU seconds per step extrapolated the same way, times the step cap ``max_steps`` (the
  run never meets the criterion: the most it can cost).

Extrapolating beyond the measured depths (say 6 to 12) is the weak point: read the pair as a range.
Wall clock on ``K`` single-threaded workers is the sum over ``K``, which assumes perfect packing and
a core per worker as fast and as idle as the ones that measured ``runs.csv``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SpecboundError
from .data import TASKS
from .grid import HPARAMS, make_grid, with_seeds


def _linear(depth: np.ndarray, value: np.ndarray, at: float) -> float:
    """Least-squares line through ``(depth, value)`` evaluated at ``at``; NaN with under two depths."""
    if np.unique(depth).size < 2:
        return math.nan
    slope, intercept = np.polyfit(depth.astype(float), value.astype(float), 1)
    return float(intercept + slope * at)


def estimate_runs(measured: pd.DataFrame, configs: list) -> pd.DataFrame:
    """One row per config: ``task, *HPARAMS, seed, max_steps, expected_cpu_s, capped_cpu_s,
    measured_depths`` (NaN estimates where no measured run differs from it in depth alone)."""
    others = [h for h in HPARAMS if h != "depth"]
    rows = []
    for c in configs:
        ref = measured[(measured["task"] == c.task)]
        for h in others:
            ref = ref[np.isclose(ref[h].to_numpy(dtype=float), float(getattr(c, h)))]
        depth = ref["depth"].to_numpy(dtype=float)
        cpu = ref["cpu_seconds"].to_numpy(dtype=float)
        per_step = cpu / np.maximum(ref["steps"].to_numpy(dtype=float), 1.0)
        rows.append(
            {
                "task": c.task,
                **{h: getattr(c, h) for h in HPARAMS},
                "seed": c.seed,
                "max_steps": c.max_steps,
                "expected_cpu_s": _linear(depth, cpu, c.depth),
                "capped_cpu_s": _linear(depth, per_step, c.depth) * c.max_steps,
                "measured_depths": ",".join(str(int(d)) for d in sorted(set(depth.tolist()))),
            }
        )
    return pd.DataFrame(rows)


def estimate_grid(
    out: str | Path, *, grid: str = "deep", tasks: tuple[str, ...] | None = None, seeds: tuple[int, ...] | None = None
) -> pd.DataFrame:
    """The runs of ``grid`` that ``out/runs.csv`` does not hold, each with its estimate
    (:func:`estimate_runs`)."""
    path = Path(out) / "runs.csv"
    if not path.is_file():
        raise SpecboundError(
            f"no {path}: --estimate extrapolates from a study folder's runs.csv; run "
            f"`specbound study --out {out}` first (or point --out at docs/study-default)"
        )
    measured = pd.read_csv(path)
    configs = make_grid(grid, tuple(tasks or TASKS))
    if seeds is not None:
        configs = with_seeds(configs, tuple(seeds))
    done = set(measured["key"].astype(str))
    return estimate_runs(measured, [c for c in configs if c.key not in done])


def format_estimate(todo: pd.DataFrame, workers: int | None = None) -> str:
    """A few lines: how many runs, their estimated CPU time, and wall clock on 2 cores and on
    ``workers`` single-threaded workers."""
    if todo.empty:
        return "nothing to do: runs.csv already holds every run of the grid"
    known = todo.dropna(subset=["expected_cpu_s", "capped_cpu_s"])
    expected, capped = known["expected_cpu_s"].sum(), known["capped_cpu_s"].sum()
    lines = [
        f"{len(todo)} runs to do (depths {', '.join(map(str, sorted(set(todo['depth']))))}); ESTIMATE from the "
        f"measured CPU seconds of the runs that differ from each in depth alone:",
        f"  {expected:,.0f} CPU s if the steps to the criterion stay as at the measured depths, "
        f"{capped:,.0f} CPU s if every run hits its step cap",
    ]
    for task, part in known.groupby("task"):
        lines.append(
            f"  {task}: {len(part)} runs, {part['expected_cpu_s'].sum():,.0f} to "
            f"{part['capped_cpu_s'].sum():,.0f} CPU s (the longest {part['capped_cpu_s'].max():,.0f} s)"
        )
    for k in sorted({2, workers or 2}):
        lines.append(
            f"  wall clock on {k} single-threaded workers (perfect packing, a core each): "
            f"{expected / k / 60:,.0f} to {capped / k / 60:,.0f} min"
        )
    if len(known) < len(todo):
        lines.append(
            f"  {len(todo) - len(known)} runs have no measured run differing from them in depth alone: "
            f"no estimate for those"
        )
    return "\n".join(lines)
