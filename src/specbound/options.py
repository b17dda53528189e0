"""Every analysis option in one place: its default, its check, its command-line flag and whether it
changes the numbers (and so belongs in a results store's record key).

``specbound.analyze(source, options, **overrides)``, the command line (``analyze`` and ``sweep``
flags), sweep TOML ``[options]`` tables and the store's record keys all derive from
:class:`AnalysisOptions`: a new option is one field here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from numbers import Integral, Real
from typing import Any, Mapping

from .errors import SpecboundError, refuse_oversized_integers

METHODS = ("factored", "dense")
# Where the linear algebra runs: "numpy" (NumPy/SciPy LAPACK, the default) or torch in float64 on
# "cpu" (MKL inside the torch wheel) or "cuda".  Every device computes the same quantities with the
# same proven Gram error bound; they differ only in rounding, far below that bound (docs/llm-scale.md).
DEVICES = ("numpy", "cpu", "cuda")
# Feed-forward singular values from the Gram matrix only when each is proven accurate to 1e-8
# relative (in practice they agree with the SVD to ~1e-14); see compute.spectra.gram_singular_values.
DEFAULT_GRAM_RTOL = 1e-8
DEFAULT_RANK_TOL = 1e-10
# The finest Schatten grid accepted: 2m + 1 values of p per matrix are evaluated and stored (the
# curves table), so m bounds time and memory; the default m = ceil(L + ln N) is below 200 for every
# published model, and a grid finer than 1/10000 moves no minimum measurably.
GRID_M_MAX = 10_000
# The options that were in every record key from the first store format on, in their order; any
# other option enters a key only when it differs from its default, so existing stores keep their keys.
LEGACY_KEY_OPTIONS = ("grid_m", "rank_tol", "l_phi", "method", "gram_rtol", "arch_spec")
# The largest sample size accepted: the gap bound's terms are computed in floating point.
N_MAX = 10**300


def _option(default, help: str, *, key: bool, kind: str, flag: str, metavar: str | None = None,
            cli_default: Any = None, choices: tuple | None = None, group: str | None = None):
    """A dataclass field with the metadata the command line and the store read.

    ``kind`` says how the command line parses the flag's text: ``positive_int``, ``number``,
    ``choice``, ``path`` or ``jobs`` (a positive integer or ``auto``).
    """
    return field(default=default, metadata={
        "help": help, "key": key, "kind": kind, "flag": flag, "metavar": metavar, "cli_default": cli_default,
        "choices": choices, "group": group})


@dataclass(frozen=True)
class AnalysisOptions:
    """How to analyse a checkpoint (every field has its default here and nowhere else).

    Attributes
    ----------
    grid_m : int, optional
        Resolution of the Schatten grid ``{0, 1/m, ..., 2}``; default ``ceil(L + ln N)`` (docs/spec.md 4).
    rank_tol : float
        Relative rank tolerance, ``tau = rank_tol * dim * max(s_1, 1)`` (docs/spec.md 2).
    l_phi : float, optional
        Activation Lipschitz constant; default from config.json's ``hidden_act`` (GELU: 1.13).
    method : {"factored", "dense"}
        QK/OV spectra from ``d_h x d_h`` cores, or dense ``N x N`` SVDs (the slow reference).
    gram_rtol : float
        Largest proven relative error accepted from the feed-forward Gram path; 0 forces SVDs.
    arch_spec : path or ArchSpec, optional
        A family spec file; by default chosen from config.json's ``model_type``.
    init : path, optional
        A checkpoint of the same architecture holding the initial weights ``W0``: every bound with a
        norm of ``W - W0`` in it is also computed on the differences.
    n, margin : int, float, optional
        Sample size and ramp-loss margin: given both, every bound with a margin-bound form becomes a
        generalisation-gap bound (docs/spec.md 7).
    delta : float
        Failure probability of the gap bound.
    lead_constant, confidence_constant : float
        The absolute constants of the gap bound's two terms, unstated by the sources (default 1).
    threads : int, optional
        BLAS threads (None: the BLAS default; with ``jobs > 1``, the cores divided among the jobs).
    jobs : int or "auto"
        Layers analysed at once, in threads; the numbers are identical, peak memory holds ``jobs``
        layers.  ``"auto"``: one per core as memory allows (the command line's default).
    device : {"numpy", "cpu", "cuda"}
        Where the Gram products, eigenvalues, per-head cores and (1,1)-norm blocks run: NumPy/SciPy
        (default) or torch in float64 on the CPU or a CUDA GPU.  Not part of a record's key: the
        devices differ only in rounding, within the proven error bound each record reports.
    """

    grid_m: int | None = _option(None, "Schatten grid resolution (default ceil(L + ln N))", key=True, kind="positive_int",
                                 flag="--grid-m", metavar="M")
    rank_tol: float = _option(DEFAULT_RANK_TOL, "relative rank tolerance (default 1e-10)", key=True, kind="number",
                              flag="--rank-tol")
    l_phi: float | None = _option(None, "activation Lipschitz constant (default from hidden_act; GELU 1.13)",
                                  key=True, kind="number", flag="--l-phi")
    method: str = _option("factored", "QK/OV spectra from d_h x d_h cores (default) or dense N x N SVDs "
                          "(slow reference)", key=True, kind="choice", flag="--method", choices=METHODS)
    gram_rtol: float = _option(DEFAULT_GRAM_RTOL, "feed-forward singular values from the Gram matrix when "
                               "proven accurate to this relative error (default 1e-8); 0 forces exact SVDs",
                               key=True, kind="number", flag="--gram-rtol")
    arch_spec: Any = _option(None, "architecture spec file for a family not shipped (`specbound arch infer` "
                             "drafts one)", key=True, kind="path", flag="--arch-spec", metavar="FILE")
    init: Any = _option(None, "model folder with the initial weights W0: also compute every bound on W - W0",
                        key=True, kind="path", flag="--init", metavar="SOURCE")
    n: int | None = _option(None, "number of training sequences", key=True, kind="positive_int", flag="--n", group="gap")
    margin: float | None = _option(None, "ramp-loss margin > 0", key=True, kind="number", flag="--margin", group="gap")
    delta: float = _option(0.05, "failure probability (default 0.05)", key=True, kind="number", flag="--delta", group="gap")
    lead_constant: float = _option(1.0, "absolute constant of the leading term, unstated by the sources "
                                   "(default 1)", key=True, kind="number", flag="--lead-constant", group="gap")
    confidence_constant: float = _option(1.0, "absolute constant of the confidence term, unstated by the "
                                         "sources (default 1)", key=True, kind="number", flag="--confidence-constant",
                                         group="gap")
    threads: int | None = _option(None, "BLAS threads per job (default: the BLAS default; with --jobs, the "
                                  "cores divided among the jobs)", key=False, kind="positive_int", flag="--threads")
    jobs: int | str = _option(1, "layers analysed at once, in threads: the same numbers, about J times faster "
                              "on J cores, peak memory J layers (default auto: one per core, as half the "
                              "available memory allows at a layer's float64 weights each)", key=False, kind="jobs",
                              flag="--jobs", metavar="J", cli_default="auto")
    device: str = _option("numpy", "where the linear algebra runs: numpy (default), or torch float64 on cpu or "
                          "cuda (same numbers up to rounding, within the reported error bounds)", key=False,
                          kind="choice", flag="--device", choices=DEVICES)

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731  (frozen)
        for f in fields(self):  # before any check quotes a value: such an integer cannot be printed
            refuse_oversized_integers(getattr(self, f.name), f.name, "pass a value in its range")
        if self.grid_m is not None:
            if not _is_int(self.grid_m) or not 1 <= self.grid_m <= GRID_M_MAX:
                raise SpecboundError(f"grid_m must be an integer from 1 to {GRID_M_MAX} (the grid is "
                                     f"{{0, 1/m, ..., 2}}), got {self.grid_m!r}")
            set_("grid_m", int(self.grid_m))
        if not (_is_real(self.rank_tol) and 0 <= self.rank_tol < 1):
            raise SpecboundError(f"rank_tol must be a number in [0, 1), got {self.rank_tol!r}")
        set_("rank_tol", float(self.rank_tol))
        if self.l_phi is not None:
            if not (_is_real(self.l_phi) and 0 < self.l_phi < math.inf):
                raise SpecboundError(f"l_phi must be a positive finite number (GELU: 1.13), got {self.l_phi!r}")
            set_("l_phi", float(self.l_phi))
        if self.method not in METHODS:
            raise SpecboundError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not (_is_real(self.gram_rtol) and 0 <= self.gram_rtol < 1):
            raise SpecboundError(f"gram_rtol must be a number in [0, 1) (0 forces exact SVDs), got {self.gram_rtol!r}")
        set_("gram_rtol", float(self.gram_rtol))
        if self.threads is not None and (not _is_int(self.threads) or self.threads < 1):
            raise SpecboundError(f"threads must be a positive integer, got {self.threads!r}")
        if self.jobs != "auto" and (not _is_int(self.jobs) or self.jobs < 1):
            raise SpecboundError(f"jobs must be a positive integer (layers analysed at once) or 'auto', "
                                 f"got {self.jobs!r}")
        if self.device not in DEVICES:
            raise SpecboundError(f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}")
        if self.n is None and self.margin is None:
            return
        if self.n is None or self.margin is None:
            missing = "n (the sample size)" if self.n is None else "margin"
            raise SpecboundError(f"a generalisation-gap bound needs both n and margin; {missing} is missing")
        if not _is_int(self.n) or not 2 <= self.n <= N_MAX:
            raise SpecboundError(f"n (the number of training sequences) must be an integer from 2 to 1e300 (the "
                                 f"gap bound is computed in floating point), got {self.n!r}")
        _positive_finite("margin", self.margin, "e.g. --margin 0.1")
        if not (_is_real(self.delta) and 0 < self.delta < 1):
            raise SpecboundError(f"delta (the failure probability) must be in (0, 1), got {self.delta!r}")
        _positive_finite("lead_constant", self.lead_constant, "default 1")
        _positive_finite("confidence_constant", self.confidence_constant, "default 1")

    @classmethod
    def build(cls, options: "AnalysisOptions | Mapping[str, Any] | None" = None, **overrides) -> "AnalysisOptions":
        """``options`` (an instance, a mapping of option names, or None) with ``overrides`` applied;
        unknown names are an error that lists the known ones."""
        if options is None:
            base = cls()
        elif isinstance(options, AnalysisOptions):
            base = options
        elif isinstance(options, Mapping):
            base, overrides = cls(), {**options, **overrides}
        else:
            raise SpecboundError(f"options must be an AnalysisOptions or a mapping of option names, "
                                 f"found {type(options).__name__}")
        unknown = sorted(set(overrides) - set(option_names()))
        if unknown:
            raise SpecboundError(f"unknown analysis option(s) {', '.join(map(str, unknown))}; expected some of "
                                 f"{', '.join(option_names())}")
        return replace(base, **overrides) if overrides else base

    @property
    def gap_requested(self) -> bool:
        """Whether a generalisation-gap bound is asked for (``n`` and ``margin`` given)."""
        return self.n is not None

    def key_options(self) -> dict[str, Any]:
        """The options that change the numbers, as a store's record key sees them: the legacy six
        always (in their order), every other only when it differs from its default."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if not f.metadata["key"]:
                continue
            if f.name in LEGACY_KEY_OPTIONS or value != f.default:
                out[f.name] = str(value) if f.name in ("arch_spec", "init") and value is not None else value
        return {**{k: out[k] for k in LEGACY_KEY_OPTIONS}, **{k: v for k, v in out.items()
                                                              if k not in LEGACY_KEY_OPTIONS}}


def option_names(*, key_only: bool = False) -> list[str]:
    """Every option's name (``key_only``: those that change the numbers), in declaration order."""
    return [f.name for f in fields(AnalysisOptions) if f.metadata["key"] or not key_only]


def option_fields():
    """The dataclass fields of :class:`AnalysisOptions`, with their metadata (help, flag, key, ...)."""
    return fields(AnalysisOptions)


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    """A real number a float can hold (an integer past 1.8e308 cannot: it is refused, not overflowed)."""
    try:
        return isinstance(value, Real) and not isinstance(value, bool) and not math.isnan(float(value))
    except OverflowError:
        return False


def _positive_finite(name: str, value, hint: str) -> None:
    if not _is_real(value) or not (0 < value < math.inf):
        raise SpecboundError(f"{name} must be a positive finite number ({hint}), got {value!r}")

