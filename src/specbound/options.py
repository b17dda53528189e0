"""Every analysis option in one place: its default, its constraint, its command-line flag and whether
it changes the numbers (and so belongs in a results store's record key).

``specbound.analyze(source, options, **overrides)``, the command line (``analyze`` and ``sweep``
flags), sweep TOML ``[options]`` tables and the store's record keys all derive from
:class:`AnalysisOptions`: a new option is one field here.  The per-layer kernels receive the four
options they read as one :class:`KernelOptions`.  Each option declares its constraint once
(:class:`Interval`, :class:`Choice`; the pattern of scikit-learn's parameter constraints) and one
checker, :func:`check`, validates it and every other setting of the library (sweep, study).
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
# The towers of a two-tower model (CLIP, SigLIP), each a chain analysed on its own.
TOWERS = ("text", "vision")
# Feed-forward singular values from the Gram matrix only when each is proven accurate to 1e-8
# relative (in practice they agree with the SVD to ~1e-14); see compute.spectra.gram_singular_values.
DEFAULT_GRAM_RTOL = 1e-8
DEFAULT_RANK_TOL = 1e-10
# The finest Schatten grid accepted: 2m + 1 values of p per matrix are evaluated and stored (the
# curves table), so m bounds time and memory; the default m = ceil(L + ln N) is below 200 for every
# published model, and a grid finer than 1/10000 moves no minimum measurably.
GRID_M_MAX = 10_000
# The largest sample size accepted: the gap bound's terms are computed in floating point.
N_MAX = 10**300


# --- constraints -------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    """A real number a float can hold (an integer past 1.8e308 cannot: it is refused, not overflowed)."""
    try:
        return isinstance(value, Real) and not isinstance(value, bool) and not math.isnan(float(value))
    except OverflowError:
        return False


@dataclass(frozen=True)
class Interval:
    """Numbers of one kind (``Integral`` or ``Real``; never a bool, never NaN) between two bounds.

    ``closed`` says which ends belong: ``"both"``, ``"left"``, ``"right"`` or ``"neither"``; a bound
    of None is no bound.  ``cast``: the value is stored as ``int`` / ``float`` (numpy scalars too).
    """

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "both"
    cast: bool = False

    def accepts(self, value) -> bool:
        if not (_is_int(value) if self.kind is Integral else _is_real(value)):
            return False
        left, right = self.closed in ("both", "left"), self.closed in ("both", "right")
        if self.low is not None and not (value >= self.low if left else value > self.low):
            return False
        return self.high is None or (value <= self.high if right else value < self.high)

    def convert(self, value):
        return (int(value) if self.kind is Integral else float(value)) if self.cast else value


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of values."""

    values: tuple

    def accepts(self, value) -> bool:
        return isinstance(value, str) and value in self.values

    def convert(self, value):
        return value


POSITIVE_INT = Interval(Integral, 1, None)
NON_NEGATIVE_INT = Interval(Integral, 0, None)
POSITIVE_FINITE = Interval(Real, 0, math.inf, "neither")

# --- numbers read from files ---------------------------------------------------------------------
# One vocabulary for every number a file or a flag hands specbound (config.json, GGUF metadata, a
# LoRA adapter's config, command-line values): finite, bounded, integral where it must be.  JSON's
# 1e400 and Infinity decode to inf, `true` to a bool, "12" to a string: each is refused alike, by
# check_read, in one line naming the key, what was found and what is expected.
#
# The largest count read from a file (a window, a layer or head count before it is checked against
# the tensors): an integer a float64 holds exactly.
MAX_COUNT = 2**53
# The largest scale read from a file (a soft-cap, an attention scalar, a LoRA alpha): positive and
# finite with room to spare, so that no product or quotient of a few of them overflows.
MAX_SCALE = 1e300
COUNT = Interval(Integral, 1, MAX_COUNT)
SCALE = Interval(Real, 0, MAX_SCALE, "right", cast=True)
_READ_REQUIREMENTS = {COUNT: "a positive integer at most 2^53", SCALE: "a positive finite number at most 1e300"}


def check(name: str, value, *accepted, requirement: str | None = None):
    """``value`` if it meets one of ``accepted`` (:class:`Interval`, :class:`Choice`, None for the
    value None, or a string for that literal), converted as the constraint says; otherwise a
    one-line :class:`SpecboundError`: ``name must be <requirement>, got <value>`` (a choice: ``unknown
    name ...; choose one of ...``)."""
    # before any message quotes the value: an integer of more than 4,300 digits cannot be printed
    refuse_oversized_integers(value, name, "pass a value in its range")
    for constraint in accepted:
        if constraint is None or isinstance(constraint, str):
            if value is constraint or (isinstance(constraint, str) and value == constraint):
                return value
        elif constraint.accepts(value):
            return constraint.convert(value)
    choices = [c for c in accepted if isinstance(c, Choice)]
    if choices and requirement is None:
        raise SpecboundError(f"unknown {name} {shown(value)}; choose one of {', '.join(choices[0].values)}")
    raise SpecboundError(f"{name} must be {requirement or _describe(accepted)}, got {shown(value)}")


def shown(value, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters (a hostile file's string or list may be megabytes);
    a JSON infinity shows as 1e400 would be read: ``inf``, and its kind is named."""
    text = repr(value)
    if isinstance(value, bool):
        return f"{text} (a boolean)"
    if isinstance(value, str):
        text = f"{text[:width]}..." if len(text) > width else text
        return f"{text} (a string)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{text} (a non-finite number: 1e400, Infinity or NaN in the file)"
    return f"{text[:width]}..." if len(text) > width else text


def check_read(key: str, value, *accepted, where: str, fix: str, requirement: str | None = None):
    """A number (or setting) read from a file or a flag, checked as :func:`check` checks an option:
    the converted value, or one line ``<where>: <key> must be <requirement>, got <value>; <fix>``.

    ``accepted`` are :func:`check`'s (:data:`COUNT`, :data:`SCALE`, any :class:`Interval`, None for
    an absent value); the requirement defaults to the constraint's own words."""
    if requirement is None and len([c for c in accepted if c is not None]) == 1:
        requirement = next((_READ_REQUIREMENTS.get(c) for c in accepted if c is not None), None)
        if requirement is not None and None in accepted:
            requirement += " (or null: not used)"
    try:
        return check(f"{where}: {key}", value, *accepted, requirement=requirement)
    except SpecboundError as exc:
        raise SpecboundError(f"{exc}; {fix}") from None


def _describe(accepted) -> str:
    parts = []
    for c in accepted:
        if isinstance(c, Interval):
            noun = "an integer" if c.kind is Integral else "a number"
            if c in _READ_REQUIREMENTS:
                parts.append(_READ_REQUIREMENTS[c])
            elif c == POSITIVE_INT:
                parts.append("a positive integer")
            elif c == NON_NEGATIVE_INT:
                parts.append("a non-negative integer")
            elif c == POSITIVE_FINITE:
                parts.append("a positive finite number")
            else:
                left = "[" if c.closed in ("both", "left") else "("
                right = "]" if c.closed in ("both", "right") else ")"
                parts.append(f"{noun} in {left}{c.low}, {c.high}{right}")
        elif isinstance(c, Choice):
            parts.append(f"one of {', '.join(c.values)}")
        elif isinstance(c, str):
            parts.append(repr(c))
    return " or ".join(parts) or "None"


# --- the options -------------------------------------------------------------------------------


def _option(
    default,
    help: str,
    *,
    key: bool,
    kind: str,
    flag: str,
    accepted: tuple = (),
    requirement: str | None = None,
    label: str | None = None,
    metavar: str | None = None,
    cli_default: Any = None,
    group: str | None = None,
):
    """A dataclass field with its constraint and the metadata the command line and the store read.

    ``accepted`` and ``requirement`` are :func:`check`'s (empty: any value); ``label`` names the
    option in its error (default its name).  ``kind`` says how the command line parses the flag's
    text: ``positive_int``, ``number``, ``choice``, ``path`` or ``jobs`` (a positive integer or ``auto``).
    """
    choices = next((c.values for c in accepted if isinstance(c, Choice)), None)
    return field(
        default=default,
        metadata={
            "help": help,
            "key": key,
            "kind": kind,
            "flag": flag,
            "metavar": metavar,
            "cli_default": cli_default,
            "choices": choices,
            "group": group,
            "accepted": accepted,
            "requirement": requirement,
            "label": label,
        },
    )


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
    base : path, optional
        The base model of a PEFT LoRA adapter ``source`` (any source; default: the adapter's
        ``base_model_name_or_path``): the merged model ``W0 + s B A`` is analysed, and every bound on
        ``W - W0`` with the base as ``W0`` (unless ``init`` names other initial weights).
    n, margin : int, float, optional
        Sample size and ramp-loss margin: given both, every bound with a margin-bound form becomes a
        generalisation-gap bound (docs/spec.md 7).
    delta : float
        Failure probability of the gap bound.
    lead_constant, confidence_constant : float
        The absolute constants of the gap bound's two terms, unstated by the sources (default 1).
    tower : {"text", "vision"}, optional
        A two-tower model's tower to analyse (default both: ``analyze`` then returns a
        :class:`~specbound.records.TowerAnalyses`); an error for any other model.
    threads : int, optional
        BLAS threads per job (None: 1, so that jobs x threads is at most the usable cores; more BLAS
        threads on these small products only spin, badly so on a busy machine: docs/benchmarks.md).
    jobs : int or "auto"
        Layers analysed at once, in threads; the numbers are identical, peak memory holds ``jobs``
        layers.  ``"auto"`` (the default): one per usable core (``os.sched_getaffinity`` within the
        cgroup CPU quota), as memory allows.  A caller that runs many analyses side by side (the
        study) passes ``jobs=1``.
    device : {"numpy", "cpu", "cuda"}
        Where the Gram products, eigenvalues, per-head cores and (1,1)-norm blocks run: NumPy/SciPy
        (default) or torch in float64 on the CPU or a CUDA GPU.  Not part of a record's key: the
        devices differ only in rounding, within the proven error bound each record reports.
    """

    grid_m: int | None = _option(
        None,
        "Schatten grid resolution (default ceil(L + ln N))",
        key=True,
        kind="positive_int",
        flag="--grid-m",
        metavar="M",
        accepted=(None, Interval(Integral, 1, GRID_M_MAX, cast=True)),
        requirement=f"an integer from 1 to {GRID_M_MAX} (the grid is {{0, 1/m, ..., 2}})",
    )
    rank_tol: float = _option(
        DEFAULT_RANK_TOL,
        "relative rank tolerance (default 1e-10)",
        key=True,
        kind="number",
        flag="--rank-tol",
        accepted=(Interval(Real, 0, 1, "left", cast=True),),
        requirement="a number in [0, 1)",
    )
    l_phi: float | None = _option(
        None,
        "activation Lipschitz constant (default from hidden_act; GELU 1.13)",
        key=True,
        kind="number",
        flag="--l-phi",
        accepted=(None, Interval(Real, 0, math.inf, "neither", cast=True)),
        requirement="a positive finite number (GELU: 1.13)",
    )
    method: str = _option(
        "factored",
        "QK/OV spectra from d_h x d_h cores (default) or dense N x N SVDs (slow reference)",
        key=True,
        kind="choice",
        flag="--method",
        accepted=(Choice(METHODS),),
    )
    gram_rtol: float = _option(
        DEFAULT_GRAM_RTOL,
        "feed-forward singular values from the Gram matrix when "
        "proven accurate to this relative error (default 1e-8); 0 forces exact SVDs",
        key=True,
        kind="number",
        flag="--gram-rtol",
        accepted=(Interval(Real, 0, 1, "left", cast=True),),
        requirement="a number in [0, 1) (0 forces exact SVDs)",
    )
    arch_spec: Any = _option(
        None,
        "architecture spec file for a family not shipped (`specbound arch infer` drafts one)",
        key=True,
        kind="path",
        flag="--arch-spec",
        metavar="FILE",
    )
    init: Any = _option(
        None,
        "model folder with the initial weights W0: also compute every bound on W - W0",
        key=True,
        kind="path",
        flag="--init",
        metavar="SOURCE",
    )
    base: Any = _option(
        None,
        "the base model of a PEFT LoRA adapter SOURCE (a folder, weights file or hub id; "
        "default: the adapter's base_model_name_or_path): analyse the merged model, and W - W0 "
        "with the base as W0",
        key=True,
        kind="path",
        flag="--base",
        metavar="BASE",
    )
    n: int | None = _option(
        None,
        "number of training sequences (digits, or e.g. 1e6)",
        key=True,
        kind="count",
        flag="--n",
        group="gap",
        accepted=(None, Interval(Integral, 2, N_MAX)),
        requirement="an integer from 2 to 1e300 (the gap bound is computed in floating point)",
        label="n (the number of training sequences)",
    )
    margin: float | None = _option(
        None,
        "ramp-loss margin > 0",
        key=True,
        kind="number",
        flag="--margin",
        group="gap",
        accepted=(None, POSITIVE_FINITE),
        requirement="a positive finite number (e.g. --margin 0.1)",
    )
    delta: float = _option(
        0.05,
        "failure probability (default 0.05)",
        key=True,
        kind="number",
        flag="--delta",
        group="gap",
        accepted=(Interval(Real, 0, 1, "neither"),),
        requirement="in (0, 1)",
        label="delta (the failure probability)",
    )
    lead_constant: float = _option(
        1.0,
        "absolute constant of the leading term, unstated by the sources (default 1)",
        key=True,
        kind="number",
        flag="--lead-constant",
        group="gap",
        accepted=(POSITIVE_FINITE,),
        requirement="a positive finite number (default 1)",
    )
    confidence_constant: float = _option(
        1.0,
        "absolute constant of the confidence term, unstated by the sources (default 1)",
        key=True,
        kind="number",
        flag="--confidence-constant",
        group="gap",
        accepted=(POSITIVE_FINITE,),
        requirement="a positive finite number (default 1)",
    )
    tower: str | None = _option(
        None,
        "two-tower models (CLIP, SigLIP): analyse only this tower (default both, each a chain of its own)",
        key=True,
        kind="choice",
        flag="--tower",
        accepted=(None, Choice(TOWERS)),
    )
    threads: int | None = _option(
        None,
        "BLAS threads per job (default 1: the layers, not BLAS, use the cores; more only spin on a busy machine)",
        key=False,
        kind="positive_int",
        flag="--threads",
        accepted=(None, POSITIVE_INT),
    )
    jobs: int | str = _option(
        "auto",
        "layers analysed at once, in threads: the same numbers, about J times faster "
        "on J cores, peak memory J layers (default auto: one per core, as half the "
        "available memory allows at a layer's float64 weights each)",
        key=False,
        kind="jobs",
        flag="--jobs",
        metavar="J",
        cli_default="auto",
        accepted=("auto", POSITIVE_INT),
        requirement="a positive integer (layers analysed at once) or 'auto'",
    )
    device: str = _option(
        "numpy",
        "where the linear algebra runs: numpy (default), or torch float64 on cpu or "
        "cuda (same numbers up to rounding, within the reported error bounds)",
        key=False,
        kind="choice",
        flag="--device",
        accepted=(Choice(DEVICES),),
    )

    def __post_init__(self):
        for f in fields(self):
            if f.metadata["accepted"]:
                value = check(
                    f.metadata["label"] or f.name,
                    getattr(self, f.name),
                    *f.metadata["accepted"],
                    requirement=f.metadata["requirement"],
                )
                object.__setattr__(self, f.name, value)  # frozen: the checked (converted) value
        if (self.n is None) != (self.margin is None):
            missing = "n (the sample size)" if self.n is None else "margin"
            raise SpecboundError(f"a generalisation-gap bound needs both n and margin; {missing} is missing")

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
            raise SpecboundError(
                f"options must be an AnalysisOptions or a mapping of option names, found {type(options).__name__}"
            )
        unknown = sorted(set(overrides) - set(option_names()))
        if unknown:
            raise SpecboundError(
                f"unknown analysis option(s) {', '.join(map(str, unknown))}; expected some of "
                f"{', '.join(option_names())}"
            )
        return replace(base, **overrides) if overrides else base

    @property
    def kernel(self) -> "KernelOptions":
        """The options the per-layer kernels read, as one object."""
        return KernelOptions(**{name: getattr(self, name) for name in KERNEL_OPTIONS})

    @property
    def gap_requested(self) -> bool:
        """Whether a generalisation-gap bound is asked for (``n`` and ``margin`` given)."""
        return self.n is not None


# The options the per-layer kernels read (spectra, Gram path, rank cut, device).
KERNEL_OPTIONS = ("method", "gram_rtol", "rank_tol", "device")


def _default(name: str):
    return next(f.default for f in fields(AnalysisOptions) if f.name == name)


@dataclass(frozen=True)
class KernelOptions:
    """What the per-layer kernels read, passed down whole (``AnalysisOptions(...).kernel``); each
    field's default and constraint are :class:`AnalysisOptions`'.

    Attributes
    ----------
    method : {"factored", "dense"}
    gram_rtol : float
        0: every singular value from LAPACK's SVD.
    rank_tol : float
    device : {"numpy", "cpu", "cuda"}
    """

    method: str = _default("method")
    gram_rtol: float = _default("gram_rtol")
    rank_tol: float = _default("rank_tol")
    device: str = _default("device")

    def __post_init__(self):
        for f in fields(AnalysisOptions):
            if f.name in KERNEL_OPTIONS:
                value = check(
                    f.metadata["label"] or f.name,
                    getattr(self, f.name),
                    *f.metadata["accepted"],
                    requirement=f.metadata["requirement"],
                )
                object.__setattr__(self, f.name, value)


# The reference spectrum: every singular value from LAPACK's SVD, in NumPy.
EXACT_SVD = KernelOptions(gram_rtol=0.0)


def option_names(*, key_only: bool = False) -> list[str]:
    """Every option's name (``key_only``: those that change the numbers), in declaration order."""
    return [f.name for f in fields(AnalysisOptions) if f.metadata["key"] or not key_only]


def option_fields():
    """The dataclass fields of :class:`AnalysisOptions`, with their metadata (help, flag, key, ...)."""
    return fields(AnalysisOptions)
