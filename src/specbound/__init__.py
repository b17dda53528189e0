"""specbound: spectrum-adaptive generalization bounds for trained Transformers.

    >>> import specbound
    >>> result = specbound.analyze()            # the embedded all-MiniLM-L6-v2
    >>> result.bounds["spectral_adaptive"], result.bounds["edelman"]
    >>> result.matrices                          # one row per QK/OV head and FF matrix

Heavy frameworks (torch, transformers, matplotlib) are never imported by ``import specbound``.
"""

from .errors import SpecboundError

__version__ = "0.1.0"
__all__ = ["analyze", "Analysis", "SpecboundError", "__version__"]


def __getattr__(name):  # lazy: `import specbound` stays cheap
    if name == "analyze":
        from .pipeline import analyze

        return analyze
    if name == "Analysis":
        from .records import Analysis

        return Analysis
    raise AttributeError(f"module 'specbound' has no attribute {name!r}")
