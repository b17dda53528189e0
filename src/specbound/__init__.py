"""specbound: spectrum-adaptive generalization bounds for trained Transformers.

    >>> import specbound
    >>> result = specbound.analyze(progress=True)  # the embedded all-MiniLM-L6-v2
    >>> result                                     # in a notebook: headline bounds, per-role table, spectra
    >>> print(result)                              # the summary `specbound analyze` prints
    >>> result.bounds_frame()                      # every bound as one DataFrame
    >>> result.matrices                            # one row per QK/OV head and FF matrix
    >>> result.plot.spectra(), result.plot.contributions()
    >>> result.save("out"); specbound.Analysis.load("out")
    >>> specbound.compare("base/", "finetuned/")    # two or more models side by side (a notebook view too)

Heavy frameworks (torch, transformers, matplotlib) are never imported by ``import specbound``.
"""

from .errors import SpecboundError

__version__ = "0.1.0"
__all__ = [
    "analyze",
    "compare",
    "Analysis",
    "AnalysisOptions",
    "Comparison",
    "SpecboundError",
    "TowerAnalyses",
    "__version__",
]


def __getattr__(name):  # lazy: `import specbound` stays cheap
    if name == "analyze":
        from .pipeline import analyze

        return analyze
    if name == "compare":
        from .report.compare import compare

        return compare
    if name == "Comparison":
        from .report.compare import Comparison

        return Comparison
    if name == "Analysis":
        from .records import Analysis

        return Analysis
    if name == "TowerAnalyses":
        from .records import TowerAnalyses

        return TowerAnalyses
    if name == "AnalysisOptions":
        from .options import AnalysisOptions

        return AnalysisOptions
    raise AttributeError(f"module 'specbound' has no attribute {name!r}")


def __dir__():  # tab completion offers the API, which the lazy attributes would hide
    return sorted(__all__)
