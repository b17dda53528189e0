"""``analyze``: load -> extract -> spectra -> measures -> bounds -> records."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from .archspec import ArchSpec, load_spec_file, spec_for_config
from .bounds import compute_all
from .checkpoint import Checkpoint, open_checkpoint
from .defaults import default_checkpoint
from .distance import difference_spectra
from .errors import SpecboundError
from .extract import (LayerWeights, ModelDims, account_for_tensors, detect_prefix, infer_kv_heads,
                      layer_weights, model_dims)
from .gap import GapParameters, describe, gap_bounds
from .measures import LayerSpectra, measure
from .propagation import activation_lipschitz
from .records import Analysis, build_analysis
from .spectra import dense_spectrum, factored_spectra

METHODS = ("factored", "dense")
# Feed-forward singular values from the Gram matrix only when each is proven accurate to 1e-8
# relative (in practice they agree with the SVD to ~1e-14); see spectra.gram_singular_values.
DEFAULT_GRAM_RTOL = 1e-8


def attention_spectra(weights: LayerWeights, *, method: str = "factored", group: int = 1,
                      with_norm_1_1: bool = True) -> tuple[list, list]:
    """Spectra of one layer's per-head QK and OV matrices.

    ``method="factored"`` uses the ``d_h x d_h`` cores (SPEC section 1); ``"dense"`` materialises
    every ``N x N`` per-head product and runs a full SVD, as the paper's reference code does (the
    benchmark's baseline).  ``group`` is the number of query heads per key/value head.
    """
    kv = np.arange(weights.q.shape[0]) // group  # query head h uses key/value head h // group
    if method == "factored":
        return (factored_spectra(weights.q, weights.k, b_index=kv, with_norm_1_1=with_norm_1_1),
                factored_spectra(weights.v, weights.o, a_index=kv, with_norm_1_1=with_norm_1_1))
    if method == "dense":
        return ([dense_spectrum(weights.q[h].T @ weights.k[g]) for h, g in enumerate(kv)],
                [dense_spectrum(weights.v[g].T @ weights.o[h]) for h, g in enumerate(kv)])
    raise SpecboundError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def feed_forward_spectra(ff: Mapping[str, np.ndarray], *, gram_rtol: float = DEFAULT_GRAM_RTOL) -> dict:
    """Spectra of a layer's feed-forward matrices, the Gram path when its proven relative error is
    at most ``gram_rtol`` (0: always LAPACK's SVD).

    One matrix alive at a time: the (lazy) mapping is indexed inside the call rather than iterated
    by items, which would load the next matrix while the previous one is still referenced.
    """
    return {role: dense_spectrum(ff[role], gram_rtol=gram_rtol) for role in ff}


def layer_spectra(weights: LayerWeights, *, method: str = "factored", group: int = 1,
                  block: str = "sequential", with_norm_1_1: bool = True, gram_rtol: float = DEFAULT_GRAM_RTOL) -> LayerSpectra:
    """Spectra of one layer's QK/OV heads and feed-forward matrices (the dense method always uses
    the SVD for feed-forward too)."""
    qk, ov = attention_spectra(weights, method=method, group=group, with_norm_1_1=with_norm_1_1)
    ff = feed_forward_spectra(weights.ff, gram_rtol=0.0 if method == "dense" else gram_rtol)
    return LayerSpectra(weights.layer, qk, ov, ff, block)


def analyze(
    source: Any = None,
    *,
    config: dict | None = None,
    arch_spec: str | Path | ArchSpec | None = None,
    grid_m: int | None = None,
    rank_tol: float = 1e-10,
    l_phi: float | None = None,
    threads: int | None = None,
    method: str = "factored",
    gram_rtol: float = DEFAULT_GRAM_RTOL,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | str = 1,
    init: str | Path | None = None,
    n: int | None = None,
    margin: float | None = None,
    delta: float = 0.05,
    lead_constant: float = 1.0,
    confidence_constant: float = 1.0,
) -> Analysis:
    """Analyse a checkpoint: every spectral quantity and every registered bound.

    Parameters
    ----------
    source : path, str, torch.nn.Module or state dict, optional
        A Hugging Face model folder (safetensors single or sharded, or ``pytorch_model.bin``), a
        weights file with config.json beside it, a hub id resolved from the local Hugging Face cache
        (``org/name[@revision]``), or an in-memory model / state dict.  None: the embedded default
        checkpoint (all-MiniLM-L6-v2).
    config : dict, optional
        config.json contents, for a bare state dict (a module's ``.config`` is used otherwise).
    arch_spec : path or ArchSpec, optional
        A family spec file; by default chosen from config.json's ``model_type``.
    grid_m : int, optional
        Resolution of the Schatten grid; default ``ceil(L + ln N)`` (SPEC section 4).
    rank_tol : float
        Relative rank tolerance, ``tau = rank_tol * dim * max(s_1, 1)`` (SPEC section 2).
    l_phi : float, optional
        Activation Lipschitz constant; default from config.json's ``hidden_act`` (GELU: 1.13).
    threads : int, optional
        BLAS threads (threadpoolctl); None leaves the BLAS default (with ``jobs > 1``: the cores
        divided among the jobs).
    method : {"factored", "dense"}
        How QK/OV spectra are computed; ``"dense"`` is the slow reference (all SVDs).
    gram_rtol : float
        Largest proven relative error accepted from the feed-forward Gram path; 0 forces SVDs.
    progress : callable(done, total), optional
        Called after each layer.
    jobs : int or "auto"
        Layers analysed at once, in threads (default 1).  ``jobs=2`` on two cores roughly halves
        the time; the numbers are identical, and peak memory holds ``jobs`` layers.  ``"auto"``:
        :func:`auto_jobs` (every core, as memory allows; what the command line does by default).
    init : path, optional
        A checkpoint of the same architecture holding the initial weights ``W0``: every bound that
        has a norm of ``W - W0`` in it is also computed on the differences (``Analysis.from_init``).
    n, margin : int, float, optional
        Sample size and ramp-loss margin: given both, every bound with a margin-bound form becomes
        a generalisation-gap bound (SPEC section 7, ``Analysis.gap_bound``).
    delta : float
        Failure probability of the gap bound (default 0.05).
    lead_constant, confidence_constant : float
        The absolute constants of the gap bound's two terms, unstated by the sources (default 1).

    Returns
    -------
    Analysis
    """
    _check_options(grid_m, rank_tol, l_phi, threads, method, gram_rtol, jobs)
    gap_params = _gap_parameters(n, margin, delta, lead_constant, confidence_constant)
    from threadpoolctl import threadpool_limits

    model = open_model(default_checkpoint() if source is None else source, arch_spec=arch_spec, config=config)
    init_model = _open_init(init, model) if init is not None else None
    if jobs == "auto":
        jobs = auto_jobs(model, readers=1 if init_model is None else 2)
    if threads is None and jobs > 1:  # jobs x BLAS threads should not exceed the cores
        threads = max(1, available_cores() // jobs)
    with threadpool_limits(limits=threads):
        layers, deltas = all_layer_spectra(model, init_model, method=method, gram_rtol=gram_rtol, jobs=jobs,
                                           progress=progress)
        model.ckpt.close()
        if init_model is not None:
            init_model.ckpt.close()
        return assemble(model, layers, grid_m=grid_m, rank_tol=rank_tol, l_phi=l_phi, method=method,
                        gram_rtol=gram_rtol, init=(init_model, deltas) if init_model is not None else None,
                        gap_params=gap_params)


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
    """

    ckpt: Checkpoint
    spec: ArchSpec
    dims: ModelDims
    prefix: str


def open_model(source: Any, *, arch_spec: str | Path | ArchSpec | None = None,
               config: dict | None = None) -> OpenModel:
    """Open ``source``, pick its family spec, read its dimensions and account for every tensor.

    Only config.json and the tensor headers are read; no weight is loaded yet.
    """
    ckpt = open_checkpoint(source, config)
    spec = _resolve_spec(arch_spec, ckpt.config)
    dims = model_dims(spec, ckpt.config)
    prefix = detect_prefix(spec, ckpt)
    dims = infer_kv_heads(spec, ckpt, dims, prefix)
    account_for_tensors(spec, ckpt, dims, prefix)
    return OpenModel(ckpt, spec, dims, prefix)


def model_layer_spectra(model: OpenModel, layer: int, *, method: str = "factored",
                        gram_rtol: float = DEFAULT_GRAM_RTOL) -> LayerSpectra:
    """Read layer ``layer`` of an opened model and compute its spectra.

    Independent of every other layer, so a sweep can run the layers of a large model as separate
    tasks and :func:`assemble` the results.  One wide matrix is alive at a time: the attention
    factors are released before the feed-forward matrices are read, one by one.
    """
    weights = layer_weights(model.spec, model.ckpt, model.dims, model.prefix, layer)
    qk, ov = attention_spectra(weights, method=method, group=model.dims.H // model.dims.H_kv)
    ff_matrices = weights.ff
    del weights  # release the attention factors before the wide feed-forward matrices load
    ff = feed_forward_spectra(ff_matrices, gram_rtol=0.0 if method == "dense" else gram_rtol)
    return LayerSpectra(layer, qk, ov, ff, model.dims.block)


def all_layer_spectra(model: OpenModel, init_model: OpenModel | None = None, *, method: str = "factored",
                      gram_rtol: float = DEFAULT_GRAM_RTOL, jobs: int = 1,
                      progress: Callable[[int, int], None] | None = None
                      ) -> tuple[list[LayerSpectra], list[LayerSpectra]]:
    """Every layer's spectra (and, with ``init_model``, those of ``W - W0``), ``jobs`` layers at a time.

    Layers are independent: with ``jobs > 1`` they run in a thread pool (the linear algebra
    releases the GIL; tensor reads are serialised) and the results, in layer order, are the same
    numbers as one at a time.  Memory grows with ``jobs``: that many layers are alive at once.
    Shared weights (ALBERT) are computed once per stored layer and reused.
    """
    dims = model.dims
    source = computed_layer_of(dims, shared=init_model is None)
    todo = sorted(set(source))
    users = Counter(source)

    def one(layer: int) -> tuple[LayerSpectra, LayerSpectra | None]:
        delta = (_difference_spectra(model, init_model, layer, method=method)
                 if init_model is not None else None)
        return model_layer_spectra(model, layer, method=method, gram_rtol=gram_rtol), delta

    done: dict[int, tuple[LayerSpectra, LayerSpectra | None]] = {}
    covered = 0

    def record(layer: int, result) -> None:
        nonlocal covered
        done[layer] = result
        covered += users[layer]
        if progress:
            progress(covered, dims.L)

    if jobs <= 1 or len(todo) <= 1:
        for layer in todo:
            record(layer, one(layer))
    else:
        from concurrent.futures import ThreadPoolExecutor, as_completed

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
    feed_forward = (3 if dims.feed_forward == "gated" else 2) * dims.N * dims.d_ff
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


def available_memory() -> int | None:
    """Bytes of memory available to new work (``MemAvailable``), None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_cores() -> int:
    """CPU cores this process may run on."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _difference_spectra(model: OpenModel, init_model: OpenModel, layer: int, *, method: str) -> LayerSpectra:
    """Spectra of layer ``layer``'s ``W - W0`` (``--init``)."""
    weights = layer_weights(model.spec, model.ckpt, model.dims, model.prefix, layer)
    w0 = layer_weights(init_model.spec, init_model.ckpt, init_model.dims, init_model.prefix, layer)
    return difference_spectra(weights, w0, group=model.dims.H // model.dims.H_kv, method=method,
                              block=model.dims.block)


def assemble(model: OpenModel, layers: list[LayerSpectra], *, grid_m: int | None = None,
             rank_tol: float = 1e-10, l_phi: float | None = None, method: str = "factored",
             gram_rtol: float = DEFAULT_GRAM_RTOL, init: tuple[OpenModel, list[LayerSpectra]] | None = None,
             gap_params: GapParameters | None = None) -> Analysis:
    """Propagation factors, every registered bound and the records, from all layers' spectra
    (``init``: the initial-weights model and the spectra of ``W - W0``; ``gap_params``: the
    generalisation-gap bound's parameters)."""
    dims = model.dims
    if l_phi is None:
        l_phi, l_phi_source = activation_lipschitz(dims.activation)
    else:
        l_phi_source = "user"
    measures = measure(layers, dims, l_phi=l_phi, rank_tol=rank_tol, grid_m=grid_m)
    results = compute_all(measures)
    from_init = None
    if init is not None:
        init_measures = measures.measured_from(init[1])
        from_init = (init_measures, compute_all(init_measures, only_distance=True))
    options = {"grid_m": measures.grid_m, "rank_tol": rank_tol, "l_phi": l_phi,
               "l_phi_source": l_phi_source, "method": method, "gram_rtol": gram_rtol if method == "factored" else 0.0}
    if init is not None:
        options["init"] = str(init[0].ckpt.location)
    gap = None
    if gap_params is not None:
        gap = describe(gap_params)
        gap["bounds"] = gap_bounds(measures, results, gap_params)
        if from_init is not None:
            gap["from_init"] = gap_bounds(from_init[0], from_init[1], gap_params)
    return build_analysis(model.ckpt.location, model.spec.family, measures, results, options,
                          from_init=from_init, gap=gap)


def _open_init(init, model: OpenModel) -> OpenModel:
    """The initial-weights checkpoint, checked to have the analysed checkpoint's architecture."""
    init_model = open_model(init, arch_spec=model.spec)
    if init_model.dims != model.dims:
        init_model.ckpt.close()
        raise SpecboundError(
            f"the initial weights in {init_model.ckpt.location} do not match the analysed checkpoint: "
            f"{init_model.dims} vs {model.dims}; pass the same architecture's initialisation"
        )
    return init_model


def _gap_parameters(n, margin, delta, lead_constant, confidence_constant) -> GapParameters | None:
    if n is None and margin is None:
        return None
    if n is None or margin is None:
        missing = "n (the sample size)" if n is None else "margin"
        raise SpecboundError(f"a generalisation-gap bound needs both n and margin; {missing} is missing")
    return GapParameters(n=n, margin=margin, delta=delta, lead_constant=lead_constant,
                         confidence_constant=confidence_constant)


def _resolve_spec(arch_spec, config) -> ArchSpec:
    if arch_spec is None:
        return spec_for_config(config)
    if isinstance(arch_spec, ArchSpec):
        return arch_spec
    return load_spec_file(arch_spec)


def _check_options(grid_m, rank_tol, l_phi, threads, method, gram_rtol, jobs=1) -> None:
    if grid_m is not None and (not isinstance(grid_m, (int, np.integer)) or grid_m < 1):
        raise SpecboundError(f"grid_m must be a positive integer (the grid is {{0, 1/m, ..., 2}}), got {grid_m!r}")
    if not (isinstance(rank_tol, (int, float)) and 0 <= rank_tol < 1):
        raise SpecboundError(f"rank_tol must be a number in [0, 1), got {rank_tol!r}")
    if l_phi is not None and not (isinstance(l_phi, (int, float)) and 0 < l_phi < math.inf):
        raise SpecboundError(f"l_phi must be a positive finite number (GELU: 1.13), got {l_phi!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise SpecboundError(f"threads must be a positive integer, got {threads!r}")
    if jobs != "auto" and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise SpecboundError(f"jobs must be a positive integer (layers analysed at once) or 'auto', got {jobs!r}")
    if method not in METHODS:
        raise SpecboundError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if not (isinstance(gram_rtol, (int, float)) and 0 <= gram_rtol < 1):
        raise SpecboundError(f"gram_rtol must be a number in [0, 1) (0 forces exact SVDs), got {gram_rtol!r}")
