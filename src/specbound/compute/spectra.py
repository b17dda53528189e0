"""Exact spectra and norms of the matrices the bounds see (docs/spec.md sections 1-2).

Two kinds of matrix arrive here:

* a *factored* product ``A.T @ B`` of two thin ``(d, N)`` factors (the per-head ``QK`` and ``OV``
  matrices, ``N x N`` with rank at most ``d``).  Its spectrum comes from the ``d x d`` core
  ``R_a @ R_b.T`` of two thin QR factorisations and its column norms from ``R_a @ B``; the ``N x N``
  product is never held in memory whole (the entrywise (1,1)-norm streams it in column blocks);
* a *dense* matrix ``W`` (the feed-forward matrices), whose singular values come from LAPACK.

Everything is computed in float64 (a dense matrix may arrive in float32 or float16, as stored, and is
upcast a block at a time).  ``device`` says where the heavy linear algebra runs: ``"numpy"`` (NumPy and
SciPy's LAPACK, the default) or torch on ``"cpu"`` / ``"cuda"`` (:mod:`.torch_kernels`, the same
method and blocking, so the same proven bounds).  A spectrum keeps the singular values it computed together with
``dim``, the length of the full spectrum (``min`` of the represented matrix's shape): a factored ``N x N``
product has ``d`` computed values and ``N - d`` exact zeros.  ``dim`` enters the rank tolerance,
so the factored and the dense route give the same numerical rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import lapack
from scipy.linalg.blas import dsyrk

from ..options import EXACT_SVD, KernelOptions
from .eigensolvers import symmetric_eigenvalues
from .torch_kernels import factored_products, gram_eigenvalues, singular_values

# Entries of a block of a dense matrix held at once for its column norms and abs-sum (1 MB).
_BLOCK_ENTRIES = 1 << 17
# Tiles of an N x N product for its (1,1)-norm: at most 512 x 512 (2 MB, one core's L2 cache).  Every
# BLAS call re-packs its operands, so thin row blocks spanning all N columns would re-pack the whole
# d x N factor each time (timings of the tile sizes: docs/benchmarks.md).  A product with N <= 512
# is one tile; a longer side is cut into equal tiles (N = 768: two of 384, not 512 + 256, 0.8x the time).
_TILE = 512
# Columns per block of the feed-forward Gram product (see gram_singular_values): the proven error
# bound grows with b + k/b, the time with the number of blocks; 512 keeps both small (MiniLM's
# bounds <= 2e-9, a 768 x 3072 spectrum within 10% of one unblocked product).
_GRAM_BLOCK = 512


@dataclass(frozen=True)
class MatrixSpectrum:
    """Singular values and norms of one matrix.

    Attributes
    ----------
    shape : (int, int)
        Shape of the represented matrix, row-vector orientation.
    singular_values : ndarray, shape (k,)
        Computed singular values, descending, ``k <= dim``; the ``dim - k`` others are exactly zero.
    norm_2_1 : float
        Sum over columns of the column's l2 norm.
    norm_1_1 : float
        Sum of absolute entries (NaN when not computed).
    sv_method : str
        ``"svd"`` (LAPACK), ``"core"`` (SVD of a factored product's core) or ``"gram"``
        (eigenvalues of the smaller Gram matrix, see :func:`gram_singular_values`).
    sv_rel_error_bound : float
        Proven bound on ``|s_hat_i - s_i| / s_hat_i`` for the ``"gram"`` method (0 otherwise).
    kept : ndarray, optional
        When set, the values ``S_p`` sums over and whose count is the rank, already decided (a rotary
        head's envelope, :class:`RotaryQKSpectrum`: certified upper bounds that must not be
        thresholded again; docs/rotary.md).  None: the singular values above the rank tolerance.
    lipschitz : float, optional
        When set, the factor the propagation reads for this matrix (``Lambda``, ``gamma*``, ``alpha``)
        in place of its spectral norm: a query/key-normalised head's logit Lipschitz factor
        ``kappa_h`` (docs/theory.md 3d).  Every norm of the spectrum stays that of the matrix itself.
    lipschitz_frobenius : float, optional
        Its Frobenius-side analogue (``kappa_F >= kappa``), read by the Frobenius product in place of
        the Frobenius norm.
    """

    shape: tuple[int, int]
    singular_values: np.ndarray
    norm_2_1: float
    norm_1_1: float
    sv_method: str = "svd"
    sv_rel_error_bound: float = 0.0
    kept: np.ndarray | None = None
    lipschitz: float | None = None
    lipschitz_frobenius: float | None = None

    @property
    def dim(self) -> int:
        """Length of the full spectrum, ``min(shape)``."""
        return min(self.shape)

    @property
    def spectral_norm(self) -> float:
        s = self.singular_values
        return float(s[0]) if s.size else 0.0

    @property
    def lipschitz_factor(self) -> float:
        """What ``Lambda``, ``gamma*`` and ``alpha`` read for this matrix: its spectral norm, or the
        head's own factor where its logit is not the bilinear form of the matrix (QK-norm: ``kappa_h``)."""
        return self.spectral_norm if self.lipschitz is None else float(self.lipschitz)

    @property
    def lipschitz_factor_frobenius(self) -> float:
        """The Frobenius-side analogue of :attr:`lipschitz_factor` (the Frobenius product's): the
        Frobenius norm, or ``kappa_F >= kappa_h`` for a QK-norm head (docs/theory.md 3d)."""
        return self.frobenius_norm if self.lipschitz_frobenius is None else float(self.lipschitz_frobenius)

    @property
    def frobenius_norm(self) -> float:
        return float(np.sqrt(np.sum(self.singular_values**2)))

    def nuclear_norm(self, rank_tol: float) -> float:
        """``S_1``: the sum of the singular values above the rank tolerance ``tau`` (docs/spec.md section 2;
        the values ``S_p`` and the rank count, ``kept`` where already decided), not of the rounding noise a
        rank-deficient product's SVD also returns."""
        kept = (
            self.kept
            if self.kept is not None
            else self.singular_values[self.singular_values > rank_threshold(self.singular_values, self.dim, rank_tol)]
        )
        return float(np.sum(kept))

    @property
    def stable_rank(self) -> float:
        s1 = self.spectral_norm
        return float(np.sum(self.singular_values**2) / s1**2) if s1 > 0 else 0.0


ROTARY_METHODS = {"exact_over_offsets": "rotary_exact_over_offsets", "product_bound": "rotary_product_bound"}


@dataclass(frozen=True)
class RotaryQKSpectrum(MatrixSpectrum):
    """A rotary head's QK quantities, each an upper bound on that of ``X(delta) = W_Q^T M(delta) W_K``
    at every offset ``|delta| < max_positions`` (docs/rotary.md section 3).

    ``singular_values`` holds the Horn envelope ``e_i = s_i(W_Q) s_i(W_K)``, which is **not** a list
    of singular values: it bounds partial sums of powers (``sum_{i<=j} s_i(X)^p <= sum_{i<=j} e_i^p``),
    not each index.  ``kept = e[:rank_bound]`` is what ``S_p`` sums over.  The norms reported are
    the fields below, never recomputed from the envelope.

    Attributes
    ----------
    spectral_sup : float
        ``max_delta ||X(delta)||_2`` (exact) or ``||W_Q||_2 ||W_K||_2``.
    sigma_bounds : ndarray, shape (k,)
        Per-index bounds ``>= s_i(X(delta))`` at every offset.
    frobenius_sup, nuclear_sup, stable_rank_sup : float
        Bounds on ``||X||_F``, ``||X||_*`` and ``||X||_F^2 / ||X||_2^2`` at every offset.
    argmax_offset : int, tuple of int or None
        An offset attaining ``spectral_sup`` (exact method only; a vector with several position axes).

    ``sv_method`` is ``"rotary_exact_over_offsets"`` (maxima over every integer offset, from the
    ``d_h x d_h`` cores) or ``"rotary_product_bound"`` (bounds valid for every orthogonal matrix in
    place of ``M(delta)``).
    """

    spectral_sup: float = 0.0
    sigma_bounds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    frobenius_sup: float = 0.0
    nuclear_sup: float = 0.0
    stable_rank_sup: float = 0.0
    argmax_offset: int | tuple[int, ...] | None = None

    @property
    def envelope(self) -> np.ndarray:
        """The Horn envelope (``singular_values``; not singular values), shape ``(k,)``."""
        return self.singular_values

    @property
    def spectral_norm(self) -> float:
        return float(self.spectral_sup)

    @property
    def frobenius_norm(self) -> float:
        return float(self.frobenius_sup)

    def nuclear_norm(self, rank_tol: float) -> float:
        """``nuclear_sup``: a bound on ``||X(delta)||_*`` at every offset (``rank_tol`` is already in it)."""
        return float(self.nuclear_sup)

    @property
    def stable_rank(self) -> float:
        return float(self.stable_rank_sup)

    @property
    def exact_over_offsets(self) -> bool:
        return self.sv_method == ROTARY_METHODS["exact_over_offsets"]


def rank_threshold(singular_values: np.ndarray, dim: int, rank_tol: float) -> float:
    """The paper's tolerance ``tau = rank_tol * dim * max(s_1, 1)`` (docs/spec.md section 2)."""
    s1 = float(singular_values[0]) if singular_values.size else 0.0
    return rank_tol * max(dim, 1) * max(s1, 1.0)


def numerical_rank(singular_values: np.ndarray, dim: int, rank_tol: float) -> int:
    """``#{s_i > tau}`` with the tolerance of :func:`rank_threshold`."""
    tau = rank_threshold(singular_values, dim, rank_tol)
    return int(np.count_nonzero(singular_values > tau))


def _r_factor(stacked: np.ndarray) -> np.ndarray:
    """R of the thin QR of each ``(N, d)`` matrix in an ``(H, N, d)`` stack, shape ``(H, k, d)``
    with ``k = min(N, d)``.

    LAPACK's ``geqrt`` (Householder, recursive panels) through SciPy: about twice as fast as
    numpy's ``qr`` on ``768 x 64`` heads, where the blocked ``geqrf`` spends its time in
    matrix-vector panel updates.  The ``(N, d)`` slices of a stack of transposed ``(d, N)``
    factors are Fortran-ordered already and go to LAPACK as they are.
    """

    heads, n, d = stacked.shape
    k = min(n, d)
    out = np.empty((heads, k, d))
    block = max(1, min(16, k))
    for h in range(heads):
        factored, _, info = lapack.dgeqrt(block, stacked[h])
        if info != 0:  # only for an invalid argument, which the shapes above rule out
            raise RuntimeError(f"LAPACK dgeqrt failed (info={info}) on a {n} x {d} factor")
        out[h] = np.triu(factored[:k])
    return out


def factored_spectra(
    a: np.ndarray,
    b: np.ndarray,
    kernel: KernelOptions = EXACT_SVD,
    *,
    a_index: np.ndarray | None = None,
    b_index: np.ndarray | None = None,
    with_norm_1_1: bool = True,
) -> list[MatrixSpectrum]:
    """Spectra of ``A_{i(h)}.T @ B_{j(h)}`` for every head ``h``, never forming the products whole.

    Parameters
    ----------
    a : ndarray, shape (H_a, d, N)
    b : ndarray, shape (H_b, d, M)
        Per-head factors in float64 (for ``QK``: ``W_Q^h`` and ``W_K^h``; for ``OV``: ``W_V^h`` and
        ``W_O^h``; ``M = N`` for both; a low-rank update's two factors have ``M != N``).
    a_index, b_index : ndarray of int, shape (H,), optional
        Which factor each head uses (grouped-query attention: key/value head ``h // group``);
        default: head ``h`` uses factor ``h``.  Each distinct factor is factorised once.
    with_norm_1_1 : bool
        Stream each product in column blocks to get its entrywise (1,1)-norm
        (``O(N^2 d)`` work per head; the spectrum itself costs ``O(N d^2)``).
    kernel : KernelOptions
        ``kernel.device``: where the QR factors, cores and (1,1)-norm tiles are computed (default NumPy).

    Returns
    -------
    list of MatrixSpectrum, one per head, each of shape (N, M).
    """
    heads = len(a_index) if a_index is not None else len(b_index) if b_index is not None else a.shape[0]
    a_index = np.arange(heads) if a_index is None else np.asarray(a_index)
    b_index = np.arange(heads) if b_index is None else np.asarray(b_index)
    shape = (int(a.shape[2]), int(b.shape[2]))
    if kernel.device != "numpy":
        svals, col_norms, n11 = factored_products(
            a, b, a_index, b_index, with_norm_1_1=with_norm_1_1, device=kernel.device
        )
        return [
            MatrixSpectrum(shape, svals[h], float(col_norms[h].sum()), float(n11[h]), sv_method="core")
            for h in range(heads)
        ]
    r_a = _r_factor(np.swapaxes(a, 1, 2))  # (H_a, d', d'), A_i.T = Q_a R_a
    r_b = _r_factor(np.swapaxes(b, 1, 2))
    cores = r_a[a_index] @ np.swapaxes(r_b[b_index], 1, 2)  # same nonzero spectrum as A.T @ B
    svals = np.linalg.svd(cores, compute_uv=False)
    out = []
    for h, (i, j) in enumerate(zip(a_index, b_index)):
        # Column k of A.T @ B is A.T b_k = Q_a (R_a b_k), so its norm is ||R_a b_k||.
        col_norms = np.sqrt(column_sq_norms(r_a[i] @ b[j]))
        n11 = _streamed_norm_1_1(a[i], b[j]) if with_norm_1_1 else float("nan")
        out.append(MatrixSpectrum(shape, svals[h], float(col_norms.sum()), n11, sv_method="core"))
    return out


def _row_blocks(w: np.ndarray):
    """Blocks of at most ``_BLOCK_ENTRIES`` entries along the array's contiguous layout (rows of a
    C-ordered array, columns of a transposed view), so no full-size temporary is ever made."""
    axis = 1 if (w.flags.f_contiguous and not w.flags.c_contiguous) else 0
    step = max(1, _BLOCK_ENTRIES // max(w.shape[1 - axis], 1))
    for i in range(0, w.shape[axis], step):
        yield axis, (w[i : i + step] if axis == 0 else w[:, i : i + step])


def column_sq_norms(w: np.ndarray) -> np.ndarray:
    """Squared l2 norm of every column of ``w``, shape (w.shape[1],), computed blockwise in float64
    (a float32 ``w``, as stored, is upcast one block at a time: the same numbers as its float64 copy)."""
    return _block_passes(w, with_abs_sum=False)[0]


def column_sq_norms_and_abs_sum(w: np.ndarray) -> tuple[np.ndarray, float]:
    """:func:`column_sq_norms` of ``w`` and the sum of its absolute entries, in one pass over its
    blocks (each upcast once; the same sums, in the same order, as two passes give)."""
    return _block_passes(w, with_abs_sum=True)


def _block_passes(w: np.ndarray, *, with_abs_sum: bool) -> tuple[np.ndarray, float]:
    """The column norms and (``with_abs_sum``; else 0) the abs-sum of ``w``, block by block."""
    parts, acc, abs_sum = [], np.zeros(w.shape[1]), 0.0
    for axis, block in _row_blocks(w):
        wide = np.asarray(block, dtype=np.float64)
        if axis == 0:
            acc += np.einsum("ij,ij->j", wide, wide)
        else:
            parts.append(np.einsum("ij,ij->j", wide, wide))
        if with_abs_sum:  # a fresh upcast is made absolute in place, a view of w into a temporary
            abs_sum += float(np.abs(wide, out=None if wide is block else wide).sum())
    return (np.concatenate(parts) if parts else acc), abs_sum


def _streamed_norm_1_1(a: np.ndarray, b: np.ndarray) -> float:
    """``sum |A.T @ B|`` over tiles of at most ``_TILE x _TILE`` (:func:`_tile_side`), each written into
    one reused buffer and made absolute in place (no temporaries, no copies of the factors).

    The tiles are tiles of the transpose ``B.T @ A`` (the same entries): ``B[:, j:j+s].T`` and
    ``A[:, i:i+t]`` go to the BLAS as they are stored.  Each entry is a BLAS dot product of length
    ``d``; the tile sums (NumPy's pairwise summation within a tile) add up in order: at N = 4096,
    64 sums of 2^18 entries each.
    """
    n_rows, n_cols = a.shape[1], b.shape[1]
    rows, cols = _tile_side(n_cols), _tile_side(n_rows)
    total = 0.0
    buffer = np.empty((rows, cols))
    for j in range(0, n_cols, rows):
        block = b[:, j : j + rows].T
        for i in range(0, n_rows, cols):
            right = a[:, i : i + cols]
            out = buffer[: block.shape[0], : right.shape[1]]
            np.matmul(block, right, out=out)
            total += float(np.abs(out, out=out).sum())
    return total


def _tile_side(n: int) -> int:
    """The side of the tiles an axis of length ``n`` is cut into: ``n`` itself up to ``_TILE``, else
    the smallest number of tiles of at most ``_TILE`` made equal (the last one shorter by the rest)."""
    n = max(n, 1)
    return -(-n // -(-n // _TILE))


def gram_singular_values(
    w: np.ndarray, frobenius_sq: float | None = None, kernel: KernelOptions = EXACT_SVD
) -> tuple[np.ndarray, float]:
    """Singular values from the eigenvalues of the smaller Gram matrix, with an error bound.

    For ``W`` of shape ``(n, k)``, ``n <= k``, ``G = W W^T`` is accumulated over ``ceil(k / b)``
    column blocks of width ``b = _GRAM_BLOCK`` (one BLAS product each).  Every entry is then a sum
    whose summation tree has depth at most ``b + k/b + 1``, whatever order the BLAS uses inside a
    block, so ``|E| <= gamma_{b + k/b + 1} |W| |W|^T`` (Higham, *Accuracy and Stability*, sec. 3.1
    and 4.2; ``gamma_j = j u / (1 - j u)``) and ``||E||_2 <= gamma ||W||_F^2``.  The symmetric
    eigensolver is backward stable (error ``<= n u ||G||_2``, counted generously; every driver of
    :mod:`.eigensolvers` and torch's ``eigvalsh`` is a Householder tridiagonal reduction and so
    qualifies).  Weyl's inequality then gives
    ``|s_hat_i^2 - s_i^2| <= delta`` with ``delta = gamma ||W||_F^2 + n u lambda_max``, so
    ``|s_hat_i - s_i| <= delta / s_hat_i`` and the relative error of every value is at most
    ``delta / s_hat_min^2``.

    Every step is a numpy call that releases the GIL, so layers analysed in parallel threads
    overlap fully.  Extra memory: two ``n x n`` float64 matrices and one ``n x b`` block (``w`` may be
    float32 or float16, as stored: it is upcast one block at a time, never whole).

    ``frobenius_sq``: ``||W||_F^2`` when the caller has it (computed here otherwise).  ``kernel.device``:
    where ``G`` and its eigenvalues are computed (torch: the same blocks, so the same bound).

    Returns
    -------
    singular_values : ndarray, shape (n,), descending
    rel_error_bound : float
        ``delta / s_hat_min^2`` (inf when the smallest value is not resolved).
    """
    short = w if w.shape[0] <= w.shape[1] else w.T
    n, k = short.shape
    u = np.finfo(np.float64).eps / 2
    width = min(_GRAM_BLOCK, max(k, 1))
    if kernel.device != "numpy":
        lam = gram_eigenvalues(short, width, kernel.device)
    else:
        gram = blocked_gram(short, width)
        lam = symmetric_eigenvalues(gram, overwrite=True)[::-1]
        del gram
    depth = width + -(-k // width) + 1
    gamma = depth * u / (1 - depth * u)
    if frobenius_sq is None:
        frobenius_sq = float(np.sum(column_sq_norms(short)))
    delta = gamma * frobenius_sq + n * u * max(float(lam[0]), 0.0)
    s = np.sqrt(np.clip(lam, 0.0, None))
    bound = delta / lam[-1] if lam[-1] > delta else np.inf
    return s, float(bound)


def blocked_gram(short: np.ndarray, width: int) -> np.ndarray:
    """The lower triangle of ``W W^T`` for ``W`` of shape ``(n, k)``, summed over column blocks of
    ``width``: each block's product is formed on its own (one BLAS call, whatever order it sums
    ``width`` terms in) and then added, the summation tree whose depth :func:`gram_singular_values`
    bounds.  Each product is a symmetric rank-``width`` update (``dsyrk``: the lower triangle only,
    half the flops of a general product) of the block upcast to float64 (``W`` may be stored in
    float32 or float16; no float64 copy of it is made whole), and only the lower triangles are added.

    Returns an ``(n, n)`` Fortran-ordered float64 array whose strict upper triangle is zero (what
    :func:`~.eigensolvers.symmetric_eigenvalues` reads is the lower one).
    """
    n, k = short.shape
    gram = _block_gram(short[:, :width], np.zeros((n, n), order="F"))
    product = np.zeros((n, n), order="F") if k > width else None
    for j in range(width, k, width):
        _add_lower(gram, _block_gram(short[:, j : j + width], product))
    return gram


def _block_gram(block: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``block @ block.T`` (its lower triangle) into the Fortran-ordered float64 ``out``, by ``dsyrk``
    on the block as it is laid out: a Fortran-ordered block as ``A A^T``, any other one as a
    C-ordered float64 copy (``A^T A`` of its transpose), so that the BLAS reads it without a second copy."""

    if block.flags.f_contiguous:
        a, trans = np.asfortranarray(block, dtype=np.float64), 0
    else:
        a, trans = np.ascontiguousarray(block, dtype=np.float64).T, 1
    return dsyrk(1.0, a, beta=0.0, c=out, trans=trans, lower=1, overwrite_c=1)


# Columns of the lower-triangle addition per step (each step's slices stay in the cache).
_ADD_COLUMNS = 256


def _add_lower(gram: np.ndarray, product: np.ndarray) -> None:
    """``gram += product`` on the lower triangle (and the diagonal tiles' upper corners, zero in
    both) of two Fortran-ordered ``(n, n)`` arrays, column tile by column tile."""
    n = gram.shape[0]
    for j in range(0, n, _ADD_COLUMNS):
        tile = gram[j:, j : j + _ADD_COLUMNS]
        tile += product[j:, j : j + _ADD_COLUMNS]


def dense_spectrum(w: np.ndarray, kernel: KernelOptions = EXACT_SVD) -> MatrixSpectrum:
    """Spectrum and norms of a dense float64 matrix ``W`` (row-vector orientation).

    With ``kernel.gram_rtol > 0`` the singular values come from :func:`gram_singular_values` (about
    4x faster on a ``768 x 3072`` matrix) whenever its proven relative error bound is at most
    ``gram_rtol`` for every value (which also makes the matrix certainly full rank); otherwise, and
    by default (:data:`~specbound.options.EXACT_SVD`), from LAPACK's SVD.  ``kernel.device``: where
    the Gram path or the SVD runs (the column norms and the abs-sum, memory-bound passes, always run
    in NumPy).
    """
    method, bound = "svd", 0.0
    col_sq, abs_sum = column_sq_norms_and_abs_sum(w)
    if kernel.gram_rtol > 0:
        svals, bound = gram_singular_values(w, frobenius_sq=float(np.sum(col_sq)), kernel=kernel)
        method = "gram"
    if method == "svd" or bound > kernel.gram_rtol:
        svals, method, bound = _singular_values(w, kernel.device), "svd", 0.0
    return MatrixSpectrum(
        shape=(int(w.shape[0]), int(w.shape[1])),
        singular_values=svals,
        norm_2_1=float(np.sqrt(col_sq).sum()),
        norm_1_1=abs_sum,
        sv_method=method,
        sv_rel_error_bound=bound,
    )


def _singular_values(w: np.ndarray, device: str) -> np.ndarray:
    if device == "numpy":
        return np.linalg.svd(np.asarray(w, dtype=np.float64), compute_uv=False)

    return singular_values(w, device)
