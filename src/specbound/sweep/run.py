"""``specbound sweep``: analyse many checkpoints into a results store, here or on a Dask cluster.

A sweep is planned, then run:

* **plan**: every source is opened (config.json and the safetensors headers only); its weights are
  hashed in a background thread, ahead of the analyses, and for each option set the record key is
  formed (:mod:`specbound.sweep.store`); keys already in the store are skipped;
* **run**: each remaining (checkpoint, option set) is one task, analysed here one after the other
  (the default), or on a Dask cluster: a local one with ``workers=K``, an existing one with
  ``scheduler="tcp://host:port"``.  A very large checkpoint becomes one task per layer plus one that
  assembles the layers (:func:`specbound.pipeline.assemble`), so the layers of one large model run in
  parallel on several workers (each task reads only its layer).
  Every mode runs the same functions on the same inputs with BLAS pinned to ``threads``, so the
  records are identical whichever way they were computed.

Records are written by this process as each task finishes (atomically, see
:class:`~specbound.sweep.store.Store`; in a local run by a writer thread, while the next checkpoint is
analysed), so a sweep stopped at any moment keeps what it completed and the next run picks up the
rest.  With a remote scheduler the workers must be able to read the sources
at the same paths (a shared file system); the store only needs to be writable here.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from threadpoolctl import threadpool_limits

from ..archs.spec import load_spec_file
from ..errors import ENVIRONMENT_ERRORS, SpecboundError, one_line
from ..io.base import read_config
from ..io.formats import INDEX_FILES
from ..io.lora import is_adapter_folder
from ..options import POSITIVE_INT, AnalysisOptions, Choice, check
from ..pipeline import analyze, assemble, cap_threads, model_layer_spectra, open_init, open_model, tqdm_class
from .cluster import dask_client
from .metrics import checkpoint_metrics
from .sources import Source
from .store import (
    Record,
    Store,
    canonical_options,
    check_unchanged,
    fingerprint,
    hash_weights,
    record_from_analysis,
    record_key,
)

# A checkpoint whose weight files exceed this many bytes runs as one Dask task per layer.
PER_LAYER_BYTES = 2 << 30
PER_LAYER_MODES = ("auto", "always", "never")
# How a task runs unless told otherwise (the options that do not change the numbers): one BLAS
# thread, so that tasks side by side do not oversubscribe the cores.
TASK_RUN = AnalysisOptions(threads=1)


@dataclass(frozen=True)
class Task:
    """One checkpoint with one option set, planned.

    Attributes
    ----------
    source : Source
    options : dict
        Canonical analysis options (:func:`specbound.sweep.store.canonical_options`).
    key : str
        Its record key in the store.
    weights_sha256 : str
    layers, matrices : int
        How many layers and matrices its analysis covers (for progress).
    weight_bytes : int
        Total size of its weight files.
    fingerprints : tuple of str
        :func:`~specbound.sweep.store.fingerprint` of every weight file when it was hashed, and of
        config.json and any shard index when they were read: the analysis must read these versions.
    """

    source: Source
    options: dict[str, Any]
    key: str
    weights_sha256: str
    layers: int
    matrices: int
    weight_bytes: int
    fingerprints: tuple[str, ...] = ()


@dataclass
class SweepReport:
    """What a sweep did.

    Attributes
    ----------
    store : Path
    planned : list of Task
        Every (checkpoint, option set), in order.
    skipped : list of str
        Keys already in the store: before this run, or published by another sweep on the same
        store while this one was analysing them.
    duplicates : list of str
        Sources whose weights and options another source of this sweep already has (analysed once).
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
    duplicates: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    mode: str = "local"

    def summary(self) -> str:
        """What ``specbound sweep`` prints: counts, time, the store, and one line per failure."""
        lines = [
            f"sweep: {self.total} checkpoint(s) x option set(s): {len(self.written)} analysed, "
            f"{len(self.skipped)} already in the store, {len(self.failed)} failed; "
            f"{self.seconds:.1f} s ({self.mode})",
            f"store: {self.store} ({len(Store(self.store))} records)",
        ]
        lines += [f"same weights as another source (analysed once): {name}" for name in self.duplicates]
        lines += [f"failed: {source}: {message}" for source, message in self.failed]
        return "\n".join(lines)

    @property
    def total(self) -> int:
        """Every (checkpoint, option set) this sweep was asked for: each ends in exactly one of
        ``written``, ``skipped``, ``duplicates`` or ``failed`` (a source that could not be opened
        or hashed never becomes a planned task)."""
        return len(self.written) + len(self.skipped) + len(self.duplicates) + len(self.failed)


# --- plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """What a task's plan knows before the weights are hashed (config.json and safetensors headers)."""

    source: Source
    options: dict[str, Any]
    config: dict[str, Any]
    files: tuple[Path, ...]
    layers: int
    matrices: int
    side_files: tuple[str, ...] = ()  # fingerprints of config.json and shard indexes, as read
    init_sha256: str | None = None  # the initial weights' digest (the ``init`` option), hashed when planned

    @property
    def weight_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)


def read_header(source: Source, options: dict[str, Any]) -> Header:
    """Open ``source`` (headers only; every tensor accounted for) and count its layers and matrices."""
    options = canonical_options(options)
    model = open_model(
        source.target, arch_spec=options["arch_spec"], tower=options.get("tower"), base=options.get("base")
    )
    model.opened_checkpoint.close()
    files = tuple(sorted({p.resolve() for p in model.ckpt.files()}))
    if not files:
        raise SpecboundError(
            f"{source.name} is not stored in files; a sweep analyses model folders, weight files or hub ids"
        )
    cfg_path = model.ckpt.facts.config_path
    side = [cfg_path, *(cfg_path.parent / n for n in INDEX_FILES)] if cfg_path is not None else []
    if options["arch_spec"] is not None:  # the spec's content is in the key: it must not change either
        side.append(Path(options["arch_spec"]))
    side_prints = tuple(fingerprint(p) for p in side if p.is_file())
    # config.json read again after its fingerprint: the fingerprinted version is the one analysed
    if cfg_path is not None and read_config(cfg_path.parent) != model.opened_checkpoint.config:
        raise SpecboundError(f"{cfg_path} changed while the sweep read it; run the sweep again")
    init_sha256 = None
    if options.get("init") is not None:  # W - W0: the initial weights' bytes are part of the key, and checked
        init_model = open_init(options["init"], model)
        init_model.opened_checkpoint.close()
        init_sha256, init_prints = hash_weights(
            init_model.opened_checkpoint.config, sorted(set(init_model.ckpt.files()))
        )
        side_prints = side_prints + init_prints
    dims = model.dims
    return Header(
        source, options, model.opened_checkpoint.config, files, dims.L, dims.matrix_count(), side_prints, init_sha256
    )


def read_headers(sources: list[Source], option_sets: list[dict[str, Any]], report: SweepReport) -> list[Header]:
    """Every (source, option set), in order; a source that cannot be opened is noted in ``report``."""
    headers = []
    for source in sources:
        for options in option_sets:
            try:
                headers.append(read_header(source, options))
            except (SpecboundError, *ENVIRONMENT_ERRORS) as exc:  # one bad checkpoint never stops a sweep
                report.failed.append((source.name, str(one_line(exc, f"open {source.name}"))))
    return headers


def iter_tasks(
    headers: list[Header], store: Store | None = None, failures: list[tuple[str, str]] | None = None
) -> Iterator[Task]:
    """The tasks of ``headers`` in order, their weights hashed by a background thread ahead of the
    consumer (hashing reads the files while the previous checkpoint is analysed; it also leaves them
    in the page cache for the analysis).  With ``store``, file hashes it remembers are reused and
    new ones remembered.  A source whose files cannot be hashed is appended to ``failures``
    (raised when None)."""
    if failures is None:
        failures = _Raise()

    cache = store.load_digests() if store is not None else None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specbound-hash")
    try:
        digests: dict = {}
        ident = [(h.files, json.dumps(h.config, sort_keys=True)) for h in headers]
        for h, i in zip(headers, ident):
            if i not in digests:
                digests[i] = pool.submit(hash_weights, h.config, list(h.files), cache)
        for h, i in zip(headers, ident):
            try:
                digest, prints = digests[i].result()
            except SpecboundError as exc:  # a file unreadable or changing while hashed: this source only
                failures.append((h.source.name, str(exc)))
                continue
            yield Task(
                h.source,
                h.options,
                record_key(digest, h.options, h.init_sha256),
                digest,
                h.layers,
                h.matrices,
                h.weight_bytes,
                prints + h.side_files,
            )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # waits for the file being hashed, if any
        if store is not None:
            store.save_digests(dict(cache))


class _Raise(list):
    """A failure list that raises the first failure (for a single task's plan)."""

    def append(self, failure) -> None:
        raise SpecboundError(failure[1])


def plan_task(source: Source, options: dict[str, Any]) -> Task:
    """Open ``source`` (headers only), hash its weights and form its key for ``options``."""
    (task,) = list(iter_tasks([read_header(source, options)]))
    return task


def plan_sweep(
    sources: list[Source], option_sets: list[dict[str, Any]], report: SweepReport, store: Store | None = None
) -> list[Task]:
    """Every distinct (source, option set) task; failures noted in ``report`` rather than raised."""
    tasks, seen = [], set()
    for task in iter_tasks(read_headers(sources, option_sets, report), store, report.failed):
        if task.key in seen:
            report.duplicates.append(task.source.name)
        else:
            seen.add(task.key)
            tasks.append(task)
    return tasks


# --- what a task runs (here or on a Dask worker) -----------------------------------------------


def analyze_task(task: Task, run: AnalysisOptions = TASK_RUN, progress=None, mode: str = "local") -> Record:
    """Analyse one planned task and build its record; ``run`` says how (its ``threads``, ``jobs`` and
    ``device``; its other options are the task's)."""
    clock = time.thread_time if run.jobs == 1 else time.process_time  # CPU of the layer threads too
    start, cpu = time.perf_counter(), clock()
    check_unchanged(task.fingerprints, task.source.name)  # the bytes hashed are the bytes analysed
    analysis = analyze(task.source.target, task_options(task, run), progress=progress)
    check_unchanged(task.fingerprints, task.source.name)
    return record_from_analysis(
        analysis,
        key=task.key,
        source=task.source.name,
        labels=task.source.labels,
        metrics=task_metrics(task),
        weights_sha256=task.weights_sha256,
        options=task.options,
        seconds=time.perf_counter() - start,
        cpu_seconds=clock() - cpu,
        mode=mode,
    )


def task_metrics(task: Task) -> dict[str, float]:
    """The user's numbers for the task's checkpoint: its ``metrics.json``, then ``--metrics FILE``'s."""
    return {**checkpoint_metrics(task.source.target), **task.source.metrics}


def task_options(task: Task, run: AnalysisOptions) -> AnalysisOptions:
    """The task's options with ``run``'s ``threads``, ``jobs`` and ``device``."""
    return AnalysisOptions.build(task.options, threads=run.threads, jobs=run.jobs, device=run.device)


def layer_task(task: Task, layer: int, run: AnalysisOptions = TASK_RUN):
    """Spectra of one layer of a planned task (``run``: its ``threads`` and ``device``), and the
    seconds they took."""
    start, cpu = time.perf_counter(), time.thread_time()
    check_unchanged(task.fingerprints, task.source.name)
    options = task_options(task, run)
    with threadpool_limits(limits=run.threads):
        model = open_model(task.source.target, arch_spec=options.arch_spec, tower=options.tower, base=options.base)
        spectra = model_layer_spectra(model, layer, options.kernel)
        model.opened_checkpoint.close()
    check_unchanged(task.fingerprints, task.source.name)
    return spectra, time.perf_counter() - start, time.thread_time() - cpu


def assemble_task(task: Task, layer_results: list, run: AnalysisOptions = TASK_RUN) -> Record:
    """The record of a task run layer by layer (:func:`layer_task`), as :func:`analyze_task` makes it."""
    start, cpu = time.perf_counter(), time.thread_time()
    options = task_options(task, run)
    with threadpool_limits(limits=run.threads):
        model = open_model(task.source.target, arch_spec=options.arch_spec, tower=options.tower, base=options.base)
        model.opened_checkpoint.close()
        layers = [spectra for spectra, _, _ in layer_results]
        analysis = assemble(model, layers, options)
    check_unchanged(task.fingerprints, task.source.name)
    seconds = time.perf_counter() - start + sum(s for _, s, _ in layer_results)
    cpu_seconds = time.thread_time() - cpu + sum(c for _, _, c in layer_results)
    return record_from_analysis(
        analysis,
        key=task.key,
        source=task.source.name,
        labels=task.source.labels,
        metrics=task_metrics(task),
        weights_sha256=task.weights_sha256,
        options=task.options,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        mode="dask-per-layer",
    )


# --- run ---------------------------------------------------------------------------------------


def run_sweep(
    sources: list[Source],
    store: str | Path,
    *,
    option_sets: list[dict[str, Any]] | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    per_layer: str = "auto",
    threads: int | None = 1,
    jobs: int | str | None = None,
    progress: bool | None = None,
    device: str | None = None,
) -> SweepReport:
    """Analyse every source with every option set into ``store``, skipping what is there.

    Parameters
    ----------
    sources : list of Source
        From :func:`specbound.sweep.sources.expand_sources`.
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
    jobs : int or "auto", optional
        Layers of each checkpoint analysed at once, in threads (default: the ``jobs`` option's; not
        for per-layer tasks).  ``"auto"`` (the command line's default): as
        :func:`specbound.pipeline.auto_jobs` decides for a local run, 1 on Dask, whose workers are
        the parallelism there.
    device : {"numpy", "cpu", "cuda"}, optional
        Where each task's linear algebra runs (default: the ``device`` option's).
    progress : bool, optional
        Progress bars on stderr (checkpoints and matrices); default when stderr is a terminal.

    Returns
    -------
    SweepReport
    """
    if workers is not None and scheduler is not None:
        raise SpecboundError("pass either workers (a local Dask cluster) or scheduler (an existing one), not both")
    check("workers", workers, None, POSITIVE_INT)
    check("per_layer", per_layer, Choice(PER_LAYER_MODES))
    given = {"jobs": jobs, "device": device}
    run = AnalysisOptions.build(threads=threads, **{k: v for k, v in given.items() if v is not None})
    for options in option_sets or [{}]:  # a bad option set is the request's error, not each source's
        spec = canonical_options(options)["arch_spec"]
        if spec is not None:
            load_spec_file(spec)
    if progress is None:
        progress = sys.stderr.isatty()
    if workers is None and scheduler is None:  # a cluster's workers have their own cores
        run = AnalysisOptions.build(run, threads=cap_threads(run.threads))
    start = time.perf_counter()
    st = Store(store)
    st._ensure()  # a store that cannot be written fails now, before any analysis
    st.clean_incoming()
    report = SweepReport(store=st.root)
    headers = read_headers(sources, option_sets or [{}], report)
    bars = _Progress(progress, headers)
    tasks = _fresh_tasks(iter_tasks(headers, st, report.failed), st, report, bars)
    try:
        if workers is None and scheduler is None:
            _run_here(tasks, st, report, run, bars)
        else:
            _run_dask(
                tasks,
                st,
                report,
                AnalysisOptions.build(run, jobs=1) if run.jobs == "auto" else run,
                bars,
                workers,
                scheduler,
                per_layer,
            )
    finally:
        bars.close()
    report.seconds = time.perf_counter() - start
    return report


def _fresh_tasks(tasks: Iterator[Task], st: Store, report: SweepReport, bars) -> Iterator[Task]:
    """The tasks not yet in the store and not repeated; the others are noted in ``report``."""
    seen = set()
    for task in tasks:
        report.planned.append(task)
        if task.key in seen:
            report.duplicates.append(task.source.name)
            bars.checkpoint(task)
        elif task.key in st:
            seen.add(task.key)
            report.skipped.append(task.key)
            bars.checkpoint(task)
        else:
            seen.add(task.key)
            yield task


def _run_here(tasks: Iterator[Task], st: Store, report: SweepReport, run: AnalysisOptions, bars) -> None:
    """One task after the other in this thread; each record is written by a writer thread while
    the next checkpoint is analysed."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specbound-write") as writer:
        writes = []
        for task in tasks:
            try:
                record = analyze_task(task, run, progress=_layer_counter(task, bars))
            except (SpecboundError, *ENVIRONMENT_ERRORS) as exc:  # one bad checkpoint never stops a sweep
                report.failed.append((task.source.name, str(one_line(exc, f"analyse {task.source.name}"))))
                bars.checkpoint(task, failed=True)
                continue
            writes.append((task.key, writer.submit(st.put, record)))
            bars.checkpoint(task, counted=True)
        for key, write in writes:
            _count_write(report, key, write.result())


def _count_write(report: SweepReport, key: str, published: bool) -> None:
    """A record this sweep wrote, or one another sweep on the same store published first while
    this one was analysing it: already in the store, so every planned task is counted once."""
    (report.written if published else report.skipped).append(key)


def _layer_counter(task: Task, bars):
    """A progress callback advancing the matrices bar by the layers newly done."""
    per_layer, before = task.matrices // task.layers, 0

    def advance(done: int, total: int) -> None:
        nonlocal before
        bars.matrices(per_layer * (done - before))
        before = done

    return advance


def _run_dask(tasks, st: Store, report: SweepReport, run: AnalysisOptions, bars, workers, scheduler, per_layer) -> None:
    with dask_client(workers=workers, scheduler=scheduler, what="sweep") as (client, mode):
        from dask.distributed import KilledWorker, as_completed

        report.mode = mode
        finals, layers_of, submitted = {}, {}, []
        for task in tasks:
            # W - W0 needs both checkpoints in one task: per-layer tasks compute W's spectra only (a LoRA
            # adapter is measured from its base, so it is one task too)
            split = (
                task.options.get("init") is None
                and not is_adapter_folder(Path(str(task.source.target)))
                and (per_layer == "always" or (per_layer == "auto" and task.weight_bytes > PER_LAYER_BYTES))
            )
            if split:
                parts = [
                    client.submit(layer_task, task, layer, run, pure=False, key=f"specbound-layer-{task.key}-{layer}")
                    for layer in range(task.layers)
                ]
                for part in parts:
                    layers_of[part.key] = task
                submitted += parts
                final = client.submit(assemble_task, task, parts, run, pure=False, key=f"specbound-assemble-{task.key}")
            else:
                final = client.submit(analyze_task, task, run, None, "dask", pure=False, key=f"specbound-{task.key}")
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
            except (SpecboundError, KilledWorker, *ENVIRONMENT_ERRORS) as exc:
                message = (
                    f"the Dask worker analysing it died ({exc}): out of memory, or killed; give the workers more memory"
                    if isinstance(exc, KilledWorker)
                    else str(one_line(exc, f"analyse {task.source.name}"))
                )
                report.failed.append((task.source.name, " ".join(message.split())))
                bars.checkpoint(task, failed=True)
                continue
            _count_write(report, task.key, st.put(record))
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

    return tqdm_class()(file=sys.stderr, dynamic_ncols=True, **kwargs)


class _Progress:
    """Two bars: checkpoints done, and matrices done (per layer when the run reports layers)."""

    def __init__(self, enabled: bool, headers: list[Header]):
        self._ckpt = _bar(enabled, total=len(headers), desc="checkpoints", unit="ckpt", position=0)
        self._mats = _bar(enabled, total=sum(h.matrices for h in headers), desc="matrices", unit="mat", position=1)

    def matrices(self, n: int) -> None:
        self._mats.update(n)

    def checkpoint(self, task: Task, *, counted: bool = False, failed: bool = False) -> None:
        """A task is done (or was stored already); ``counted``: its matrices were reported layer by layer."""
        if not counted and not failed:
            self._mats.update(task.matrices)
        self._ckpt.update(1)

    def close(self) -> None:
        self._mats.close()
        self._ckpt.close()
