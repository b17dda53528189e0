"""What a benchmark ran on: the CPU, the BLAS libraries NumPy and SciPy loaded, the kernel each picked,
its threads, and the environment variables that change them (``specbound bench`` prints and records
it with every scenario, docs/benchmarks.md).

OpenBLAS picks its kernels for the CPU it finds unless ``OPENBLAS_CORETYPE`` names others: an
environment that sets ``OPENBLAS_CORETYPE=Haswell`` runs AVX2 kernels on an AVX-512 CPU, and a 7B
benchmark then takes half as long again.  The kernel in use is threadpoolctl's ``architecture``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy
import scipy
import scipy.linalg
from threadpoolctl import threadpool_info

from ..compute.eigensolvers import eigensolver_name

# Variables that change which BLAS kernel runs, or with how many threads.
BLAS_ENVIRONMENT = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OPENBLAS_VERBOSE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MKL_ENABLE_INSTRUCTIONS",
)
# Variables that force a kernel other than the one the library picks for this CPU.
KERNEL_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "MKL_ENABLE_INSTRUCTIONS")
# The vector extensions the BLAS kernels are chosen by.
_CPU_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")


def cpu_description() -> tuple[str, list[str]]:
    """The CPU's model name and which of the vector extensions BLAS kernels are chosen by it has
    (from /proc/cpuinfo; the platform's processor string elsewhere, with no extensions)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "hardware", "cpu model") and not model:
                model = value.strip()
            elif key in ("flags", "features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown", [f for f in _CPU_FEATURES if f in flags]


def blas_libraries() -> list[dict]:
    """Every BLAS NumPy and SciPy loaded, as threadpoolctl sees it: which package ships it, its
    implementation and version, the kernel it runs (``architecture``) and its threads now."""

    out = []
    for info in threadpool_info():
        if info.get("user_api") != "blas":
            continue
        path = Path(info.get("filepath", ""))
        owner = next((p.name.removesuffix(".libs") for p in path.parents if p.name.endswith(".libs")), path.parent.name)
        out.append(
            {
                "package": owner,
                "library": info.get("internal_api"),
                "version": info.get("version"),
                "architecture": info.get("architecture"),
                "threads": info.get("num_threads"),
                "threading_layer": info.get("threading_layer"),
                "file": path.name,
            }
        )
    return out


def machine_info() -> dict:
    """The machine a benchmark runs on, as :func:`format_machine` prints it and ``--format json``
    records it (nothing here is timed)."""

    model, features = cpu_description()
    environment = {name: os.environ[name] for name in BLAS_ENVIRONMENT if name in os.environ}
    return {
        "cpu_model": model,
        "cpu_features": features,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "blas": blas_libraries(),
        "blas_environment": environment,
        "kernel_overrides": {k: v for k, v in environment.items() if k in KERNEL_OVERRIDES},
        "eigensolver_n4096": eigensolver_name(4096),
    }


def undo_overrides_command(overrides) -> str:
    """The command line that reruns a benchmark without the kernel overrides ``overrides``."""
    names = list(dict.fromkeys([*overrides, "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"]))
    return "env " + " ".join(f"-u {name}" for name in names) + " specbound bench ..."


def format_machine(info: dict) -> str:
    """The header every ``specbound bench`` scenario prints: CPU, each BLAS with its kernel and
    threads, NumPy/SciPy, and a warning naming any variable that forces a kernel."""
    features = ", ".join(info["cpu_features"]) or "none of " + "/".join(_CPU_FEATURES[:4])
    lines = [
        f"CPU               {info['cpu_model']} ({info['cpu_count']} CPUs; {features})",
        f"NumPy / SciPy     {info['numpy']} / {info['scipy']} (Python {info['python']})",
    ]
    for lib in info["blas"]:
        lines.append(
            f"BLAS ({lib['package']}){' ' * max(1, 11 - len(lib['package']))}{lib['library']} "
            f"{lib['version']}, kernel {lib['architecture']}, {lib['threads']} thread(s) by default"
        )
    if not info["blas"]:
        lines.append("BLAS              not seen by threadpoolctl")
    lines.append(f"eigensolver       {info['eigensolver_n4096']} at n = 4096")
    if info["blas_environment"]:
        lines.append("environment       " + " ".join(f"{k}={v}" for k, v in info["blas_environment"].items()))
    if info["kernel_overrides"]:
        lines.append(
            f"WARNING           {', '.join(info['kernel_overrides'])} forces BLAS kernels other than those "
            f"chosen for this CPU; for its own: {undo_overrides_command(info['kernel_overrides'])}"
        )
    return "\n".join(lines)
