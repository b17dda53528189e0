"""``analyze``: load -> extract -> spectra -> measures -> bounds -> records."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .archspec import ArchSpec, load_spec_file, spec_for_config
from .bounds import compute_all
from .checkpoint import Checkpoint, open_checkpoint
from .defaults import default_checkpoint
from .errors import SpecboundError
from .extract import LayerWeights, ModelDims, account_for_tensors, detect_prefix, layer_weights, model_dims
from .measures import LayerSpectra, measure
from .propagation import activation_lipschitz
from .records import Analysis, build_analysis
from .spectra import dense_spectrum, factored_spectra

METHODS = ("factored", "dense")
# Feed-forward singular values from the Gram matrix only when each is proven accurate to 1e-8
# relative (in practice they agree with the SVD to ~1e-14); see spectra.gram_singular_values.
DEFAULT_GRAM_RTOL = 1e-8


def layer_spectra(weights: LayerWeights, *, method: str = "factored", group: int = 1,
                  block: str = "sequential", with_norm_1_1: bool = True, gram_rtol: float = DEFAULT_GRAM_RTOL) -> LayerSpectra:
    """Spectra of one layer's QK/OV heads and feed-forward matrices.

    ``method="factored"`` uses the ``d_h x d_h`` cores (SPEC section 1); ``"dense"`` materialises
    every ``N x N`` per-head product and runs a full SVD, as the paper's reference code does (the
    benchmark's baseline).  ``group`` is the number of query heads per key/value head.
    Feed-forward singular values use the Gram path when its proven relative error is at most
    ``gram_rtol`` (0: always LAPACK's SVD; the dense method always uses the SVD).
    """
    k = np.repeat(weights.k, group, axis=0)
    v = np.repeat(weights.v, group, axis=0)
    if method == "factored":
        qk = factored_spectra(weights.q, k, with_norm_1_1=with_norm_1_1)
        ov = factored_spectra(v, weights.o, with_norm_1_1=with_norm_1_1)
    elif method == "dense":
        qk = [dense_spectrum(a.T @ b) for a, b in zip(weights.q, k)]
        ov = [dense_spectrum(a.T @ b) for a, b in zip(v, weights.o)]
        gram_rtol = 0.0
    else:
        raise SpecboundError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    ff = {role: dense_spectrum(w, gram_rtol=gram_rtol) for role, w in weights.ff.items()}
    return LayerSpectra(weights.layer, qk, ov, ff, block)


def analyze(
    source: str | Path | None = None,
    *,
    arch_spec: str | Path | ArchSpec | None = None,
    grid_m: int | None = None,
    rank_tol: float = 1e-10,
    l_phi: float | None = None,
    threads: int | None = None,
    method: str = "factored",
    gram_rtol: float = DEFAULT_GRAM_RTOL,
    progress: Callable[[int, int], None] | None = None,
) -> Analysis:
    """Analyse a checkpoint: every spectral quantity and every registered bound.

    Parameters
    ----------
    source : path, optional
        A Hugging Face model folder (``config.json`` + ``model.safetensors``).  None: the embedded
        default checkpoint (all-MiniLM-L6-v2).
    arch_spec : path or ArchSpec, optional
        A family spec file; by default chosen from config.json's ``model_type``.
    grid_m : int, optional
        Resolution of the Schatten grid; default ``ceil(L + ln N)`` (SPEC section 4).
    rank_tol : float
        Relative rank tolerance, ``tau = rank_tol * dim * max(s_1, 1)`` (SPEC section 2).
    l_phi : float, optional
        Activation Lipschitz constant; default from config.json's ``hidden_act`` (GELU: 1.13).
    threads : int, optional
        BLAS threads (threadpoolctl); None leaves the BLAS default.
    method : {"factored", "dense"}
        How QK/OV spectra are computed; ``"dense"`` is the slow reference (all SVDs).
    gram_rtol : float
        Largest proven relative error accepted from the feed-forward Gram path; 0 forces SVDs.
    progress : callable(done, total), optional
        Called after each layer.

    Returns
    -------
    Analysis
    """
    _check_options(grid_m, rank_tol, l_phi, threads, method)
    if not (isinstance(gram_rtol, (int, float)) and 0 <= gram_rtol < 1):
        raise SpecboundError(f"gram_rtol must be a number in [0, 1) (0 forces exact SVDs), got {gram_rtol!r}")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        model = open_model(default_checkpoint() if source is None else source, arch_spec=arch_spec)
        layers = []
        for layer in range(model.dims.L):
            layers.append(model_layer_spectra(model, layer, method=method, gram_rtol=gram_rtol))
            if progress:
                progress(layer + 1, model.dims.L)
        model.ckpt.close()
        return assemble(model, layers, grid_m=grid_m, rank_tol=rank_tol, l_phi=l_phi, method=method,
                        gram_rtol=gram_rtol)


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


def open_model(source: str | Path, *, arch_spec: str | Path | ArchSpec | None = None) -> OpenModel:
    """Open ``source``, pick its family spec, read its dimensions and account for every tensor.

    Only config.json and the safetensors headers are read; no weight is loaded yet.
    """
    ckpt = open_checkpoint(source)
    spec = _resolve_spec(arch_spec, ckpt.config)
    dims = model_dims(spec, ckpt.config)
    prefix = detect_prefix(spec, ckpt)
    account_for_tensors(spec, ckpt, dims, prefix)
    return OpenModel(ckpt, spec, dims, prefix)


def model_layer_spectra(model: OpenModel, layer: int, *, method: str = "factored",
                        gram_rtol: float = DEFAULT_GRAM_RTOL) -> LayerSpectra:
    """Read layer ``layer`` of an opened model and compute its spectra (:func:`layer_spectra`).

    Independent of every other layer, so a sweep can run the layers of a large model as separate
    tasks and :func:`assemble` the results.
    """
    weights = layer_weights(model.spec, model.ckpt, model.dims, model.prefix, layer)
    return layer_spectra(weights, method=method, group=model.dims.H // model.dims.H_kv,
                         block=model.dims.block, gram_rtol=gram_rtol)


def assemble(model: OpenModel, layers: list[LayerSpectra], *, grid_m: int | None = None,
             rank_tol: float = 1e-10, l_phi: float | None = None, method: str = "factored",
             gram_rtol: float = DEFAULT_GRAM_RTOL) -> Analysis:
    """Propagation factors, every registered bound and the records, from all layers' spectra."""
    dims = model.dims
    if l_phi is None:
        l_phi, l_phi_source = activation_lipschitz(dims.activation)
    else:
        l_phi_source = "user"
    measures = measure(layers, dims, l_phi=l_phi, rank_tol=rank_tol, grid_m=grid_m)
    results = compute_all(measures)
    options = {"grid_m": measures.grid_m, "rank_tol": rank_tol, "l_phi": l_phi,
               "l_phi_source": l_phi_source, "method": method, "gram_rtol": gram_rtol if method == "factored" else 0.0}
    return build_analysis(model.ckpt.location, model.spec.family, measures, results, options)


def _resolve_spec(arch_spec, config) -> ArchSpec:
    if arch_spec is None:
        return spec_for_config(config)
    if isinstance(arch_spec, ArchSpec):
        return arch_spec
    return load_spec_file(arch_spec)


def _check_options(grid_m, rank_tol, l_phi, threads, method) -> None:
    if grid_m is not None and (not isinstance(grid_m, (int, np.integer)) or grid_m < 1):
        raise SpecboundError(f"grid_m must be a positive integer (the grid is {{0, 1/m, ..., 2}}), got {grid_m!r}")
    if not (isinstance(rank_tol, (int, float)) and 0 <= rank_tol < 1):
        raise SpecboundError(f"rank_tol must be a number in [0, 1), got {rank_tol!r}")
    if l_phi is not None and not (isinstance(l_phi, (int, float)) and 0 < l_phi < math.inf):
        raise SpecboundError(f"l_phi must be a positive finite number (GELU: 1.13), got {l_phi!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise SpecboundError(f"threads must be a positive integer, got {threads!r}")
    if method not in METHODS:
        raise SpecboundError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
