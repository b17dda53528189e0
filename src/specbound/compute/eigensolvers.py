"""Eigenvalues of a symmetric float64 matrix (a Gram matrix), by the fastest exact LAPACK driver.

Every driver here is a Householder reduction to tridiagonal form followed by a tridiagonal solver,
so every one is backward stable: the computed eigenvalues are the exact ones of ``G + E`` with
``||E||_2 <= p(n) u ||G||_2`` (Demmel, *Applied Numerical Linear Algebra*, sec. 5.3; the two-stage
reduction of Haidar, Ltaief and Dongarra (SC 2011) applies two orthogonal reductions, dense to
band and band to tridiagonal, each with such a bound).  The Gram error bound of
:func:`specbound.compute.spectra.gram_singular_values` counts ``p(n) = n``, which covers each of
them; which driver ran changes only the last bits, well inside that bound.

The choice is by size (the timings behind it: docs/llm-scale.md; ``specbound bench --scenario
kernels`` measures them again).  Below ``TWO_STAGE_MIN`` the one-stage reduction is fastest (its
matrix fits in the cache) and the path is NumPy's ``dsyevd``; from ``TWO_STAGE_MIN`` on, the
two-stage driver of the same OpenBLAS (reached through ctypes: neither NumPy nor SciPy wraps it)
when the library exports it, else NumPy's.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from threadpoolctl import threadpool_info

# Smallest order at which the two-stage reduction is faster, from ``bench --scenario kernels`` on the
# project's AVX2 EPYC (docs/llm-scale.md, run 7): CPU seconds, one BLAS thread, two runs: slower up to
# n = 1280, a tie at 1536 (0.310 / 0.334 and 0.293 / 0.281), faster from 2048 on (0.687 / 0.779 and
# 0.681 / 0.793; 4.37 / 6.50 at 4096).  On the AVX-512 EPYC of runs 1-3 it was slower at 2048 and
# faster at 4096 (the one-stage reduction's matrix-vector products run from memory once G outgrows L3).
TWO_STAGE_MIN = 2048
_LAPACK_COL_MAJOR = 102


def symmetric_eigenvalues(g: np.ndarray, *, overwrite: bool = False) -> np.ndarray:
    """Eigenvalues of the symmetric ``g`` (its lower triangle is read), ascending.

    Parameters
    ----------
    g : ndarray, shape (n, n), float64
        Only the lower triangle is referenced; ``g`` is not modified unless ``overwrite``.
    overwrite : bool
        ``g`` may be destroyed: a Fortran-ordered ``g`` is then handed to the two-stage driver as it
        is, without the copy LAPACK would otherwise overwrite (an ``n = 4096`` Gram matrix: 134 MB).

    Returns
    -------
    ndarray, shape (n,)
    """
    n = g.shape[0]
    driver = _two_stage_driver() if n >= TWO_STAGE_MIN else None
    if driver is None:
        return np.linalg.eigvalsh(g, UPLO="L")
    # LAPACK overwrites its input; a Fortran-ordered copy is the lower triangle it reads ("L" of
    # the column-major view is "U" of a C-ordered array, the same entries for a symmetric g).
    owned = overwrite and g.flags.f_contiguous and g.dtype == np.float64
    a = g if owned else np.array(g, order="F", dtype=np.float64)
    w = np.empty(n)
    info = driver(_LAPACK_COL_MAJOR, b"N", b"L", n, a.ctypes.data, n, w.ctypes.data)
    if info != 0:  # > 0: the tridiagonal solver did not converge (never seen); < 0: a bad argument
        raise RuntimeError(f"LAPACK dsyevd_2stage failed (info={info}) on a {n} x {n} matrix")
    return w


def eigensolver_name(n: int) -> str:
    """The driver :func:`symmetric_eigenvalues` uses at order ``n``."""
    return "openblas dsyevd_2stage" if n >= TWO_STAGE_MIN and _two_stage_driver() else "numpy dsyevd"


@functools.lru_cache(maxsize=1)
def _two_stage_driver():
    """``LAPACKE_dsyevd_2stage`` of the OpenBLAS NumPy links, or None where it is not exported
    (another BLAS, or an OpenBLAS built without it)."""
    for info in threadpool_info():
        if info.get("internal_api") != "openblas" or "numpy" not in info.get("filepath", ""):
            continue
        try:
            lib = ctypes.CDLL(info["filepath"])
        except OSError:
            return None
        # NumPy's wheels bundle scipy-openblas built with 64-bit integers, whose names end in
        # "64_"; an unsuffixed name says nothing about its integer width, so it is not used.
        for name in ("scipy_LAPACKE_dsyevd_2stage64_", "LAPACKE_dsyevd_2stage64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int64
                fn.argtypes = [
                    ctypes.c_int,
                    ctypes.c_char,
                    ctypes.c_char,
                    ctypes.c_int64,
                    ctypes.c_void_p,
                    ctypes.c_int64,
                    ctypes.c_void_p,
                ]
                return fn
    return None
