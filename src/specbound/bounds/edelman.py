"""The Edelman-style norm proxy, the paper's baseline (docs/spec.md section 5); after Edelman, Goel,
Kakade & Zhang, "Inductive Biases and Variable Creation in Self-Attention Mechanisms", ICML 2022,
in the multi-head form used by Sakai & Imaizumi's experiment:

    xi_l = sum_h [(c_out c_in c(OV_h) ||QK_h||_{2,1})^(2/3) + (c_out c_in ||OV_h||_{2,1})^(2/3)]
           + (c_out ||FF_in||_{2,1})^(2/3) + ||FF_out||_{2,1}^(2/3)
    B_edelman = (1 + sum_l alpha_l^(2/3) xi_l)^(3/2)

Margin-bound form: leading term times ``ln(2W) ln n`` (``W`` the widest matrix dimension), the
factor of the (2,1)-norm covering lemma it shares with Bartlett et al. 2017.  Measured from initial
weights, the (2,1)-norms are those of ``W - W0``; spectral norms stay those of ``W``.
"""

from __future__ import annotations

import math

import numpy as np

from ..compute.measures import ModelMeasures
from .base import Bound, BoundResult
from .schatten import log_sum


def edelman_weight(role, gamma) -> np.ndarray:
    """Per-matrix factor in front of the norm in ``xi`` from its role and sensitivity ``gamma*``
    (arrays or scalars).

    On BERT: ``c_out c_in c(OV_h)`` for ``QK_h``, ``c_out c_in`` for ``OV_h``, ``c_out`` for
    ``FF_in``, 1 for ``FF_out``.  That is each matrix's sensitivity ``gamma*`` (docs/spec.md section 3),
    except for QK (and a decoder's cross-attention QK), whose weight lacks the factor 2 of ``gamma*_QK``;
    written this way it carries over to gated and parallel blocks and to encoder-decoders
    (docs/theory.md, sections 3b and 3e).
    """
    return np.asarray(gamma, dtype=np.float64) * np.where(np.isin(np.asarray(role), ("QK", "QK_cross")), 0.5, 1.0)


def matrix_terms(alpha, role, gamma, norm_2_1) -> np.ndarray:
    """Each matrix's term ``alpha_l^(2/3) (w ||W||_{2,1})^(2/3)``: ``B_edelman = (1 + sum of terms)^(3/2)``
    (the per-role fits of ``specbound scaling`` sum these from stored records)."""
    w = edelman_weight(role, gamma)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(alpha, dtype=np.float64) ** (2 / 3) * (w * np.asarray(norm_2_1, dtype=np.float64)) ** (2 / 3)


def edelman_weights(measures: ModelMeasures) -> np.ndarray:
    """:func:`edelman_weight` of every matrix of ``measures``, shape (#matrices,)."""
    return edelman_weight([mm.role for mm in measures.matrices], [mm.gamma for mm in measures.matrices])


def xi_per_layer(measures: ModelMeasures, matrix_norms: np.ndarray) -> np.ndarray:
    """``xi_l = sum_{matrices of layer l} (weight * norm)^(2/3)``, shape (L,)."""
    return measures.per_layer_sum((edelman_weights(measures) * matrix_norms) ** (2 / 3))


def chain_value(measures: ModelMeasures, xi: np.ndarray) -> float:
    """``(1 + sum_l alpha_l^(2/3) xi_l)^(3/2)`` (``inf`` where it exceeds float64: see :func:`log_chain_value`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        value = float((1.0 + np.sum(measures.alphas ** (2 / 3) * xi)) ** 1.5)
    return value if math.isfinite(value) else math.inf


def log_chain_value(measures: ModelMeasures, xi: np.ndarray) -> float:
    """``ln`` of :func:`chain_value` from ``ln alpha_l``, exact at any depth."""
    with np.errstate(divide="ignore"):
        terms = (2 / 3) * measures.log_alphas + np.log(np.asarray(xi, dtype=np.float64))
    return 1.5 * log_sum(np.append(terms, 0.0))


def chain_result(measures: ModelMeasures, xi: np.ndarray, per_layer: dict) -> BoundResult:
    """The chain bound's result: the product form where it is finite, its log form otherwise."""
    value = chain_value(measures, xi)
    log_value = None if value < math.inf else log_chain_value(measures, xi)
    return BoundResult(value=value, log_value=log_value, per_layer=per_layer)


def widest(measures: ModelMeasures) -> int:
    """``W``: the widest dimension of any analysed matrix (``max(N, d_ff)``; a mixture of experts'
    shared expert may be wider than its routed ones)."""
    return max(measures.dims.N, measures.dims.d_ff, *(max(mm.spectrum.shape) for mm in measures.matrices))


def covering_log_factor(measures: ModelMeasures, n: int) -> float:
    """``ln(2W) ln n``: the log factors of Bartlett, Foster & Telgarsky 2017 (Theorem 1.1), from the
    (2,1)-norm matrix covering lemma that the Edelman-style and (1,1) proxies share."""
    return math.log(2 * widest(measures)) * math.log(n)


def _compute(measures: ModelMeasures) -> BoundResult:
    xi = xi_per_layer(measures, np.array([mm.target.norm_2_1 for mm in measures.matrices]))
    return chain_result(measures, xi, {"xi": xi})


EDELMAN = Bound(
    name="edelman",
    title="Edelman-style norm proxy",
    reference="Edelman et al., ICML 2022 (multi-head form of Sakai & Imaizumi's experiment, docs/spec.md section 5)",
    compute=_compute,
    needs=("lipschitz_factor", "norm_2_1", "alpha"),
    log_factor=covering_log_factor,
)

BOUNDS = (EDELMAN,)
