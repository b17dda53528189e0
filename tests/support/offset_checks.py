"""The per-offset checks of a rotary QK row against the dense logit matrix of the module at one offset
(tests/archs/test_family_rotary.py in 1D, tests/archs/test_mrope_families.py over offset vectors)."""

import numpy as np


def check_offset_matrix(x: np.ndarray, row, envelope: np.ndarray, slack: float) -> float:
    """Every quantity the row claims to bound holds for ``x`` (``N x N``: the logits of unit inputs at one
    offset): its rank, its Schatten sums at p = 0.1, 1, 2 (against the row's singular-value envelope), its
    (2,1)- and (1,1)-norms.  Returns ``x``'s spectral norm, whose maximum over the offsets the caller compares
    with the row's."""
    n = x.shape[0]
    sing = np.linalg.svd(x, compute_uv=False)
    kept = sing[sing > 1e-10 * n * max(sing[0], 1)]
    assert kept.size <= row["rank"]
    for p in (0.1, 1.0, 2.0):
        assert np.sum(kept**p) <= np.sum(envelope**p) * slack
    assert np.linalg.norm(x, axis=0).sum() <= row["norm_2_1"] * slack
    assert np.abs(x).sum() <= row["norm_1_1"] * slack
    return float(sing[0])
