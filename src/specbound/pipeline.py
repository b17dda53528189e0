"""``analyze``: load -> extract -> spectra -> measures -> bounds -> records.

The stages are the packages ``io`` (checkpoints), ``archs`` (families), ``compute`` (matrices,
spectra, propagation factors), ``bounds`` and ``records``; this module runs them in order, layer
by layer, and is what the command line, sweeps and the study call.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
from threadpoolctl import threadpool_limits

from .errors import SpecboundError, SpecboundWarning
from .options import AnalysisOptions, KernelOptions
from .io import Checkpoint, open_checkpoint
from .io.base import available_memory
from .io.default_checkpoint import DEFAULT_NAME, default_checkpoint
from .io.gguf_mmproj import gguf_pair, pair_notes
from .archs import ArchSpec, load_spec_file, spec_for_config
from .archs.graph_config import complete_config
from .archs.binding import qk_norm_eps
from .archs.spec import TowerSpec, stored_in_out
from .archs.stacks import bind, read_layer_weights, stacks_record, tensor_names
from .archs.towers import TowerView, tower_spec, tower_views
from .archs.model import UNBOUNDED_POSITIONS, LayerWeights, ModelDims, RotaryLayout
from .archs.rotary import rotary_layouts
from .archs.structure import model_structure
from .compute.latent import latent_difference_spectra
from .compute.layer_spectra import LayerSpectra, layer_spectra
from .compute.spectra import ROTARY_METHODS, dense_spectrum, numerical_rank
from .compute.torch_kernels import torch_device
from .compute.distance import difference_spectra, rotary_difference_spectra
from .compute.low_rank import update_difference_spectra
from .archs.low_rank import DenseUpdate, read_layer_updates
from .io.lora import LoraCheckpoint
from .io.sentence_modules import DENSE_ACTIVATIONS, SentenceModules
from .compute.qk_logit import logit_factors
from .compute.measures import measure
from .compute.propagation import activation_lipschitz, check_gated_activation
from .bounds import compute_all
from .bounds.gap import GapParameters, describe, gap_bounds
from .bounds.schatten import default_grid_m
from .bounds.assumptions import AssumptionContext, assumptions
from .records import Analysis, TowerAnalyses, build_analysis


def analyze(
    source: Any = None,
    options: AnalysisOptions | Mapping[str, Any] | None = None,
    *,
    config: dict | None = None,
    progress: "bool | Callable[[int, int], None] | None" = None,
    stream: bool = False,
    disk_budget: int | str | None = None,
    **overrides,
) -> Analysis:
    """Analyse a checkpoint: every spectral quantity and every registered bound.

    Parameters
    ----------
    source : path, str, torch.nn.Module or state dict, optional
        A Hugging Face model folder (safetensors single or sharded, ``pytorch_model.bin``, ONNX), a
        weights file with config.json beside it, a hub id resolved from the local Hugging Face cache
        (``org/name[@revision]``), or an in-memory model / state dict.  None: the embedded default
        checkpoint (all-MiniLM-L6-v2).  A PEFT LoRA adapter folder is analysed merged into its base
        (option ``base``, default the base the adapter names), with ``W - W0`` measured from the base.
    options : AnalysisOptions or mapping, optional
        How to analyse (see :class:`~specbound.options.AnalysisOptions` for every option and its
        default); ``overrides`` are option names as keywords (``analyze(path, grid_m=20, jobs=2)``).
    config : dict, optional
        config.json contents, for a bare state dict (a module's ``.config`` is used otherwise).
    progress : bool or callable(done, total), optional
        True: a layers progress bar (tqdm); a callable is called after each layer.
    stream : bool, optional
        A hub id not in the local cache is read by HTTP range requests (each shard's header, then
        each tensor when its layer is analysed), never downloaded: disk use none, memory a layer.
    disk_budget : int or str, optional
        Bytes (``20GB``, ``500MiB``): a hub id not in the cache whose weights exceed it is streamed
        instead of downloaded, with a warning (default: the free space of the cache's filesystem).

    Returns
    -------
    Analysis, or TowerAnalyses
        A two-tower model (CLIP, SigLIP) analysed without ``tower``: each tower's :class:`Analysis`,
        by tower name (:class:`~specbound.records.TowerAnalyses`).
    """
    opts = AnalysisOptions.build(options, **overrides)
    models = open_models(
        default_checkpoint() if source is None else source,
        arch_spec=opts.arch_spec,
        config=config,
        tower=opts.tower,
        stream=stream,
        disk_budget=disk_budget,
        base=opts.base,
    )
    name = f"{DEFAULT_NAME} (embedded default)" if source is None else None
    try:
        for model in models:  # an activation without a known constant: refused before any weight is read
            activation_constants(model.dims, opts)
        if models[0].tower is None or opts.tower is not None or len(models) == 1:  # one chain (Kimi's text)
            return _analyze_one(models[0], opts, progress, name)
        total, done = sum(m.dims.L for m in models), 0
        bar, on_layer = _progress_callback(progress)
        results = {}
        try:
            for model in models:  # one bar over both towers' layers
                tick = None if on_layer is None else (lambda d, _, before=done: on_layer(before + d, total))
                results[model.tower] = _analyze_one(model, opts, tick, name)
                done += model.dims.L
        finally:
            if bar is not None:
                bar.close()
        return TowerAnalyses(results)
    finally:
        for opened in {id(m.opened_checkpoint): m.opened_checkpoint for m in models}.values():
            opened.close()


def _analyze_one(model: OpenModel, opts: AnalysisOptions, progress, name: str | None) -> Analysis:
    """:func:`analyze` of one opened chain (one tower of a two-tower model)."""
    init_model = open_init(opts.init, model) if opts.init is not None else adapter_base(model)
    jobs = opts.jobs if opts.jobs != "auto" else auto_jobs(model, readers=1 if init_model is None else 2)
    threads = cap_threads(opts.threads)
    if threads is None:  # the layers use the cores, not BLAS: its threads spin when a core is busy
        threads = 1  # (17.6 s against 1.0 s on a loaded 2-core machine; docs/benchmarks.md)
    bar, on_layer = _progress_callback(progress)
    try:
        with threadpool_limits(limits=threads), _torch_threads(opts.device, threads):
            layers, deltas = all_layer_spectra(model, init_model, opts.kernel, jobs=jobs, progress=on_layer)
            model.ckpt.close()
            if init_model is not None:
                init_model.opened_checkpoint.close()
            return assemble(
                model, layers, opts, init=(init_model, deltas) if init_model is not None else None, name=name
            )
    finally:
        if bar is not None:
            bar.close()


@contextmanager
def _torch_threads(device: str, threads: int | None):
    """torch's own thread count for a torch ``device`` (checked usable first: a missing GPU is an
    error before any weight is read); restored afterwards."""
    if device == "numpy":
        yield
        return
    torch_device(device)
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tqdm_class():
    """tqdm's notebook bar where it can draw (ipywidgets installed), else its text bar, which a
    notebook shows as well; ``tqdm.auto`` alone warns "IProgress not found" in a notebook
    without ipywidgets."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm


class LayersBar:
    """A progress callback ``(done, total)`` drawing a tqdm bar of the layers on stderr (``enabled``:
    whether it shows).  The bar is made at the first call (``done=0``, before any layer), so it shows
    its total from the start; :meth:`close` ends it."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.bar = enabled, None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = tqdm_class()(
                desc="layers",
                unit="layer",
                total=total,
                file=sys.stderr,
                dynamic_ncols=True,
                disable=not self.enabled,
                mininterval=0,
            )
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress_callback(progress):
    """``(bar, callback)`` for ``analyze``'s ``progress`` (True: a :class:`LayersBar`)."""
    if progress is True:
        on_layer = LayersBar()
        return on_layer, on_layer
    if progress is None or progress is False:
        return None, None
    if not callable(progress):
        raise SpecboundError(f"progress must be True, False or a callable(done, total), got {progress!r}")
    return None, progress


@dataclass
class OpenModel:
    """A checkpoint opened and accounted for: what every per-layer step needs.

    Attributes
    ----------
    ckpt : Checkpoint
    spec : ArchSpec
    dims : ModelDims
    prefix : str
        The tensor-name prefix (``""``, ``"bert."``, ...).
    rotary : RotaryLayout or None
        The rotary position embedding of a rotary family (read from config.json), else None; the
        first rotating layer's when layers differ (:attr:`rotary_by_layer`).
    rotary_by_layer : tuple of RotaryLayout or None, optional
        Each layer's layout (Gemma 3's local and global layers rotate at different bases), None at a
        layer without rotary positions (NoPE); None: every layer uses :attr:`rotary`.
    """

    ckpt: Checkpoint
    spec: ArchSpec
    dims: ModelDims
    prefix: str
    rotary: RotaryLayout | None = None
    rotary_by_layer: tuple[RotaryLayout | None, ...] | None = None
    tower: str | None = None  # the tower this chain is, of a two-tower model (CLIP, SigLIP)
    parent_spec: ArchSpec | None = None  # the two-tower spec the tower was opened through
    # what the opening adds to the reader's notes (the text model of a GGUF pair: its mmproj file)
    opened_notes: Mapping[str, str] = field(default_factory=dict)

    @property
    def opened_checkpoint(self) -> Checkpoint:
        """The checkpoint as opened (a quantized or LoRA wrapper included), which closes it: a tower's ``ckpt``
        is a view of it that does not close it."""
        return self.ckpt.shared if isinstance(self.ckpt, TowerView) else self.ckpt

    def layer_dims(self, layer: int) -> ModelDims:
        """The dimensions of layer ``layer``'s own chain: its stack's in an encoder-decoder."""
        part, _ = self.dims.locate(layer)
        return self.dims if part is None else part.dims

    @property
    def notes(self) -> dict[str, str]:
        """Every note of this model: its reader's (:attr:`~specbound.io.base.ReaderFacts.notes`, which every
        wrapper forwards) and the opening's."""
        return {**self.ckpt.facts.notes, **self.opened_notes}

    def rotary_for(self, layer: int) -> RotaryLayout | None:
        """The rotary layout of layer ``layer`` (None for a family without rotary positions)."""
        return self.rotary if self.rotary_by_layer is None else self.rotary_by_layer[layer]

    def rotary_layouts(self) -> list[RotaryLayout]:
        """The distinct layouts, in layer order (one for most models)."""
        if self.rotary_by_layer is None:
            return [] if self.rotary is None else [self.rotary]
        return [r for r in dict.fromkeys(self.rotary_by_layer) if r is not None]

    def nope_layers(self) -> list[int]:
        """The layers without rotary positions of a model whose other layers rotate (NoPE)."""
        return [] if self.rotary_by_layer is None else [l for l, r in enumerate(self.rotary_by_layer) if r is None]


def open_model(
    source: Any,
    *,
    arch_spec: str | Path | ArchSpec | None = None,
    config: dict | None = None,
    tower: str | None = None,
    base: Any = None,
) -> OpenModel:
    """Open ``source``, pick its family spec, read its dimensions and account for every tensor.

    Only config.json and the tensor headers are read; no weight is loaded yet.  A two-tower model
    needs ``tower`` (``"text"`` or ``"vision"``): one opened model is one chain.
    """
    models = open_models(source, arch_spec=arch_spec, config=config, tower=tower, base=base)
    if len(models) > 1:
        models[0].opened_checkpoint.close()
        raise SpecboundError(
            f"{models[0].ckpt.location} holds the {' and '.join(m.tower for m in models)} towers of a "
            f"two-tower {models[0].parent_spec.family} model; pass tower='text' or tower='vision' "
            f"(--tower) to analyse one"
        )
    return models[0]


def open_models(
    source: Any,
    *,
    arch_spec: str | Path | ArchSpec | None = None,
    config: dict | None = None,
    tower: str | None = None,
    stream: bool = False,
    disk_budget: int | str | None = None,
    base: Any = None,
) -> list[OpenModel]:
    """:func:`open_model`, every tower of a two-tower model (or the one named ``tower``) opened as a
    chain of its own on the one checkpoint; one chain for any other model (``stream``,
    ``disk_budget``: how a hub id is read, :func:`~specbound.io.open_checkpoint`; ``base``: a LoRA
    adapter's base model)."""
    pair = gguf_pair(source)  # a folder holding a text GGUF and its mmproj file: the text and vision towers
    if pair is not None:
        return _gguf_pair_models(pair, arch_spec, tower)
    # complete_config: an ONNX export without config.json
    ckpt, _ = complete_config(open_checkpoint(source, config, stream=stream, disk_budget=disk_budget, base=base))
    try:
        spec = _resolve_spec(arch_spec, ckpt.config, tower).for_config(ckpt.config)
        if isinstance(ckpt, LoraCheckpoint):  # square updates oriented by their module's kind, as PEFT does
            ckpt.use_layouts(stored_in_out(spec))
        if spec.towers is None:
            _check_tower(spec, tower, ckpt)
            return [_bound(spec, ckpt)]
        views = tower_views(spec, ckpt, tower)
        if not views:  # a spec of fewer towers than the options name (an mmproj file: the vision tower alone)
            held = " and ".join(t.name for t in spec.towers)
            raise SpecboundError(
                f"{ckpt.location} holds only the {held} tower of a {spec.family} model, not the "
                f"{tower} tower; leave tower out or pass tower={spec.towers[0].name!r}"
            )
        return [_open_tower(t, view, spec) for t, view in views]
    except BaseException:
        ckpt.close()
        raise


def _gguf_pair_models(pair: dict[str, Path], arch_spec: Any, tower: str | None) -> list[OpenModel]:
    """The text GGUF model and its mmproj file (:func:`~.io.gguf_mmproj.gguf_pair`) opened as the text and
    vision towers of one model, or the one named ``tower``."""
    if arch_spec is not None:
        raise SpecboundError(
            f"--arch-spec names one chain's family, but {pair['text'].parent} holds a text GGUF and "
            f"its mmproj file; analyse the file itself: specbound analyze {pair['text']} "
            f"--arch-spec ..."
        )
    models: list[OpenModel] = []
    try:
        for name, path in pair.items():
            if tower in (None, name):
                (model,) = open_models(path, tower=None if name == "text" else name)
                models.append(replace(model, tower=name, opened_notes=pair_notes(pair) if name == "text" else {}))
    except BaseException:
        for model in models:
            model.opened_checkpoint.close()
        raise
    return models


def _open_tower(tower: TowerSpec, view, parent: ArchSpec) -> OpenModel:
    """One tower bound to its view; an error of a wrapper's tower (a family named by reference) says which
    tower and config section it is about."""
    try:
        return _bound(tower_spec(tower, view.config), view, parent=parent)
    except SpecboundError as exc:
        if tower.family is None or str(exc).startswith(f"the {tower.name} tower"):
            raise
        raise SpecboundError(
            f"the {tower.name} tower ({' or '.join(tower.config_sections)} of config.json): {exc}"
        ) from None


def _check_tower(spec: ArchSpec, tower: str | None, ckpt) -> None:
    """``tower`` asked of a checkpoint that is not a two-tower model: right only for a checkpoint
    holding that one tower (CLIPTextModel: ``text``)."""
    if tower is None or tower == spec.tower:
        return
    if spec.tower is None:
        raise SpecboundError(
            f"tower={tower!r} (--tower) picks a tower of a two-tower model (CLIP, SigLIP); "
            f"{ckpt.location} is a {spec.family} checkpoint, one chain: leave tower out"
        )
    raise SpecboundError(
        f"{ckpt.location} holds only the {spec.tower} tower of a {spec.family} model, not the "
        f"{tower} tower; leave tower out or pass tower={spec.tower!r}"
    )


def _config_where(ckpt) -> str:
    """Where a checkpoint's config values come from, for messages."""
    path = ckpt.facts.config_path
    return f"the config of {ckpt.location}" if path is None else str(path)


def _bound(spec: ArchSpec, ckpt, *, parent: ArchSpec | None = None) -> OpenModel:
    """``ckpt`` bound to ``spec``: dimensions, prefix, every tensor accounted for, rotary layout."""
    dims, prefix = bind(spec, ckpt)
    if spec.qk_norm is not None:
        qk_norm_eps(spec, ckpt.config)  # a missing or zero eps is an error before any weight is read
    extra = {"tower": spec.tower, "parent_spec": parent}
    # the structure's config values (windows, soft-caps, scalars) checked before any weight is read
    model_structure(spec.structure, ckpt.config, _config_where(ckpt))
    # latent attention reads its rotary key's settings itself (archs/latent.py): its bounds hold for every rotation
    layouts = None if spec.latent else rotary_layouts(spec, ckpt.config, dims.d_head, dims.L, where=str(ckpt.location))
    if layouts is None:
        return OpenModel(ckpt, spec, dims, prefix, **extra)
    first = next(r for r in layouts if r is not None)  # a NoPE layer's is None (archs/rotary.nope_flags)
    return OpenModel(ckpt, spec, dims, prefix, first, None if len(set(layouts)) == 1 else layouts, **extra)


def model_layer_spectra(
    model: OpenModel, layer: int, kernel: KernelOptions, *, prefetch: bool = False, weights: LayerWeights | None = None
) -> LayerSpectra:
    """Read layer ``layer`` of an opened model and compute its spectra as ``kernel`` says.

    Independent of every other layer, so a sweep can run the layers of a large model as separate
    tasks and :func:`assemble` the results.  The attention factors are released before the
    feed-forward matrices are read, one by one (``prefetch``: each read while the previous one's
    spectrum is computed, two alive at once).  ``weights``: the layer's weights when already read
    (:func:`all_layer_spectra` reads the next layer ahead).
    """
    if weights is None:
        weights = read_layer(model, layer)
    dims = model.layer_dims(layer)
    return layer_spectra(
        weights,
        kernel,
        group=dims.H // dims.H_kv,
        block=dims.block,
        release=True,
        rotary=model.rotary_for(layer),
        prefetch=prefetch,
        position_terms=dims.position_terms,
    )


def read_layer(model: OpenModel, layer: int) -> LayerWeights:
    """Layer ``layer``'s attention factors, read now, and its feed-forward matrices, read lazily."""
    return read_layer_weights(model.spec, model.ckpt, model.dims, model.prefix, layer)


def all_layer_spectra(
    model: OpenModel,
    init_model: OpenModel | None,
    kernel: KernelOptions,
    *,
    jobs: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[LayerSpectra], list[LayerSpectra]]:
    """Every layer's spectra (and, with ``init_model``, those of ``W - W0``), ``jobs`` layers at a time,
    computed as ``kernel`` says.

    Layers are independent: with ``jobs > 1`` they run in a thread pool (the linear algebra
    releases the GIL; tensor reads are serialised) and the results, in layer order, are the same
    numbers as one at a time.  Memory grows with ``jobs``: that many layers are alive at once.
    Shared weights (ALBERT) are computed once per stored layer and reused.

    One layer at a time (``jobs=1``), reading overlaps computing: a reader thread reads the next
    layer's attention factors, and each feed-forward matrix after the first, while the current one's
    spectra are computed (peak memory: the next layer's attention factors and one more feed-forward
    matrix).  With ``jobs > 1`` the layers' own reads and computations already interleave.
    """
    dims = model.dims
    source = computed_layer_of(dims, shared=init_model is None)
    todo = sorted(set(source))
    users = Counter(source)

    def one(layer: int, weights: LayerWeights | None = None) -> tuple[LayerSpectra, LayerSpectra | None]:
        delta = _difference_spectra(model, init_model, layer, kernel) if init_model is not None else None
        return model_layer_spectra(model, layer, kernel, prefetch=overlap, weights=weights), delta

    done: dict[int, tuple[LayerSpectra, LayerSpectra | None]] = {}
    covered = 0
    if progress:  # the total before the first layer: a bar shows 0/L, not 0/?
        progress(0, dims.L)

    def record(layer: int, result) -> None:
        nonlocal covered
        done[layer] = result
        covered += users[layer]
        if progress:
            progress(covered, dims.L)

    overlap = jobs <= 1 or len(todo) <= 1
    if overlap:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specbound-read") as reader:
            ahead = reader.submit(read_layer, model, todo[0]) if todo else None
            for position, layer in enumerate(todo):
                weights = ahead.result()
                ahead = reader.submit(read_layer, model, todo[position + 1]) if position + 1 < len(todo) else None
                record(layer, one(layer, weights))
                del weights
    else:
        pool = ThreadPoolExecutor(max_workers=min(jobs, len(todo)), thread_name_prefix="specbound-layer")
        try:
            futures = {pool.submit(one, layer): layer for layer in todo}
            for future in as_completed(futures):
                record(futures[future], future.result())  # the first failure is raised here
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    layers = [replace(done[source[layer]][0], layer=layer) for layer in range(dims.L)]
    deltas = [done[layer][1] for layer in todo] if init_model is not None else []
    return layers, deltas


def computed_layer_of(dims: ModelDims, *, shared: bool = True) -> list[int]:
    """For every depth, the layer whose spectra it uses: the first depth with the same stored
    weights (ALBERT) when ``shared``, else itself (``init``: every depth has its own ``W - W0``)."""
    first: dict[int, int] = {}
    return [first.setdefault(dims.stored_layer(l) if shared else l, l) for l in range(dims.L)]


# Peak memory of one layer in flight, in units of the layer's float64 weights.  A layer holds its
# attention factors, then one feed-forward matrix and two n x n Gram buffers, never all at once:
# the LLaMA-shaped benchmark peaks at 746 MB for the whole process against 1.35 GB of float64
# weights a layer, so 1 leaves room for the interpreter and the tables.
_LAYER_PEAK_FACTOR = 1


def layer_float64_bytes(dims: ModelDims) -> int:
    """Bytes of one layer's attention and feed-forward weights upcast to float64."""
    attention = 2 * dims.N * dims.d_head * (dims.H + dims.H_kv)
    if dims.latent is not None:
        attention = dims.latent.attention_parameters(dims.N, dims.H)
    if dims.stacks is not None and any(part.cross for part in dims.stacks):  # a decoder layer: two attentions
        attention *= 2
    feed_forward = dims.ff_parameters
    return 8 * (attention + feed_forward)


def auto_jobs(model: OpenModel, *, readers: int = 1) -> int:
    """Layers at a time for ``jobs="auto"``: one per core, no more than the layers to compute,
    and no more than half the available memory holds (``_LAYER_PEAK_FACTOR`` times a layer's
    float64 weights each, twice that with ``init`` (``readers=2``))."""
    dims = model.dims
    layers = len(set(computed_layer_of(dims, shared=readers == 1)))
    per_job = _LAYER_PEAK_FACTOR * readers * layer_float64_bytes(dims)
    free = available_memory()
    by_memory = max(1, int(0.5 * free // per_job)) if free is not None and per_job > 0 else layers
    return max(1, min(available_cores(), layers, by_memory))


def cap_threads(threads: int | None) -> int | None:
    """``threads`` BLAS threads, at most the cores (more only thrash; docs/benchmarks.md); capping is
    said in a :class:`~specbound.errors.SpecboundWarning`."""
    cores = available_cores()
    if threads is not None and threads > cores:
        warnings.warn(
            SpecboundWarning(f"{threads} threads capped at the {cores} core(s) this process may use"), stacklevel=3
        )
        return cores
    return threads


def available_cores() -> int:
    """CPU cores this process may use: the CPUs it may run on (``os.sched_getaffinity``), at most
    its cgroup's CPU quota rounded up (a container given 2 CPUs of a 64-core host: 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, cores if quota is None else min(cores, math.ceil(quota)))


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the cgroup quota allows (quota / period), or None without one: cgroup v2's ``cpu.max``
    (``"200000 100000"``; ``"max 100000"`` is none), else cgroup v1's ``cpu/cpu.cfs_quota_us`` and
    ``cpu/cpu.cfs_period_us`` (a quota of -1 is none).  Unreadable or malformed files: None."""

    def read(name: str) -> list[str] | None:
        try:
            return (root / name).read_text().split()
        except (OSError, UnicodeDecodeError):
            return None

    v2, v1 = read("cpu.max"), (read("cpu/cpu.cfs_quota_us"), read("cpu/cpu.cfs_period_us"))
    quota, period = v2 if v2 is not None and len(v2) == 2 else (v1[0][0], v1[1][0]) if v1[0] and v1[1] else (None, None)
    try:
        quota, period = float(quota), float(period)
    except (TypeError, ValueError):  # "max", or nothing readable
        return None
    return quota / period if quota > 0 and period > 0 and math.isfinite(quota / period) else None


def _difference_spectra(model: OpenModel, init_model: OpenModel, layer: int, kernel: KernelOptions) -> LayerSpectra:
    """Spectra of layer ``layer``'s ``W - W0`` (``--init``); a rotary head's at every offset, as the model's."""
    rotary = model.rotary_for(layer)
    a = 1.0 if rotary is None else rotary.attention_factor  # the logit's factors, as for W itself
    raw, raw0 = read_layer(model, layer), read_layer(init_model, layer)
    dims = model.layer_dims(layer)
    group = dims.H // dims.H_kv
    updates = adapter_updates(model, init_model, layer, kernel)
    if raw.latent is not None:  # latent attention: each block of the rows minus its initial value
        if updates is not None:
            raise SpecboundError(
                "a LoRA adapter on a multi-head latent attention model is not supported: merge it "
                "and pass the base with --init"
            )
        return LayerSpectra(layer, *latent_difference_spectra(raw, raw0, kernel), dims.block)
    weights, w0 = logit_factors(raw, a), logit_factors(raw0, a)
    if updates is not None:  # a LoRA adapter on its base: W - W0 from the factors (docs/theory.md 3k)
        delta = update_difference_spectra(raw, raw0, updates, group=group, block=dims.block, attention_factor=a)
    else:
        delta = difference_spectra(weights, w0, kernel, group=group, block=dims.block)
    if rotary is None or raw.qk_norm is not None or raw.latent is not None:  # rotation-free rows (theory 3d, 3l)
        return delta
    return replace(
        delta,
        qk=rotary_difference_spectra(
            weights,
            w0,
            rotary,
            group=group,
            rank_tol=kernel.rank_tol,
            updates=None if updates is None else updates.heads,
        ),
    )


def adapter_base(model: OpenModel) -> OpenModel | None:
    """The base model of a LoRA adapter, opened as ``model``'s initial weights (the same family spec and
    tower, the checkpoint the adapter is merged into); None for any other checkpoint."""
    ckpt = model.opened_checkpoint
    if not isinstance(ckpt, LoraCheckpoint):
        return None
    if model.tower is None:
        return _bound(model.spec, ckpt.base_ckpt)
    ((_, view),) = tower_views(model.parent_spec, ckpt.base_ckpt, model.tower)
    return _bound(model.spec, view, parent=model.parent_spec)


def adapter_updates(model: OpenModel, init_model: OpenModel, layer: int, kernel: KernelOptions):
    """Layer ``layer``'s updates as factors when ``model`` is a LoRA adapter and ``init_model`` its own
    base (not a ``--init`` of other weights), the method is factored and no tensor of the layer is
    replaced whole (``modules_to_save``); None otherwise (the differences come from the weights)."""
    ckpt = model.opened_checkpoint
    if (
        kernel.method != "factored"
        or not isinstance(ckpt, LoraCheckpoint)
        or init_model.opened_checkpoint is not ckpt.base_ckpt
    ):
        return None
    try:
        return read_layer_updates(model.spec, model.ckpt, model.dims, model.prefix, layer)
    except DenseUpdate:
        return None


def assemble(
    model: OpenModel,
    layers: list[LayerSpectra],
    options: AnalysisOptions | None = None,
    *,
    init: tuple[OpenModel, list[LayerSpectra]] | None = None,
    name: str | None = None,
) -> Analysis:
    """Propagation factors, every registered bound and the records, from all layers' spectra
    (``init``: the initial-weights model and the spectra of ``W - W0``; ``name``: the analysis'
    ``source``, default where the weights were read from)."""
    opts = options or AnalysisOptions()
    dims = model.dims
    l_phi, l_phi_source = activation_constants(dims, opts)
    grid_m = default_grid_m(dims.L, dims.N) if opts.grid_m is None else opts.grid_m
    measures = measure(layers, dims, l_phi=l_phi, rank_tol=opts.rank_tol, grid_m=grid_m)
    results = compute_all(measures)
    from_init = None
    if init is not None:
        init_measures = measures.measured_from(init[1])
        from_init = (init_measures, compute_all(init_measures, only_distance=True))
    recorded = {
        "grid_m": measures.grid_m,
        "rank_tol": opts.rank_tol,
        "l_phi": l_phi,
        "l_phi_source": l_phi_source,
        "method": opts.method,
        "gram_rtol": opts.gram_rtol if opts.method == "factored" else 0.0,
    }
    if init is not None:
        recorded["init"] = str(init[0].ckpt.location)

    gap = None
    gap_params = GapParameters.from_options(opts)
    if gap_params is not None:
        gap = describe(gap_params)
        gap["bounds"] = gap_bounds(measures, results, gap_params)
        if from_init is not None:
            gap["from_init"] = gap_bounds(from_init[0], from_init[1], gap_params)
    location = str(model.ckpt.location)
    model_extra: dict[str, Any] = {"block": dims.block, "feed_forward": dims.feed_forward}
    if isinstance(model.opened_checkpoint, LoraCheckpoint):  # the adapter merged into the base (W0 when init)
        model_extra["adapter"] = model.opened_checkpoint.describe()
    sentence = model.ckpt.facts.sentence_modules
    if sentence is not None and sentence.after:  # sentence-transformers' Pooling, Dense, Normalize after the model
        model_extra["modules"] = modules_record(sentence, opts.rank_tol)
    rotary = (
        None
        if model.rotary is None
        else {
            "rotary_dim": model.rotary.rotary_dim,
            "pairing": model.rotary.pairing,
            "base": model.rotary.base,
            "max_positions": None if model.rotary.max_positions == UNBOUNDED_POSITIONS else model.rotary.max_positions,
            "scaling": model.rotary.scaling,
            "attention_factor": model.rotary.attention_factor,
            "qk_spectral_norm": qk_spectral_norm_counts(layers),
        }
    )
    if model.rotary is not None and "mrope" in model.spec.rotary_options:  # M-RoPE (docs/rotary.md section 7)
        rotary["mrope"] = {
            "kind": model.spec.rotary_options["mrope"]["kind"],
            "axes": list(model.rotary.axes),
            "grid": None if model.rotary.grid is None else list(model.rotary.grid),
        }
    elif model.rotary is not None and model.rotary.axes is not None:  # a vision tower's 2D grid (docs/rotary.md 9)
        rotary["grid"] = _grid_record(model.rotary)
    qk_norm = _qk_norm_summary(model, layers)
    if qk_norm is not None:
        model_extra["qk_norm"] = qk_norm
    if dims.latent is not None:
        model_extra["latent_attention"] = _latent_summary(dims, layers)
    if model.rotary_by_layer is not None:  # layers of several kinds: each one's settings
        rotary["by_layer"] = [
            None
            if r is None
            # a NoPE layer: no rotation
            else {
                "base": r.base,
                "scaling": r.scaling,
                "attention_factor": r.attention_factor,
                **({} if r.axes is None or "mrope" in model.spec.rotary_options else {"grid": _grid_record(r)}),
            }
            for r in model.rotary_by_layer
        ]
    model_extra["rotary"] = rotary
    if dims.position_terms:
        model_extra["position_terms"] = dims.position_terms
    if dims.stacks is not None:
        model_extra["stacks"] = stacks_record(dims)
    if model.tower is not None:
        model_extra["tower"] = model.tower
    if model.parent_spec is not None and model.parent_spec.projector is not None:  # a vision-language wrapper's
        model_extra["wrapper"] = model.parent_spec.family
    source = name or model.ckpt.facts.hub_source or location  # a hub id: ORG/NAME@commit
    context = AssumptionContext(
        dims,
        rotary=model.rotary is not None,
        gap=gap_params is not None,
        notes=model.notes,
        l_phi=l_phi,
        l_phi_source=l_phi_source,
        rotary_methods=None if rotary is None else rotary["qk_spectral_norm"],
        rope=tuple(model.rotary_layouts()),
        qk_norm=qk_norm,
        structure=model_structure(model.spec.structure, model.ckpt.config, _config_where(model.ckpt)),
        tower=model.tower,
        nope_layers=tuple(model.nope_layers()),
        modules=model_extra.get("modules"),
        wrapper=model.parent_spec,
    )
    return build_analysis(
        source,
        model.spec.family,
        measures,
        results,
        recorded,
        from_init=from_init,
        gap=gap,
        location=location,
        tensors=tensor_names(model.spec, dims, model.prefix),
        model_extra={**model_extra, **_structure_extra(model)},
        assumptions=assumptions(context),
    )


def _grid_record(layout) -> dict[str, Any]:
    """A 2D rotary layout's grid in the JSON: its rows and columns (null on an axis the config does not bound)
    and whether a class token sits before it (Llama 4)."""
    rows, cols = (None if g == UNBOUNDED_POSITIONS else g for g in layout.grid)
    return {"rows": rows, "columns": cols, "class_token": layout.grid_origin}


def qk_spectral_norm_counts(layers: list[LayerSpectra]) -> dict[str, int]:
    """How many rotary QK heads got the exact maximum over offsets and how many the product bound
    ``||W_Q||_2 ||W_K||_2`` (each head's own in the ``sv_method`` and ``argmax_offset`` columns)."""
    counts = Counter(s.sv_method for layer in layers for s in layer.qk)
    return {method: counts.get(name, 0) for method, name in ROTARY_METHODS.items()}


def activation_constants(dims: ModelDims, options: AnalysisOptions) -> tuple[float, str]:
    """``(L_phi, where it came from)``: ``options.l_phi`` (``"user"``) or the activation table, which
    refuses an activation it does not know (one line naming ``--l-phi``); a gated block whose
    activation has no ``c_phi`` is refused either way."""
    check_gated_activation(dims.activation, dims.feed_forward)
    if options.l_phi is not None:
        return options.l_phi, "user"
    return activation_lipschitz(dims.activation)


def _qk_norm_summary(model: OpenModel, layers: list[LayerSpectra]) -> dict[str, Any] | None:
    """The query/key normalisation of a QK-norm family and its largest logit Lipschitz factor (the
    QK rows' ``lipschitz_factor``, docs/theory.md 3d), for ``model["qk_norm"]`` and the assumptions."""
    rule = model.spec.qk_norm
    if rule is None:
        return None
    factor, layer, head = max((s.lipschitz_factor, l.layer, h) for l in layers for h, s in enumerate(l.qk))
    return {
        "span": rule.span,
        "gain": rule.gain,
        "eps": qk_norm_eps(model.spec, model.ckpt.config),
        **({} if rule.layers == "all" else {"layers": rule.layers}),
        "max_factor": factor,
        "layer": layer,
        "head": head,
    }


def _latent_summary(dims: ModelDims, layers: list[LayerSpectra]) -> dict[str, Any]:
    """Multi-head latent attention's dimensions, scales and largest logit factor (the QK rows'
    ``lipschitz_factor``, docs/theory.md 3l), for ``model["latent_attention"]``."""
    lat = dims.latent
    factor, layer, head = max((s.lipschitz_factor, l.layer, h) for l in layers for h, s in enumerate(l.qk))
    return {
        "q_rank": lat.q_rank,
        "kv_rank": lat.kv_rank,
        "d_nope": lat.d_nope,
        "d_rope": lat.d_rope,
        "d_v": lat.d_v,
        "logit_scale": lat.logit_scale,
        "rope_factor": lat.rope_factor,
        "eps": lat.kv_eps,
        "max_factor": factor,
        "layer": layer,
        "head": head,
    }


def _structure_extra(model: OpenModel) -> dict[str, Any]:
    """The records' model entries for structure only some families have: ``alibi`` (ALiBi position
    biases) and ``experts`` (a mixture of experts: counts, widths, the router and shared-expert gate
    tensors of the first layer holding experts, read and shape-checked but not analysed as matrices, the
    gate bounds and the dense layers between the mixtures: docs/theory.md 3f)."""
    dims, spec = model.dims, model.spec
    extra: dict[str, Any] = {"alibi": True} if dims.alibi else {}
    if dims.moe is not None:
        gate = spec.experts.shared_gate
        extra["experts"] = {
            "experts": dims.moe.experts,
            "top_k": dims.moe.top_k,
            "d_ff": dims.d_ff,
            "shared_d_ff": dims.moe.shared_d_ff,
            **({} if dims.moe.layers is None else {"layers": list(dims.moe.layers), "dense_d_ff": dims.moe.dense_d_ff}),
            **({} if dims.moe.gate_sum == 1 else {"gate_sum": dims.moe.gate_sum}),
            **({} if dims.moe.gate_max == 1 else {"gate_max": dims.moe.gate_max}),
            **({} if dims.moe.scoring == "softmax" else {"scoring": dims.moe.scoring}),
            "router": None
            if dims.moe.layers == ()
            else spec.experts.router.name_for(next(l for l in range(dims.L) if dims.routed(l)), model.prefix),
            "shared_gate": None if gate is None else gate.name_for(0, model.prefix),
        }
    return extra


def open_init(init, model: OpenModel) -> OpenModel:
    """The initial-weights checkpoint ``init`` (``--init``), checked to have ``model``'s architecture
    (the same family spec and dimensions; a tower of a two-tower model: the same tower)."""
    init_model = open_model(init, arch_spec=model.parent_spec or model.spec, tower=model.tower)
    if init_model.dims != model.dims:
        init_model.opened_checkpoint.close()
        raise SpecboundError(
            f"the initial weights in {init_model.ckpt.location} do not match the analysed checkpoint: "
            f"{init_model.dims} vs {model.dims}; pass the same architecture's initialisation"
        )
    return init_model


def _resolve_spec(arch_spec, config, tower: str | None = None) -> ArchSpec:
    if arch_spec is None:
        return spec_for_config(config, tower)
    if isinstance(arch_spec, ArchSpec):
        return arch_spec
    return load_spec_file(arch_spec)


def modules_record(modules: SentenceModules, rank_tol: float) -> list[dict[str, Any]]:
    """``model.modules``: each module after the Transformer, a Dense layer's matrix ``W^T`` (``in x out``, row-vector
    orientation) with its norms and rank and its activation's Lipschitz constant (None: not in the table)."""
    out = []
    for m in modules.after:
        entry: dict[str, Any] = {"path": m.path, "type": m.kind}
        if m.kind == "Pooling":
            entry["modes"] = list(m.modes)
        if m.weight is not None:
            s = dense_spectrum(np.ascontiguousarray(m.weight.T))
            name, lipschitz = DENSE_ACTIVATIONS.get(m.activation, (m.activation, None))
            entry.update(
                {
                    "in_features": int(m.weight.shape[1]),
                    "out_features": int(m.weight.shape[0]),
                    "activation": name,
                    "activation_lipschitz": lipschitz,
                    "bias": m.bias,
                    "spectral_norm": s.spectral_norm,
                    "frobenius_norm": s.frobenius_norm,
                    "nuclear_norm": s.nuclear_norm(rank_tol),
                    "rank": numerical_rank(s.singular_values, s.dim, rank_tol),
                }
            )
        out.append(entry)
    return out
