"""What plays the role of a feed-forward network's product of layer norms on the transformer chain.

A depth-``L`` feed-forward network's Lipschitz constant is bounded by the product of its layers'
spectral norms.  On the transformer chain (docs/spec.md section 3) the layer's factor is

    Lambda_l = L_phi c(FF_in) c(FF_out) sum_h c(OV_h) (1 + 4 c(QK_h)),

so the baselines that multiply norms over layers multiply ``Lambda_l`` (with ``c`` the spectral
norm) or the same expression with another norm in place of ``c`` (the Frobenius product).  Products
are formed in logs: they overflow a float64 for deep models long before they stop being meaningful.
"""

from __future__ import annotations

import math

import numpy as np

from ..archs.model import ModelDims
from ..compute.layer_spectra import LayerSpectra
from ..compute.measures import ModelMeasures, layer_norms
from ..compute.propagation import (
    encoder_decoder_factors,
    encoder_decoder_log_lipschitz,
    layer_lipschitz,
    memory_lipschitz,
)


def layer_factor(layer: LayerSpectra, dims: ModelDims, l_phi: float, norm) -> float:
    """``Lambda_l`` with ``n(spectrum)`` in place of the spectral norm (BERT:
    ``L_phi n(FF_in) n(FF_out) sum_h n(OV_h) (1 + 4 n(QK_h))``; gated and parallel blocks, experts' gates and
    gpt-oss's up offset as in :func:`~specbound.compute.propagation.layer_lipschitz`)."""
    return layer_lipschitz(layer_norms(layer, dims, norm), l_phi)


def log_product(factors) -> float:
    """``ln prod factors`` (``-inf`` if one of them is zero)."""
    factors = np.asarray(factors, dtype=np.float64)
    if np.any(factors <= 0):
        return -math.inf
    return float(np.sum(np.log(factors)))


def log_lipschitz(measures: ModelMeasures) -> float:
    """``ln prod_l Lambda_l``: the chain's Lipschitz bound, in logs; an encoder-decoder's is
    ``ln((prod_encoder Lambda) Z + prod_decoder Lambda)`` (docs/theory.md 3i)."""
    if measures.log_lipschitz is not None:
        return measures.log_lipschitz
    return log_product(measures.lambdas)


def log_chain_factor(measures: ModelMeasures, norm) -> tuple[float, np.ndarray]:
    """``(ln of the chain's Lipschitz bound with norm in place of the spectral norm, each layer's
    factor)``: ``ln prod_l Lambda_l(norm)``, or an encoder-decoder's ``ln K(norm)``."""
    factors = np.array([layer_factor(layer, measures.dims, measures.l_phi, norm) for layer in measures.layers])
    if measures.log_lipschitz is None:
        return log_product(factors), factors
    memory = np.array(
        [
            memory_lipschitz(layer_norms(layer, measures.dims, norm), measures.l_phi)
            if layer.cross_qk is not None
            else math.nan
            for layer in measures.layers
        ]
    )
    first = int(np.argmax(~np.isnan(memory)))
    _, _, log_z = encoder_decoder_factors(factors, memory, first)
    return encoder_decoder_log_lipschitz(factors, log_z, first), factors


def relative_norms(measures: ModelMeasures, norm) -> np.ndarray:
    """``n(target) / ||W||_2`` per matrix (``W - W0`` in the numerator when measured from init;
    the spectral norm is always that of ``W``); 0 where ``W = 0``."""
    out = []
    for mm in measures.matrices:
        s1 = mm.spectrum.spectral_norm
        out.append(norm(mm.target) / s1 if s1 > 0 else 0.0)
    return np.asarray(out, dtype=np.float64)
