"""The hand-built two-layer model whose every bound the bounds tests derive by hand."""

import numpy as np

from specbound.archs.model import ModelDims
from specbound.compute.layer_spectra import LayerSpectra
from specbound.compute.spectra import MatrixSpectrum


def spec(shape, s, n21, n11):
    return MatrixSpectrum(shape, np.asarray(s, dtype=float), float(n21), float(n11))


# L=2, one head, N=4, d_head=2, d_ff=8, L_phi=1.  Spectral norms c, Frobenius^2, (2,1), (1,1):
#   layer 0: QK s=(1, .5) F2=1.25 n21=2 n11=3 | OV s=(2) n21=3 n11=4 | FF_in s=(2, 1) F2=5 n21=4 n11=6
#            FF_out s=(1) n21=2 n11=2.5
#   layer 1: QK s=(.5) n21=1 n11=1.5 | OV s=(1, 1) F2=2 n21=2 n11=3 | FF_in s=(1) n21=1.5 n11=2
#            FF_out s=(3) n21=4 n11=5
# Hand-derived: Lambda_0 = 1*2*1*[2*(1+4*1)] = 20, Lambda_1 = 1*1*3*[1*(1+4*.5)] = 9, alpha = (9, 1).
HAND_DIMS = ModelDims(L=2, N=4, H=1, H_kv=1, d_head=2, d_ff=8)


def hand_layers():
    nn, nf, fn = (4, 4), (4, 8), (8, 4)
    return [
        LayerSpectra(
            0,
            qk=[spec(nn, [1, 0.5], 2, 3)],
            ov=[spec(nn, [2], 3, 4)],
            ff={"FF_in": spec(nf, [2, 1], 4, 6), "FF_out": spec(fn, [1], 2, 2.5)},
        ),
        LayerSpectra(
            1,
            qk=[spec(nn, [0.5], 1, 1.5)],
            ov=[spec(nn, [1, 1], 2, 3)],
            ff={"FF_in": spec(nf, [1], 1.5, 2), "FF_out": spec(fn, [3], 4, 5)},
        ),
    ]
