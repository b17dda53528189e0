"""The Edelman-style norm proxy, the paper's baseline (SPEC section 5); after Edelman, Goel,
Kakade & Zhang, "Inductive Biases and Variable Creation in Self-Attention Mechanisms", ICML 2022,
in the multi-head form used by Sakai & Imaizumi's experiment:

    xi_l = sum_h [(c_out c_in c(OV_h) ||QK_h||_{2,1})^(2/3) + (c_out c_in ||OV_h||_{2,1})^(2/3)]
           + (c_out ||FF_in||_{2,1})^(2/3) + ||FF_out||_{2,1}^(2/3)
    B_edelman = (1 + sum_l alpha_l^(2/3) xi_l)^(3/2)
"""

from __future__ import annotations

import numpy as np

from ..measures import LayerSpectra, ModelMeasures
from ..propagation import sensitivities
from . import Bound, BoundResult, register


def layer_xi(layer: LayerSpectra) -> float:
    """``xi_l`` of one layer: ``sum over its matrices of (w ||X||_{2,1})^(2/3)``.

    The weight ``w`` of each matrix is its sensitivity ``gamma*`` (SPEC section 3) except for QK,
    whose Edelman weight ``c(OV) c(FF_out) c(FF_in)`` lacks the factor 2 of ``gamma*_QK``.  On a BERT
    layer this is exactly the formula above; it carries over to gated and parallel blocks.
    """
    gamma = sensitivities(layer.norms())
    xi = np.sum((gamma["QK"] / 2 * [s.norm_2_1 for s in layer.qk]) ** (2 / 3))
    xi += np.sum((gamma["OV"] * [s.norm_2_1 for s in layer.ov]) ** (2 / 3))
    xi += sum((gamma[role] * s.norm_2_1) ** (2 / 3) for role, s in layer.ff.items())
    return float(xi)


def _compute(measures: ModelMeasures) -> BoundResult:
    xi = np.array([layer_xi(layer) for layer in measures.layers])
    value = float((1.0 + np.sum(measures.alphas ** (2 / 3) * xi)) ** 1.5)
    return BoundResult(value=value, per_layer={"xi": xi})


EDELMAN = register(Bound(
    name="edelman",
    title="Edelman-style norm proxy",
    reference="Edelman et al., ICML 2022 (multi-head form of Sakai & Imaizumi's experiment, SPEC section 5)",
    compute=_compute,
))
