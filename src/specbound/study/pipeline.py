"""``run_study``: grid -> train to the criterion (resumable, in worker processes or as Dask tasks)
-> analyze every checkpoint -> records -> correlations and growth exponents over the runs that met
the criterion -> report.  ``report_study``: the same statistics and report from a stored
``runs.csv`` alone.

Threads: training models this small gains nothing from intra-op threads (a second torch thread
made training slower; docs/benchmarks.md), so the ``threads`` budget is spent on ``jobs`` worker
processes (default: one per thread), each with ``threads // jobs`` torch/BLAS threads, pinned
before torch is imported.  Workers are spawned, so
the calling process never imports torch.

Bigger grids run as Dask tasks, one per run, as ``specbound sweep`` does (sweep/run.py): a local
cluster of ``workers`` single-threaded processes, or an existing cluster at ``scheduler`` whose
workers can read and write ``out`` (a shared file system) and have the datasets installed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

import pandas as pd

from ..errors import SpecboundError
from ..options import NON_NEGATIVE_INT, POSITIVE_INT, check
from ..sweep.cluster import dask_client
from .correlate import BOOTSTRAP, BOOTSTRAP_K, CORRELATION_COLUMNS, clusters, correlations
from .data import TASKS
from .grid import GRIDS, HPARAMS, RunConfig, make_grid, with_seeds
from .report import write_report
from .runs import analyze_record, is_trained, load_records, remove_stale_temps, run_path, train_and_record
from .scaling import SCALING_COLUMNS, scaling_slopes
from .table import GAPS, METRICS, measures_from_columns, pstar_table, runs_table

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class StudyResult:
    """What :func:`run_study` produced.

    Attributes
    ----------
    runs : DataFrame
        One row per run (``table.runs_table``): hyper-parameters, metrics, every measure, and its
        ``base`` point and bootstrap ``cluster`` (``correlate.clusters``).
    measures : DataFrame
        The measure columns' catalogue (``column, kind, bound``).
    correlations : DataFrame
        Long table of tau, psi, K and sign-errors with intervals (``correlate.correlations``), over
        the runs that met the training criterion.
    pstar : DataFrame
        One row per analysed matrix: the chosen Schatten index ``p*`` (``table.pstar_table``).
    scaling : DataFrame
        Every bound's growth exponent in depth and width (``scaling.scaling_slopes``).
    files : dict[str, Path]
        The report's files (``report.md``, ``runs.csv``, ``correlations.csv``, ``scaling.csv``, figures).
    timing : dict
        ``seconds`` (wall clock), ``trained``, ``analysed``, ``skipped`` runs, ``jobs``, ``threads``.
    """

    runs: pd.DataFrame
    measures: pd.DataFrame
    correlations: pd.DataFrame
    pstar: pd.DataFrame = field(default_factory=pd.DataFrame)
    scaling: pd.DataFrame = field(default_factory=pd.DataFrame)
    files: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)


def run_study(
    out: str | Path,
    *,
    grid: str | list[RunConfig] = "default",
    tasks: tuple[str, ...] = TASKS,
    threads: int = 2,
    jobs: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    seeds: tuple[int, ...] | None = None,
    reanalyze: bool = False,
    figures: bool = True,
    bootstrap: int | None = None,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> StudyResult:
    """Train the grid's missing runs, analyse them, and write the report into ``out``.

    Parameters
    ----------
    out : path
        Study folder: ``runs/`` (one folder per run) and the report files.
    grid : {"default", "quick", "deep"} or list of RunConfig
    tasks : tuple of {"fmnist", "langid", "fortunes"}
        Used with a named grid.
    threads : int
        CPU threads to use in all (default 2).
    jobs : int, optional
        Worker processes (default ``threads``); each gets ``max(1, threads // jobs)`` threads.
    workers, scheduler : optional
        Run every run as a Dask task instead: on a local cluster of ``workers`` processes, or on the
        existing cluster at ``scheduler`` (``tcp://host:port``); not both.
    seeds : tuple of int, optional
        Replace the grid's seeds (a bigger or smaller study over the same configurations).
    reanalyze : bool
        Recompute every ``analysis.json`` (after a change to the bounds), keeping the trained runs.
    figures : bool
        Draw the figures (matplotlib).
    bootstrap : int, optional
        Bootstrap replicates for the intervals (default ``correlate.BOOTSTRAP``; K uses at most
        ``correlate.BOOTSTRAP_K``).
    command : str, optional
        The command line, recorded in the report.
    log : callable(str), optional
        Progress lines (default: stderr).
    """
    check("threads", threads, POSITIVE_INT)
    jobs = check("jobs", threads if jobs is None else jobs, POSITIVE_INT)
    if workers is not None and scheduler is not None:
        raise SpecboundError("pass either workers (a local Dask cluster) or scheduler (an existing one), not both")
    check("workers", workers, None, POSITIVE_INT)
    bootstrap = check("bootstrap", BOOTSTRAP if bootstrap is None else bootstrap, NON_NEGATIVE_INT)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out)
    grid_name = grid if isinstance(grid, str) else "custom"
    configs = make_grid(grid, tuple(tasks)) if isinstance(grid, str) else list(grid)
    if seeds is not None:
        configs = with_seeds(configs, tuple(seeds))
    if not configs:
        raise SpecboundError("the grid is empty: nothing to train")
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for tmp in remove_stale_temps(out):
        log(f"removed {tmp.name}: left by an interrupted run")
    todo = [
        c
        for c in configs
        if reanalyze or not (is_trained(run_path(out, c)) and (run_path(out, c) / "analysis.json").exists())
    ]
    todo.sort(key=lambda c: -c.cost)  # longest first: the pool finishes together
    if workers is not None or scheduler is not None:
        where = f"Dask scheduler {scheduler}" if scheduler else f"a local Dask cluster of {workers} workers"
        log(
            f"study '{grid_name}': {len(configs)} runs, {len(configs) - len(todo)} already done, {len(todo)} to do "
            f"on {where}"
        )
        outcomes = _execute_dask(todo, out, workers=workers, scheduler=scheduler, reanalyze=reanalyze, log=log)
        jobs_used = workers or 0
    else:
        log(
            f"study '{grid_name}': {len(configs)} runs, {len(configs) - len(todo)} already done, {len(todo)} to do "
            f"({jobs} worker process{'es' if jobs > 1 else ''} x {max(1, threads // jobs)} thread)"
        )
        outcomes = _execute_all(todo, out, jobs=jobs, threads=max(1, threads // jobs), reanalyze=reanalyze, log=log)
        jobs_used = jobs
    failed = [o for o in outcomes if o.get("error")]
    if failed:
        raise SpecboundError(
            f"{len(failed)} of {len(todo)} runs failed (first: {failed[0]['run']}: "
            f"{failed[0]['error']}); finished runs are kept, run the study again to retry"
        )
    seconds_runs = time.perf_counter() - start
    records = load_records(out, configs)
    runs, measures = runs_table(records)
    pstar = pstar_table(records)
    timing = {
        "seconds": time.perf_counter() - start,
        "seconds_training_and_analysis": seconds_runs,
        "trained": sum(o["trained"] for o in outcomes),
        "analysed": sum(o["analysed"] for o in outcomes),
        "skipped": len(configs) - len(todo),
        "jobs": jobs_used,
        "threads": threads,
        "grid": grid_name,
        "tasks": sorted({c.task for c in configs}),
        "bootstrap": bootstrap,
        "dask": scheduler or (f"LocalCluster({workers})" if workers else None),
    }
    return _analyse_and_report(
        out, runs, measures, pstar, timing=timing, start=start, figures=figures, command=command, log=log
    )


def report_study(
    out: str | Path,
    *,
    bootstrap: int | None = None,
    figures: bool = True,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
) -> StudyResult:
    """Rebuild a study's statistics and report from its stored ``runs.csv`` (and ``pstar.csv`` when
    present) alone: no run folder is read, nothing is trained or analysed.  For a study folder whose
    ``runs/`` is gone (a published one, such as docs/study-default/), or to re-report after a change
    to the statistics; a change to the bounds needs the run folders and ``--reanalyze``.
    """
    out = Path(out)
    bootstrap = check("bootstrap", BOOTSTRAP if bootstrap is None else bootstrap, NON_NEGATIVE_INT)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    path = out / "runs.csv"
    if not path.is_file():
        raise SpecboundError(
            f"no {path}: --report-only rebuilds the report of a study folder that holds runs.csv; "
            f"run `specbound study --out {out}` first"
        )
    start = time.perf_counter()
    runs = pd.read_csv(path)
    missing = [c for c in ("run", "key", "task", *HPARAMS, "seed", "max_steps", *METRICS) if c not in runs.columns]
    if missing:
        raise SpecboundError(f"{path} lacks the column(s) {', '.join(missing)}: it is not a study's runs.csv")
    runs = runs.drop(columns=[c for c in ("base", "cluster") if c in runs.columns])  # recomputed below
    measures = measures_from_columns(runs.columns)
    pstar_path = out / "pstar.csv"
    pstar = pd.read_csv(pstar_path) if pstar_path.is_file() else pd.DataFrame()
    pstar = pstar.rename(columns={"log10_alpha": "log10_downstream_factor"})  # written before the rename
    grid = _grid_of(runs)
    log(f"re-reporting {len(runs)} runs from {path}" + ("" if len(pstar) else " (no pstar.csv: no p* table)"))
    timing = {
        "seconds": 0.0,
        "seconds_training_and_analysis": 0.0,
        "trained": 0,
        "analysed": 0,
        "skipped": len(runs),
        "jobs": 0,
        "threads": 1,
        "grid": grid,
        "tasks": sorted(runs["task"].unique()),
        "bootstrap": bootstrap,
        "dask": None,
        "reported_from": "runs.csv" + (" and pstar.csv" if len(pstar) else ""),
    }
    return _analyse_and_report(
        out, runs, measures, pstar, timing=timing, start=start, figures=figures, command=command, log=log
    )


def _grid_of(runs: pd.DataFrame) -> str:
    """The named grid whose runs are exactly ``runs`` (by key), or a description."""
    keys, tasks = set(runs["key"].astype(str)), tuple(sorted(runs["task"].unique()))
    for name in GRIDS:
        if {c.key for c in make_grid(name, tasks)} == keys:
            return name
    return "custom (as recorded in runs.csv)"


def _analyse_and_report(
    out: Path,
    runs: pd.DataFrame,
    measures: pd.DataFrame,
    pstar: pd.DataFrame,
    *,
    timing: dict,
    start: float,
    figures: bool,
    command: str | None,
    log,
) -> StudyResult:
    """Clusters over every run, then correlations and growth exponents over the runs that met the
    criterion, then the report files."""
    bootstrap = timing["bootstrap"]
    base, cluster = clusters(runs)
    runs = runs.assign(base=base, cluster=cluster)
    converged = runs[runs["converged"].astype(bool)]
    log(
        f"{len(converged)} of {len(runs)} runs met the training criterion; correlating those "
        f"({bootstrap} bootstrap replicates over {len(set(converged['cluster']))} clusters)"
    )
    if len(converged):
        corr = correlations(
            converged, measures, gaps=GAPS, bootstrap=bootstrap, bootstrap_k=min(bootstrap, BOOTSTRAP_K)
        )
        bounds = measures.loc[measures["kind"] == "complexity", "column"].tolist()
        scaling = scaling_slopes(converged, bounds, bootstrap=bootstrap)
    else:  # nothing to correlate: the report still lists every run and why it is excluded
        corr = pd.DataFrame(columns=CORRELATION_COLUMNS)
        scaling = pd.DataFrame(columns=SCALING_COLUMNS)
    files = write_report(
        out, runs, measures, corr, pstar, scaling=scaling, timing=timing, command=command, figures=figures
    )
    timing["seconds"] = time.perf_counter() - start
    return StudyResult(
        runs=runs, measures=measures, correlations=corr, pstar=pstar, scaling=scaling, files=files, timing=timing
    )


def _execute_dask(todo: list[RunConfig], out: Path, *, workers, scheduler, reanalyze: bool, log) -> list[dict]:
    """Every run as one Dask task (:func:`_execute`, which trains unless recorded and analyses);
    a worker's failure is the run's error, reported like a local one."""
    if not todo:
        return []

    outcomes = []
    with dask_client(workers=workers, scheduler=scheduler, what="study") as (client, _):
        from dask.distributed import as_completed

        client.run(_init_worker, 1)  # one torch/BLAS thread per worker process, as the local pool
        futures = {
            client.submit(_execute, c, str(out.resolve()), reanalyze, pure=False, key=f"specbound-study-{c.name}"): c
            for c in todo
        }
        for i, future in enumerate(as_completed(list(futures)), 1):
            try:
                outcome = future.result()
            except Exception as exc:  # KilledWorker and the like: the run failed, the others go on
                outcome = {
                    "run": futures[future].name,
                    "trained": False,
                    "analysed": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "seconds": 0.0,
                }
            outcomes.append(outcome)
            log(f"[{i}/{len(todo)}] {_describe(futures[future])}: {_outcome_text(outcome)}")
    return outcomes


def _execute_all(todo: list[RunConfig], out: Path, *, jobs: int, threads: int, reanalyze: bool, log) -> list[dict]:
    if not todo:
        return []
    outcomes = []
    ctx = get_context("spawn")  # never fork a process that may hold threads
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(todo)), mp_context=ctx, initializer=_init_worker, initargs=(threads,)
    ) as pool:
        futures = {pool.submit(_execute, c, str(out), reanalyze): c for c in todo}
        for i, future in enumerate(as_completed(futures), 1):
            outcome = future.result()
            outcomes.append(outcome)
            log(f"[{i}/{len(todo)}] {_describe(futures[future])}: {_outcome_text(outcome)}")
    return outcomes


def _init_worker(threads: int) -> None:
    """Pin the worker's threads before torch is imported (then again through torch's API)."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass


def _execute(config: RunConfig, out: str, reanalyze: bool) -> dict:
    """Train (unless recorded) and analyse (unless analysed) one run, in a worker process."""
    start = time.perf_counter()
    outcome = {"run": config.name, "trained": False, "analysed": False}
    try:
        outcome["trained"] = train_and_record(config, Path(out))
        outcome["analysed"] = analyze_record(config, Path(out), reanalyze=reanalyze or outcome["trained"])
    except Exception as exc:  # reported by the parent, which keeps the other runs going
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    outcome["seconds"] = time.perf_counter() - start
    if outcome["trained"]:
        metrics = json.loads((run_path(Path(out), config) / "metrics.json").read_text())
        outcome.update(
            {k: metrics[k] for k in ("train_error", "test_error", "error_gap", "converged", "steps", "cpu_seconds")}
        )
    return outcome


def _describe(c: RunConfig) -> str:
    return (
        f"{c.task} depth={c.depth} width={c.width} n={c.train_size} lr={c.lr:g} batch={c.batch_size} "
        f"wd={c.weight_decay:g} dropout={c.dropout:g} seed={c.seed}"
    )


def _outcome_text(o: dict) -> str:
    if o.get("error"):
        return f"FAILED ({o['error']})"
    done = "trained and analysed" if o["trained"] else ("analysed" if o["analysed"] else "already done")
    text = f"{done} in {o['seconds']:.1f} s"
    if "error_gap" in o:
        text += (
            f" ({o['steps']} steps, {'met the criterion' if o['converged'] else 'MISSED the criterion'}; "
            f"train error {o['train_error']:.3f}, test error {o['test_error']:.3f}, {o['cpu_seconds']:.0f} CPU s)"
        )
    return text
