"""Building an :class:`~.analysis.Analysis` from the measures and every bound's result: one row per
matrix, per layer and per singular value (the columns of :mod:`.schema`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..bounds import BoundResult, in_group
from ..bounds.schatten import kept_singular_values
from ..compute.measures import ModelMeasures
from ..compute.spectra import RotaryQKSpectrum
from .analysis import Analysis
from .schema import LN10, MATRIX_COLUMNS


def _finite_or_null(table: pd.DataFrame) -> pd.DataFrame:
    """``inf`` entries of float columns as NaN, which Parquet stores as null and CSV as empty: no
    output table ever holds an Infinity (the ``log10_*`` columns carry what overflowed)."""
    floats = table.select_dtypes(include="float").columns
    if len(floats):
        values = table[floats].to_numpy()
        if not np.isfinite(values[~np.isnan(values)]).all():
            table = table.copy()
            table[floats] = table[floats].where(np.isfinite(table[floats]))
    return table


def build_analysis(
    source: str,
    family: str,
    measures: ModelMeasures,
    results: dict[str, BoundResult],
    options: dict[str, Any],
    *,
    from_init: tuple[ModelMeasures, dict[str, BoundResult]] | None = None,
    gap: dict[str, Any] | None = None,
    tensors: dict[tuple[int, int | None, str], str] | None = None,
    location: str | None = None,
    model_extra: dict[str, Any] | None = None,
    assumptions: list[dict[str, Any]] | None = None,
) -> Analysis:
    """Assemble the records from the measures and every bound's result (``from_init``: the
    measures on ``W - W0`` and the bounds computed on them; ``tensors``: the checkpoint tensor names
    of each ``(layer, head, role)``, from :func:`specbound.archs.extract.matrix_tensor_names`)."""
    dims = measures.dims
    base = []
    sv_arrays = []
    for i, mm in enumerate(measures.matrices):
        s = mm.spectrum
        base.append(
            {
                "layer": mm.layer,
                "head": mm.head,
                "role": mm.role,
                "tensors": (tensors or {}).get((mm.layer, mm.head, mm.role)),
                "rows": s.shape[0],
                "cols": s.shape[1],
                "rank": int(kept_singular_values(s, measures.rank_tol).size),
                "spectral_norm": s.spectral_norm,
                "frobenius_norm": s.frobenius_norm,
                "nuclear_norm": s.nuclear_norm(measures.rank_tol),
                "stable_rank": s.stable_rank,
                "norm_2_1": s.norm_2_1,
                "norm_1_1": s.norm_1_1,
                "lipschitz_factor": s.lipschitz_factor,
                "lipschitz_factor_frobenius": s.lipschitz_factor_frobenius,
                "downstream_factor": mm.alpha,
                "gamma": mm.gamma,
                "sv_method": s.sv_method,
                "sv_rel_error_bound": s.sv_rel_error_bound,
                "log10_downstream_factor": mm.log_alpha / LN10,
                "log10_scale": mm.log_scale / LN10,
                "argmax_offset": _one_axis(getattr(s, "argmax_offset", None)),
            }
        )
        sv_arrays.extend(_spectrum_rows(i, s))
    # Every column gathered first and the frames built once: inserting columns one by one
    # re-converts the string columns each time (most of this function's time on a small model).
    columns = {key: [row[key] for row in base] for key in (base[0] if base else {})}
    for result in results.values():
        columns.update(result.per_matrix)
    columns["head"] = pd.array(columns.get("head", []), dtype="Int64")
    columns["argmax_offset"] = pd.array(columns.get("argmax_offset", []), dtype="Int64")
    matrices = pd.DataFrame(columns, columns=MATRIX_COLUMNS) if base else pd.DataFrame(base, columns=MATRIX_COLUMNS)

    per_layer = {
        "layer": np.arange(dims.L),
        "lambda": measures.lambdas,
        "downstream_factor": measures.alphas,
        "log10_downstream_factor": measures.log_alphas / LN10,
    }
    for result in results.values():
        per_layer.update(result.per_layer)
    layers = pd.DataFrame(per_layer)
    if from_init is not None:
        matrices, layers = _with_differences(matrices, layers, *from_init)

    singular_values = _singular_value_table(measures, sv_arrays)
    model = {
        "family": family,
        "L": dims.L,
        "N": dims.N,
        "H": dims.H,
        "H_kv": dims.H_kv,
        "d_head": dims.d_head,
        "d_ff": dims.d_ff,
        "activation": dims.activation,
    }
    model.update(model_extra or {})
    if dims.stacks is not None:
        matrices, layers, singular_values = _with_stacks(measures, matrices, layers, singular_values)
    matrices, layers = _finite_or_null(matrices), _finite_or_null(layers)
    values = {name: r.value for name, r in results.items()}
    return Analysis(
        source=source,
        model=model,
        options=options,
        log10_bounds={name: r.log10_value for name, r in results.items()},
        assumptions=list(assumptions or []),
        bounds={k: values[k] for k in in_group("bounds") if k in values},
        matrices=matrices,
        layers=layers,
        singular_values=singular_values,
        baselines={k: values[k] for k in in_group("baselines") if k in values},
        adaptive_variants={k: values[k] for k in in_group("adaptive_variants") if k in values},
        from_init=None if from_init is None else {k: r.value for k, r in from_init[1].items()},
        gap_bound=gap,
        location=location,
    )


def _spectrum_rows(matrix: int, spectrum) -> list[tuple[int, str, np.ndarray]]:
    """``(matrix, kind, values)`` of one spectrum: its singular values, or for a rotary QK head its
    per-index bounds and its Horn envelope (``SV_KINDS``)."""
    if isinstance(spectrum, RotaryQKSpectrum):
        return [(matrix, "sigma_bound", spectrum.sigma_bounds), (matrix, "horn_envelope", spectrum.envelope)]
    return [(matrix, "singular_value", spectrum.singular_values)]


def _singular_value_table(measures: ModelMeasures, parts: list[tuple[int, str, np.ndarray]]) -> pd.DataFrame:
    """The long table ``matrix, layer, head, role, kind, sv_index, sigma``, built at once (not one
    frame per matrix); ``sv_index`` runs ``1..k`` within each matrix and kind."""
    counts = np.array([values.size for _, _, values in parts], dtype=np.int64)
    owners = [measures.matrices[i] for i, _, _ in parts]

    def per_row(values, dtype=None):
        return np.repeat(np.array(values, dtype=dtype), counts)

    return pd.DataFrame(
        {
            "matrix": per_row([i for i, _, _ in parts], np.int64),
            "layer": per_row([mm.layer for mm in owners], np.int64),
            "head": pd.array(per_row([mm.head for mm in owners], object), dtype="Int64"),
            "role": per_row([mm.role for mm in owners], object),
            "kind": per_row([kind for _, kind, _ in parts], object),
            "sv_index": np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + 1,
            "sigma": np.concatenate([values for _, _, values in parts]) if parts else np.array([]),
        }
    )


def _with_differences(
    matrices: pd.DataFrame, layers: pd.DataFrame, measures: ModelMeasures, results: dict[str, BoundResult]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Add the ``W - W0`` columns (``DELTA_COLUMNS``) and the per-layer terms on the differences
    (prefixed ``delta_``)."""
    matrices, layers = matrices.copy(), layers.copy()
    deltas = [mm.delta for mm in measures.matrices]
    matrices["delta_rank"] = [int(kept_singular_values(d, measures.rank_tol).size) for d in deltas]
    for key, attr in (
        ("delta_spectral_norm", "spectral_norm"),
        ("delta_frobenius_norm", "frobenius_norm"),
        ("delta_norm_2_1", "norm_2_1"),
        ("delta_norm_1_1", "norm_1_1"),
    ):
        matrices[key] = [getattr(d, attr) for d in deltas]
    adaptive = results["spectral_adaptive"].per_matrix
    matrices["delta_p_star"], matrices["delta_contribution"] = adaptive["p_star"], adaptive["contribution"]
    for result in results.values():
        for key, column in result.per_layer.items():
            layers[f"delta_{key}"] = column
    return matrices, layers


def _with_stacks(measures: ModelMeasures, *tables: pd.DataFrame) -> tuple[pd.DataFrame, ...]:
    """An encoder-decoder's tables with a ``stack`` column (``encoder`` or ``decoder``) after ``layer``
    (the layers numbered on through both stacks), and the layers table with each decoder layer's
    ``memory_lipschitz`` ``M_j`` (its Lipschitz constant in the encoder's output; null in the encoder)."""
    names = np.empty(measures.dims.L, dtype=object)
    for part in measures.dims.stacks:
        names[part.first : part.first + part.dims.L] = part.name
    out = []
    for table in tables:
        table = table.copy()
        table.insert(
            table.columns.get_loc("layer") + 1,
            "stack",
            pd.Series(names[table["layer"].to_numpy()], dtype="string", index=table.index),
        )
        out.append(table)
    if measures.memory is not None:
        layers = out[1]
        layers.insert(layers.columns.get_loc("downstream_factor"), "memory_lipschitz", measures.memory)
    return tuple(out)


def _one_axis(offset):
    """A rotary head's attaining offset for the ``argmax_offset`` column: an integer, or null for an offset vector
    (several position axes: M-RoPE's, a vision tower's ``(dy, dx)``; docs/rotary.md sections 7 and 9), which one
    integer cannot hold."""
    return None if isinstance(offset, tuple) else offset
