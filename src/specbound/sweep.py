"""``specbound sweep``: analyse many checkpoints into a results store, here or on a Dask cluster.

A sweep is planned, then run:

* **plan**: every source is opened (config.json and the safetensors headers only), its weights are
  hashed and, for each option set, the record key is formed (:mod:`specbound.store`); keys already
  in the store are skipped;
* **run**: each remaining (checkpoint, option set) is one task, analysed here one after the other
  (the default), or on a Dask cluster: a local one with ``workers=K``, an existing one with
  ``scheduler="tcp://host:port"``.  A very large checkpoint becomes one task per layer plus one that
  assembles the layers (:func:`specbound.analysis.assemble`), so no worker has to hold a whole model.
  Every mode runs the same functions on the same inputs with BLAS pinned to ``threads``, so the
  records are identical whichever way they were computed.

Records are written by this process as each task finishes (atomically, see
:class:`~specbound.store.Store`), so a sweep stopped at any moment keeps what it completed and the
next run picks up the rest.  With a remote scheduler the workers must be able to read the sources
at the same paths (a shared file system); the store only needs to be writable here.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecboundError
from .sources import Source
from .store import Record, Store, canonical_options, record_from_analysis, record_key, weights_digest

# A checkpoint whose weight files exceed this many bytes runs as one Dask task per layer.
PER_LAYER_BYTES = 2 << 30
PER_LAYER_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class Task:
    """One checkpoint with one option set, planned.

    Attributes
    ----------
    source : Source
    options : dict
        Canonical analysis options (:func:`specbound.store.canonical_options`).
    key : str
        Its record key in the store.
    weights_sha256 : str
    layers, matrices : int
        How many layers and matrices its analysis covers (for progress).
    weight_bytes : int
        Total size of its weight files.
    """

    source: Source
    options: dict[str, Any]
    key: str
    weights_sha256: str
    layers: int
    matrices: int
    weight_bytes: int


@dataclass
class SweepReport:
    """What a sweep did.

    Attributes
    ----------
    store : Path
    planned : list of Task
        Every (checkpoint, option set), in order.
    skipped : list of str
        Keys already in the store before this run.
    written : list of str
        Keys this run added.
    failed : list of (str, str)
        ``(source, one-line error)`` for each source or task that could not be analysed.
    seconds : float
        Wall time of the whole sweep, planning included.
    mode : str
        ``"local"``, or ``"dask"`` with the scheduler address.
    """

    store: Path
    planned: list[Task] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    mode: str = "local"

    def summary(self) -> str:
        lines = [f"sweep: {len(self.planned)} checkpoint(s) x option set(s): {len(self.written)} analysed, "
                 f"{len(self.skipped)} already in the store, {len(self.failed)} failed; "
                 f"{self.seconds:.1f} s ({self.mode})",
                 f"store: {self.store} ({len(Store(self.store))} records)"]
        lines += [f"failed: {source}: {message}" for source, message in self.failed]
        return "\n".join(lines)


# --- plan --------------------------------------------------------------------------------------

def plan_task(source: Source, options: dict[str, Any]) -> Task:
    """Open ``source`` (headers only), hash its weights and form its key for ``options``."""
    from .analysis import open_model

    options = canonical_options(options)
    model = open_model(source.target, arch_spec=options["arch_spec"])
    files = sorted(set(model.ckpt.shards.values()))
    digest = weights_digest(model.ckpt.config, files)
    dims = model.dims
    per_layer = 2 * dims.H + (3 if dims.feed_forward == "gated" else 2)
    model.ckpt.close()
    return Task(source, options, record_key(digest, options), digest, dims.L, dims.L * per_layer,
                sum(p.stat().st_size for p in files))


def plan_sweep(sources: list[Source], option_sets: list[dict[str, Any]], report: SweepReport,
               progress: bool = False) -> list[Task]:
    """Every (source, option set) task, failures noted in ``report`` rather than raised."""
    tasks, seen = [], set()
    bar = _bar(progress, total=len(sources) * len(option_sets), desc="hashing", unit="ckpt", leave=False)
    for source in sources:
        for options in option_sets:
            try:
                task = plan_task(source, options)
            except SpecboundError as exc:
                report.failed.append((source.name, str(exc)))
            else:
                if task.key not in seen:  # the same weights under two names: analysed once
                    seen.add(task.key)
                    tasks.append(task)
            bar.update(1)
    bar.close()
    return tasks


# --- what a task runs (here or on a Dask worker) -----------------------------------------------

def analyze_task(task: Task, threads: int | None = 1, progress=None, mode: str = "local") -> Record:
    """Analyse one planned task and build its record."""
    from .analysis import analyze

    opts = dict(task.options)
    start = time.perf_counter()
    analysis = analyze(task.source.target, threads=threads, progress=progress, **opts)
    return record_from_analysis(analysis, key=task.key, source=task.source.name, labels=task.source.labels,
                                weights_sha256=task.weights_sha256, options=task.options,
                                seconds=time.perf_counter() - start, mode=mode)


def layer_task(task: Task, layer: int, threads: int | None = 1):
    """Spectra of one layer of a planned task, and the seconds they took."""
    from threadpoolctl import threadpool_limits

    from .analysis import model_layer_spectra, open_model

    start = time.perf_counter()
    with threadpool_limits(limits=threads):
        model = open_model(task.source.target, arch_spec=task.options["arch_spec"])
        spectra = model_layer_spectra(model, layer, method=task.options["method"],
                                      gram_rtol=task.options["gram_rtol"])
        model.ckpt.close()
    return spectra, time.perf_counter() - start


def assemble_task(task: Task, layer_results: list, threads: int | None = 1) -> Record:
    """The record of a task run layer by layer (:func:`layer_task`), as :func:`analyze_task` makes it."""
    from threadpoolctl import threadpool_limits

    from .analysis import assemble, open_model

    start = time.perf_counter()
    o = task.options
    with threadpool_limits(limits=threads):
        model = open_model(task.source.target, arch_spec=o["arch_spec"])
        model.ckpt.close()
        layers = [spectra for spectra, _ in layer_results]
        analysis = assemble(model, layers, grid_m=o["grid_m"], rank_tol=o["rank_tol"], l_phi=o["l_phi"],
                            method=o["method"], gram_rtol=o["gram_rtol"])
    seconds = time.perf_counter() - start + sum(s for _, s in layer_results)
    return record_from_analysis(analysis, key=task.key, source=task.source.name, labels=task.source.labels,
                                weights_sha256=task.weights_sha256, options=task.options, seconds=seconds,
                                mode="dask-per-layer")


# --- run ---------------------------------------------------------------------------------------

def run_sweep(sources: list[Source], store: str | Path, *, option_sets: list[dict[str, Any]] | None = None,
              workers: int | None = None, scheduler: str | None = None, per_layer: str = "auto",
              threads: int | None = 1, progress: bool | None = None) -> SweepReport:
    """Analyse every source with every option set into ``store``, skipping what is there.

    Parameters
    ----------
    sources : list of Source
        From :func:`specbound.sources.expand_sources`.
    store : path
        The results store folder (created when missing).
    option_sets : list of dict, optional
        Analysis options (``grid_m, rank_tol, l_phi, method, gram_rtol, arch_spec``); default one
        set of defaults.
    workers : int, optional
        Run on a local Dask cluster of this many single-threaded worker processes.
    scheduler : str, optional
        Run on the existing Dask cluster at this address (``tcp://host:port``).
    per_layer : {"auto", "always", "never"}
        On Dask, split a checkpoint into one task per layer: ``"auto"`` when its weight files exceed
        ``PER_LAYER_BYTES``.
    threads : int or None
        BLAS threads per task (default 1; None: the BLAS default).
    progress : bool, optional
        Progress bars on stderr (checkpoints and matrices); default when stderr is a terminal.

    Returns
    -------
    SweepReport
    """
    if workers is not None and scheduler is not None:
        raise SpecboundError("pass either workers (a local Dask cluster) or scheduler (an existing one), not both")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise SpecboundError(f"workers must be a positive integer, got {workers!r}")
    if per_layer not in PER_LAYER_MODES:
        raise SpecboundError(f"per_layer must be one of {', '.join(PER_LAYER_MODES)}, got {per_layer!r}")
    if progress is None:
        progress = sys.stderr.isatty()
    start = time.perf_counter()
    st = Store(store)
    st.clean_incoming()
    report = SweepReport(store=st.root)
    report.planned = plan_sweep(sources, option_sets or [{}], report, progress)
    report.skipped = [t.key for t in report.planned if t.key in st]
    todo = [t for t in report.planned if t.key not in st]
    bars = _Progress(progress, report.planned, todo)
    try:
        if workers is None and scheduler is None:
            _run_here(todo, st, report, threads, bars)
        else:
            _run_dask(todo, st, report, threads, bars, workers, scheduler, per_layer)
    finally:
        bars.close()
    report.seconds = time.perf_counter() - start
    return report


def _run_here(todo: list[Task], st: Store, report: SweepReport, threads, bars) -> None:
    for task in todo:
        per_layer = task.matrices // task.layers
        try:
            record = analyze_task(task, threads, progress=lambda done, total: bars.matrices(per_layer))
        except SpecboundError as exc:
            report.failed.append((task.source.name, str(exc)))
            bars.checkpoint(task, failed=True)
            continue
        if st.put(record):
            report.written.append(task.key)
        bars.checkpoint(task, counted=True)


def _run_dask(todo, st: Store, report: SweepReport, threads, bars, workers, scheduler, per_layer) -> None:
    import contextlib
    import logging

    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise SpecboundError("a Dask sweep needs dask.distributed: pip install 'specbound[sweep]'") from None
    with contextlib.ExitStack() as stack:
        if scheduler is not None:
            try:
                client = stack.enter_context(Client(scheduler, timeout="20s"))
            except (OSError, TimeoutError) as exc:
                raise SpecboundError(f"cannot reach the Dask scheduler at {scheduler} ({exc}); start one with "
                                     f"`dask scheduler` or check the address") from None
            report.mode = f"dask {scheduler}"
        else:
            cluster = stack.enter_context(LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                silence_logs=logging.ERROR))
            client = stack.enter_context(Client(cluster))
            report.mode = f"dask LocalCluster({workers} workers)"
        finals, layers_of, submitted = {}, {}, []
        for task in todo:
            split = per_layer == "always" or (per_layer == "auto" and task.weight_bytes > PER_LAYER_BYTES)
            if split:
                parts = [client.submit(layer_task, task, layer, threads, pure=False,
                                       key=f"specbound-layer-{task.key}-{layer}") for layer in range(task.layers)]
                for part in parts:
                    layers_of[part.key] = task
                submitted += parts
                final = client.submit(assemble_task, task, parts, threads, pure=False,
                                      key=f"specbound-assemble-{task.key}")
            else:
                final = client.submit(analyze_task, task, threads, None, "dask", pure=False,
                                      key=f"specbound-{task.key}")
            finals[final.key] = (task, split)
            submitted.append(final)
        for future in as_completed(submitted):
            if future.key in layers_of:
                if future.status == "finished":
                    task = layers_of[future.key]
                    bars.matrices(task.matrices // task.layers)
                continue
            task, split = finals[future.key]
            try:
                record = future.result()
            except SpecboundError as exc:
                report.failed.append((task.source.name, str(exc)))
                bars.checkpoint(task, failed=True)
                continue
            if st.put(record):
                report.written.append(task.key)
            bars.checkpoint(task, counted=split)


# --- progress ----------------------------------------------------------------------------------

class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def _bar(enabled: bool, **kwargs):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)


class _Progress:
    """Two bars: checkpoints done, and matrices done (per layer when the run reports layers)."""

    def __init__(self, enabled: bool, planned: list[Task], todo: list[Task]):
        done_matrices = sum(t.matrices for t in planned) - sum(t.matrices for t in todo)
        self._ckpt = _bar(enabled, total=len(planned), initial=len(planned) - len(todo), desc="checkpoints",
                          unit="ckpt", position=0)
        self._mats = _bar(enabled, total=sum(t.matrices for t in planned), initial=done_matrices,
                          desc="matrices", unit="mat", position=1)
        self._counted: dict[str, int] = {}

    def matrices(self, n: int) -> None:
        self._mats.update(n)

    def checkpoint(self, task: Task, *, counted: bool = False, failed: bool = False) -> None:
        """A task finished; ``counted``: its matrices were already reported layer by layer."""
        if not counted and not failed:
            self._mats.update(task.matrices)
        self._ckpt.update(1)

    def close(self) -> None:
        self._mats.close()
        self._ckpt.close()
