"""Contribution curves ``p -> C(p)`` of every matrix on the post-hoc grid, from stored records.

The plots of ``C(p)/C(0)`` need the whole curve, while an :class:`~specbound.records.Analysis`
keeps only its minimum and end points.  The curve is a function of the stored singular values,
the stored ``scale`` and the model's ``N`` (docs/spec.md section 4), so it is evaluated here from the
records, with the same :class:`~specbound.bounds.adaptive.ContributionCurve` the bound uses; no
spectrum is recomputed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..bounds.schatten import ContributionCurve, schatten_grid
from ..compute.spectra import MatrixSpectrum
from .schema import sv_kinds

CURVE_COLUMNS = ["matrix", "layer", "head", "role", "p", "c", "c_over_c0"]


def contribution_curves(
    matrices: pd.DataFrame, singular_values: pd.DataFrame, *, n: int, grid_m: int, rank_tol: float
) -> pd.DataFrame:
    """``C(p)`` for every matrix and every ``p`` in ``P_m = {0, 1/m, ..., 2}``.

    Parameters
    ----------
    matrices : DataFrame
        The ``Analysis.matrices`` table (``layer, head, role, rows, cols, scale``), one row per
        matrix in the order of the ``matrix`` index of ``singular_values``.
    singular_values : DataFrame
        The ``Analysis.singular_values`` long table (``matrix, kind, sigma``): ``singular_value`` rows,
        or a rotary head's ``horn_envelope`` rows, whose first ``rank`` values its ``S_p`` sums over.
    n : int
        Hidden size ``N``.
    grid_m : int
        Grid resolution ``m`` (the analysis' resolved ``grid_m``).
    rank_tol : float
        The analysis' rank tolerance.

    Returns
    -------
    DataFrame, long form, columns ``CURVE_COLUMNS``, ``len(matrices) * (2 m + 1)`` rows; ``c_over_c0``
    is ``C(p) / C(0)`` (NaN for an all-zero matrix).
    """
    grid = schatten_grid(int(grid_m))
    kinds = sv_kinds(singular_values)
    by_matrix = dict(tuple(singular_values[kinds == "singular_value"].groupby("matrix", sort=False)["sigma"]))
    # a rotary QK head: its S_p sums over its Horn envelope's first `rank` values, never re-thresholded
    envelopes = dict(tuple(singular_values[kinds == "horn_envelope"].groupby("matrix", sort=False)["sigma"]))
    ranks = matrices["rank"].to_numpy()
    values = np.empty((len(matrices), grid.size))
    rows, cols, scales = (matrices[c].to_numpy() for c in ("rows", "cols", "scale"))
    # ln scale: from the stored scale where it is a normal float (as the bound computed it), else from
    # the stored log10 (a scale that overflows float64 is stored as null)
    log10_scales = (
        matrices["log10_scale"].to_numpy(np.float64)
        if "log10_scale" in matrices
        else np.log10(scales.astype(np.float64))
    )
    tiny = np.finfo(np.float64).tiny
    for i in range(len(matrices)):
        scale = float(scales[i])
        log_scale = math.log(scale) if tiny <= scale < math.inf else float(log10_scales[i]) * math.log(10)
        if i in envelopes:
            kept = np.sort(envelopes[i].to_numpy(np.float64))[::-1][: int(ranks[i])]
            curve = ContributionCurve.from_kept(kept, log_scale=log_scale, n=int(n))
        else:
            sigma = by_matrix.get(i)
            s = np.sort(sigma.to_numpy(np.float64))[::-1] if sigma is not None else np.zeros(0)
            spectrum = MatrixSpectrum((int(rows[i]), int(cols[i])), s, float("nan"), float("nan"))
            curve = ContributionCurve(spectrum, log_scale=log_scale, n=int(n), rank_tol=float(rank_tol))
        values[i] = curve.on_grid(grid)
    c0 = values[:, :1]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ratio = np.where(c0 > 0, values / np.where(c0 > 0, c0, 1.0), np.nan)
    values = np.where(np.isfinite(values), values, np.nan)  # never an Infinity in a table: null
    ratio = np.where(np.isfinite(ratio), ratio, np.nan)
    k = grid.size
    out = pd.DataFrame(
        {
            "matrix": np.repeat(np.arange(len(matrices)), k),
            "layer": np.repeat(matrices["layer"].to_numpy(), k),
            "head": pd.array(np.repeat(matrices["head"].to_numpy(), k), dtype="Int64"),
            "role": np.repeat(matrices["role"].to_numpy(), k),
            "p": np.tile(grid, len(matrices)),
            "c": values.ravel(),
            "c_over_c0": ratio.ravel(),
        }
    )
    return out[CURVE_COLUMNS]
