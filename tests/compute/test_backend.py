"""The compute backends: torch float64 (``device="cpu"``, the code a GPU runs) gives the NumPy
path's numbers to 1e-12 on every matrix of every family, with the same proven Gram bounds; the
eigensolver chosen by size, the tiled (1,1)-norms and the read-ahead change nothing but rounding."""

import numpy as np
import pandas as pd
import pytest
from support.families import save_family

import specbound
from specbound.cli import main
from specbound.compute import eigensolvers, spectra, torch_kernels
from specbound.compute.eigensolvers import TWO_STAGE_MIN, symmetric_eigenvalues
from specbound.compute.layer_spectra import feed_forward_spectra
from specbound.compute.torch_kernels import gram_eigenvalues
from specbound.errors import SpecboundError
from specbound.options import AnalysisOptions, KernelOptions
from specbound.sweep.store import canonical_options
from specbound.tools.bench import write_llama_checkpoint

torch = pytest.importorskip("torch")


def assert_same_analysis(ours, reference, rtol=1e-12):
    """Every matrix row and every bound agree to ``rtol`` relative; the method columns exactly."""
    a, b = ours.matrices, reference.matrices
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    numeric = [c for c in a.columns if pd.api.types.is_numeric_dtype(a[c]) and c not in ("layer", "head")]
    assert {"spectral_norm", "nuclear_norm", "norm_1_1", "sv_rel_error_bound", "contribution"} <= set(numeric)
    pd.testing.assert_frame_equal(a.drop(columns=numeric), b.drop(columns=numeric))
    for column in numeric:
        if column == "sv_rel_error_bound":
            continue
        np.testing.assert_allclose(
            a[column].to_numpy(float), b[column].to_numpy(float), rtol=rtol, atol=0, equal_nan=True, err_msg=column
        )
    # The Gram path's bound b = delta / lambda_min divides by the smallest Gram eigenvalue, which each
    # backend knows only to within delta = b lambda_min (the theorem b states): two correct backends'
    # lambda_min differ by up to 2b relative, and their delta (NumPy's ||W||_F^2 on both, plus
    # n u lambda_max) by up to 2b, so their b by up to about 4b.  Measured: 4.7e-14 relative on these
    # families (b up to 8.5e-12), a difference that grows with the condition number squared.
    bound_a, bound_b = a["sv_rel_error_bound"].to_numpy(float), b["sv_rel_error_bound"].to_numpy(float)
    assert np.all(np.abs(bound_a - bound_b) <= (rtol + 4 * np.maximum(bound_a, bound_b)) * bound_b)
    ours_bounds, reference_bounds = ours.all_bounds(), reference.all_bounds()
    assert ours_bounds.keys() == reference_bounds.keys() and len(reference_bounds) > 5
    for name, value in reference_bounds.items():
        assert ours_bounds[name] == pytest.approx(value, rel=rtol, nan_ok=True), name


@pytest.fixture(
    scope="module",
    params=["albert", "bert", "distilbert", "electra", "gpt2", "gpt_neox", "llama", "mistral", "opt", "qwen2", "vit"],
)
def family_folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_family(request.param, folder)
    return folder


def test_torch_cpu_matches_numpy_on_every_family(family_folder):
    reference = specbound.analyze(family_folder, threads=1)
    ours = specbound.analyze(family_folder, threads=1, device="cpu")
    assert_same_analysis(ours, reference)


def test_torch_cpu_matches_numpy_on_a_llama_shaped_model(tmp_path, monkeypatch):
    """A random LLaMA-shaped bf16 model (grouped-query attention, gated feed-forward), with Gram
    blocks narrow enough that every feed-forward Gram is accumulated over many blocks and tiles
    small enough that every (1,1)-norm is summed over many uneven tiles, on both devices."""

    folder, _ = write_llama_checkpoint(tmp_path / "llama", L=2, N=96, H=6, H_kv=2, d_ff=260, vocab=64, seed=3)
    monkeypatch.setattr(spectra, "_GRAM_BLOCK", 24)
    monkeypatch.setattr(spectra, "_TILE", 40)
    monkeypatch.setattr(torch_kernels, "_TILE_CPU", (40, 56))
    calls = []
    for name in ("factored_products", "gram_eigenvalues"):
        real = getattr(torch_kernels, name)
        # spectra binds the kernels at import: patched where they are looked up
        monkeypatch.setattr(
            spectra, name, lambda *a, _real=real, _name=name, **kw: (calls.append(_name), _real(*a, **kw))[1]
        )
    reference = specbound.analyze(folder, threads=1)
    assert calls == []
    ours = specbound.analyze(folder, threads=1, device="cpu")
    assert calls.count("factored_products") == 2 * 2 and calls.count("gram_eigenvalues") == 2 * 3  # QK, OV; FF
    assert_same_analysis(ours, reference)
    ff = reference.matrices[reference.matrices["role"].str.startswith("FF")]
    assert set(ff["sv_method"]) == {"gram"}  # the bound column is there and was used
    assert (ff["sv_rel_error_bound"] > 0).all() and (ff["sv_rel_error_bound"] <= 1e-8).all()
    # the depth of the blocked sum enters the bound: width 24 over 260 columns = 24 + 11 + 1 = 36
    w = np.random.default_rng(0).standard_normal((96, 260))
    _, bound = spectra.gram_singular_values(w)
    _, bound_torch = spectra.gram_singular_values(w, kernel=KernelOptions(device="cpu"))
    assert bound_torch == pytest.approx(bound, rel=1e-12)
    u = np.finfo(float).eps / 2
    lam = np.linalg.eigvalsh(w @ w.T)
    expected = (36 * u / (1 - 36 * u) * np.sum(w**2) + 96 * u * lam[-1]) / lam[0]
    assert bound == pytest.approx(expected, rel=1e-10)


def test_torch_gram_eigenvalues_match_a_dense_oracle():
    w = np.random.default_rng(1).standard_normal((30, 200))
    lam = gram_eigenvalues(w, 16, "cpu")
    np.testing.assert_allclose(lam, np.linalg.svd(w, compute_uv=False) ** 2, rtol=1e-12)
    assert np.all(np.diff(lam) <= 0)


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_factored_spectra_match_dense_products_with_grouped_heads(device, monkeypatch):
    """Grouped-query attention (3 query heads per key/value head), uneven (1,1)-norm tiles: every
    head's spectrum and norms equal those of its dense N x N product."""

    monkeypatch.setattr(spectra, "_TILE", 7)
    monkeypatch.setattr(torch_kernels, "_TILE_CPU", (7, 9))
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((6, 5, 23)), rng.standard_normal((2, 5, 23))
    kv = np.arange(6) // 3
    out = spectra.factored_spectra(q, k, KernelOptions(device=device), b_index=kv)
    for h, s in enumerate(out):
        dense = q[h].T @ k[kv[h]]
        np.testing.assert_allclose(s.singular_values, np.linalg.svd(dense, compute_uv=False)[:5], rtol=1e-10)
        assert s.norm_1_1 == pytest.approx(np.abs(dense).sum(), rel=1e-12)
        assert s.norm_2_1 == pytest.approx(np.linalg.norm(dense, axis=0).sum(), rel=1e-12)


def test_gpu_panels_give_the_same_norms(monkeypatch):
    """The GPU's tile shape (whole panels of rows), run on the CPU: uneven panels, the same sums."""

    assert torch_kernels.tile_shape(4096, "cuda") == (4096, 4096) and torch_kernels.tile_shape(8192, "cuda") == (
        2048,
        8192,
    )
    monkeypatch.setattr(torch_kernels, "_TILE_CUDA_ENTRIES", 23 * 5)  # 5-row panels of a 23 x 23 product
    shapes = []
    monkeypatch.setattr(
        torch_kernels,
        "tile_shape",
        lambda n, kind, real=torch_kernels.tile_shape: shapes.append(real(n, "cuda")) or shapes[-1],
    )
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((4, 6, 23)), rng.standard_normal((2, 6, 23))
    kv = np.arange(4) // 2
    for h, s in enumerate(spectra.factored_spectra(q, k, KernelOptions(device="cpu"), b_index=kv)):
        assert s.norm_1_1 == pytest.approx(np.abs(q[h].T @ k[kv[h]]).sum(), rel=1e-12)
    assert shapes == [(5, 23)]


def test_svd_fallback_runs_on_the_device():
    w = np.random.default_rng(3).standard_normal((12, 40))
    w[0] = w[1]  # rank-deficient: the Gram bound cannot resolve the smallest value, so the SVD runs
    ours, ref = spectra.dense_spectrum(w, KernelOptions(device="cpu")), spectra.dense_spectrum(w, KernelOptions())
    assert ours.sv_method == ref.sv_method == "svd"
    np.testing.assert_allclose(ours.singular_values[:-1], ref.singular_values[:-1], rtol=1e-12)


def test_two_stage_eigensolver_matches_numpy(monkeypatch):
    if eigensolvers._two_stage_driver() is None:
        pytest.skip("this NumPy's OpenBLAS does not export LAPACKE_dsyevd_2stage")
    x = np.random.default_rng(4).standard_normal((50, 60))
    g = x @ x.T
    upper_garbage = g + np.triu(np.full_like(g, 7.0), 1)  # only the lower triangle may be read
    monkeypatch.setattr(eigensolvers, "TWO_STAGE_MIN", 10)
    assert eigensolvers.eigensolver_name(50) == "openblas dsyevd_2stage"
    before = upper_garbage.copy()
    lam = eigensolvers.symmetric_eigenvalues(upper_garbage)
    np.testing.assert_array_equal(upper_garbage, before)  # the input is left alone
    ref = np.linalg.eigvalsh(g)
    assert np.max(np.abs(lam - ref)) <= 50 * np.finfo(float).eps * ref[-1]
    assert eigensolvers.eigensolver_name(9) == "numpy dsyevd"


def test_small_orders_keep_numpys_eigensolver_bit_for_bit():
    x = np.random.default_rng(5).standard_normal((64, 80))
    g = x @ x.T
    assert 64 < TWO_STAGE_MIN
    np.testing.assert_array_equal(symmetric_eigenvalues(g), np.linalg.eigvalsh(g, UPLO="L"))


def test_feed_forward_read_ahead_gives_identical_spectra():
    rng = np.random.default_rng(6)
    ff = {
        "FF_gate": rng.standard_normal((16, 40)),
        "FF_up": rng.standard_normal((16, 40)),
        "FF_out": rng.standard_normal((40, 16)),
    }
    plain, ahead = feed_forward_spectra(ff, KernelOptions()), feed_forward_spectra(ff, KernelOptions(), prefetch=True)
    assert list(ahead) == list(plain)
    for role in plain:
        np.testing.assert_array_equal(ahead[role].singular_values, plain[role].singular_values)
        assert ahead[role].norm_1_1 == plain[role].norm_1_1


def test_reading_ahead_one_layer_at_a_time_matches_parallel_layers(tiny_dir):
    folder = tiny_dir("bert")
    one, two = specbound.analyze(folder, threads=1, jobs=1), specbound.analyze(folder, threads=1, jobs=2)
    assert one.bounds == two.bounds and one.matrices.equals(two.matrices)


def test_device_option_is_checked_and_not_part_of_the_key():
    with pytest.raises(SpecboundError, match=r"unknown device 'tpu'( \(a string\))?; choose one of numpy, cpu, cuda"):
        AnalysisOptions(device="tpu")
    assert "device" not in canonical_options(AnalysisOptions(device="cpu"))
    assert AnalysisOptions().device == "numpy"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_a_one_line_error(tiny_dir, capsys):
    with pytest.raises(SpecboundError, match="needs a CUDA GPU visible to torch"):
        specbound.analyze(tiny_dir("bert"), device="cuda")
    assert main(["analyze", str(tiny_dir("bert")), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert "use --device cpu or --device numpy" in err and len(err.splitlines()) == 1


def test_the_two_stage_eigensolver_may_overwrite_a_fortran_ordered_gram(monkeypatch):
    if eigensolvers._two_stage_driver() is None:
        pytest.skip("this BLAS exports no dsyevd_2stage")
    monkeypatch.setattr(eigensolvers, "TWO_STAGE_MIN", 10)
    x = np.random.default_rng(10).standard_normal((50, 60))
    lower = np.asfortranarray(np.tril(x @ x.T))  # what blocked_gram returns: the upper triangle zero
    kept = eigensolvers.symmetric_eigenvalues(lower)
    owned = lower.copy(order="F")
    np.testing.assert_array_equal(eigensolvers.symmetric_eigenvalues(owned, overwrite=True), kept)
    assert not np.array_equal(owned, lower)  # LAPACK worked in place: no copy was made
