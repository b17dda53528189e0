"""Invariants held on every shipped family's tiny model (tests/support/families.py is the table: a
family added there gets every test here with no extra code).

* each row describes one matrix: ``spectral <= Frobenius <= nuclear``, ``Frobenius <= sqrt(rank)
  spectral``, ``stable rank <= rank`` (docs/spec.md section 2);
* ``frobenius_product >= spectral_product`` (docs/bounds.md section 8: each layer factor with the
  Frobenius-side analogue of every Lipschitz factor in place of it, a QK-norm head's ``kappa_F >= kappa``).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specbound  # noqa: E402

from support.families import FAMILIES, save_family  # noqa: E402

N_SAMPLES, MARGIN = 10**6, 1.0
REL = 1e-9  # rounding of the reported norms (float64 spectra of float32 weights)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def analysed(request, tmp_path_factory):
    """``(family, analysis)``: the family's tiny model saved and analysed once, with a gap bound."""
    folder = tmp_path_factory.mktemp(f"inv_{request.param}")
    transformers.logging.set_verbosity_error()
    save_family(request.param, folder)
    return request.param, specbound.analyze(folder, threads=1, n=N_SAMPLES, margin=MARGIN)


def test_every_row_describes_one_matrix(analysed):
    family, a = analysed
    m = a.matrices
    spectral, frob, nuclear = (m[c].to_numpy() for c in ("spectral_norm", "frobenius_norm", "nuclear_norm"))
    rank, stable = m["rank"].to_numpy(), m["stable_rank"].to_numpy()
    assert np.all(spectral <= frob * (1 + REL)), family
    assert np.all(frob <= nuclear * (1 + REL)), family
    assert np.all(frob <= np.sqrt(rank) * spectral * (1 + REL)), family
    assert np.all(stable <= rank * (1 + REL)), family
    assert np.all(m["lipschitz_factor_frobenius"] >= m["lipschitz_factor"] * (1 - REL)), family
    plain = m["role"] != "QK" if "qk_norm" in a.model else np.ones(len(m), dtype=bool)
    assert (m["lipschitz_factor"][plain] == m["spectral_norm"][plain]).all(), family
    assert (m["lipschitz_factor_frobenius"][plain] == m["frobenius_norm"][plain]).all(), family


def test_the_frobenius_product_is_at_least_the_spectral_product(analysed):
    family, a = analysed
    b = a.baselines
    assert b["frobenius_product"] >= b["spectral_product"] * (1 - REL), family
    np.testing.assert_array_less(a.layers["lambda"] * (1 - REL), a.layers["lambda_frobenius"], err_msg=family)
