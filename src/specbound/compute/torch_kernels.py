"""The linear algebra of :mod:`specbound.compute.spectra` in torch, float64, on ``cpu`` or ``cuda``.

The same quantities as the NumPy path, computed the same way (thin-QR cores, tiled (1,1)-norms,
the Gram matrix accumulated over the same column blocks, a backward-stable symmetric eigensolver),
so the same proven error bound holds; only the rounding differs.  ``device="cpu"`` runs exactly this
code on the CPU (MKL inside the torch wheel): it is how the GPU path is tested without a GPU.

torch is imported here only, and this module only when a torch device is asked for.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import SpecboundError

# Entries of one (1,1)-norm tile: 512 x 512 (2 MB, the L2 cache of one core) on the CPU, where
# every BLAS call re-packs its operands and a tile the cache holds is summed while hot; a GPU takes
# whole 4096-row panels (128 MB), fewer kernel launches.
_TILE_CPU = (512, 512)
_TILE_CUDA_ENTRIES = 1 << 24


@functools.lru_cache(maxsize=None)
def torch_device(device: str):
    """The ``torch.device`` for ``"cpu"`` or ``"cuda"``, checked to be usable."""
    try:
        import torch
    except ImportError:
        raise SpecboundError(
            f"device {device!r} needs torch, which is not installed: pip install torch, or use --device numpy"
        ) from None
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecboundError(
            "device 'cuda' needs a CUDA GPU visible to torch, found none "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
            "use --device cpu or --device numpy"
        )
    return torch.device(device)


def _to(array: np.ndarray, device: str):
    import torch

    return torch.from_numpy(np.asarray(array, dtype=np.float64)).to(torch_device(device))


def factored_products(
    a: np.ndarray, b: np.ndarray, a_index: np.ndarray, b_index: np.ndarray, *, with_norm_1_1: bool, device: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Spectra and norms of every ``A_{i(h)}.T @ B_{j(h)}``, the factors moved to ``device`` once.

    The cores ``R_a R_b.T`` come from batched Householder QR (``geqrf``; R's rows may differ in
    sign from LAPACK's ``geqrt`` on the NumPy path, which changes neither the cores' singular values
    nor ``||R_a b_k||``).

    Returns
    -------
    svals : ndarray, shape (H, k), descending
    col_norms : ndarray, shape (H, N)
        ``||A.T b_k|| = ||R_a b_k||`` for every column ``k``.
    norm_1_1 : ndarray, shape (H,)
        NaN unless ``with_norm_1_1``.
    """
    import torch

    at, bt = _to(a, device), _to(b, device)
    r_a = torch.linalg.qr(at.transpose(1, 2), mode="r")[1]  # A_i.T = Q_a R_a
    r_b = torch.linalg.qr(bt.transpose(1, 2), mode="r")[1]
    ai = torch.as_tensor(np.asarray(a_index), device=at.device)
    bi = torch.as_tensor(np.asarray(b_index), device=at.device)
    svals = torch.linalg.svdvals(r_a[ai] @ r_b[bi].transpose(1, 2)).cpu().numpy()
    col = torch.stack([torch.linalg.vector_norm(r_a[i] @ bt[j], dim=0) for i, j in zip(a_index, b_index)]).cpu().numpy()
    n11 = _norms_1_1(at, bt, a_index, b_index) if with_norm_1_1 else np.full(len(a_index), np.nan)
    return svals, col, n11


def tile_shape(n: int, device_type: str) -> tuple[int, int]:
    """``(rows, cols)`` of the (1,1)-norm tiles of an ``n x n`` product on a ``"cpu"`` or ``"cuda"``
    device: cache-sized tiles on a CPU, whole panels of ``_TILE_CUDA_ENTRIES`` entries on a GPU."""
    if device_type == "cuda":
        return max(1, min(n, _TILE_CUDA_ENTRIES // n)), n
    return _TILE_CPU


def _norms_1_1(at, bt, a_index, b_index) -> np.ndarray:
    """``sum |A_i.T @ B_j|`` for every head, over tiles of the ``N x N`` products (never whole on
    the CPU).  Each tile's entries are dot products of length ``d``; tile sums add in order."""
    import torch

    n = at.shape[2]
    rows, cols = tile_shape(n, at.device.type)
    out = np.empty(len(a_index))
    for h, (i, j) in enumerate(zip(a_index, b_index)):
        total = torch.zeros((), dtype=torch.float64, device=at.device)
        for r in range(0, n, rows):
            left = bt[j, :, r : r + rows].T  # rows of (A.T B).T = B.T A: the same entries
            for c in range(0, n, cols):
                total += (left @ at[i, :, c : c + cols]).abs_().sum()
        out[h] = float(total)
    return out


def gram_eigenvalues(short: np.ndarray, width: int, device: str) -> np.ndarray:
    """Eigenvalues (descending) of ``G = W W^T`` for ``W`` of shape ``(n, k)``, ``n <= k``.

    ``G`` is accumulated over column blocks of ``width`` exactly as the NumPy path does: each block's
    product is formed on its own (whatever order the BLAS sums its ``width`` terms in) and then
    added, so the summation depth is at most ``width + ceil(k / width) + 1`` and the bound of
    :func:`specbound.compute.spectra.gram_singular_values` holds.
    """
    import torch

    w = _to(short, device)
    k = w.shape[1]
    gram = w[:, :width] @ w[:, :width].T
    product = torch.empty_like(gram) if k > width else None
    for j in range(width, k, width):
        block = w[:, j : j + width]
        torch.matmul(block, block.T, out=product)
        gram += product
    del product, w
    lam = torch.linalg.eigvalsh(gram, UPLO="L")
    return lam.flip(0).cpu().numpy()


def singular_values(w: np.ndarray, device: str) -> np.ndarray:
    """All singular values of ``w`` (descending), LAPACK's SVD through torch."""
    import torch

    return torch.linalg.svdvals(_to(w, device)).cpu().numpy()
