"""What the training callbacks share: analyse the model in memory every N optimizer steps, hand the
headline bounds to the trainer's loggers, and append a record to a results store.

Nothing is written to disk but the store's records (and what the trainer's own loggers write): the
weights are read from the module's ``state_dict()`` (``specbound.analyze(module)``), on whatever
device they live.  Each record is keyed, as a sweep's are, by a digest of the weights analysed and
the options (:func:`state_digest`), named ``RUN/step-S`` and labelled ``run``, ``step`` and ``model``
(:func:`model_name`), so ``specbound report --store`` draws the trajectory along ``label_step`` and
``specbound compare STORE#RUN/step-S`` names the record by them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..bounds.registry import REGISTRY
from ..errors import SpecboundError
from ..options import AnalysisOptions
from ..pipeline import analyze
from ..sweep.store import Store, record_from_analysis, record_key

__all__ = ["BoundMonitor", "state_digest"]

HEADLINE = ("spectral_adaptive", "edelman")
PREFIX = "specbound"
_NOT_HERE = ("init", "base", "tower")  # options a model in memory cannot take (say why below)


def check_path_argument(value: Any, name: str, what: str) -> None:
    """A callback's folder argument: None or a non-empty ``str`` / ``os.PathLike``, else one line."""
    if value is None:
        return
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise SpecboundError(f"{name} must be {what} (a str or pathlib.Path) or None, found {value!r}")


class BoundMonitor:
    """Analyse a model every ``every_n_steps`` steps; the callbacks of :mod:`.transformers` and
    :mod:`.lightning` are thin adapters around one.

    Parameters
    ----------
    every_n_steps : int
        Analyse after every this many optimizer steps (and once before the first, ``at_start``).
    store : path, optional
        A results store folder (created when missing): one record per analysis, labelled
        ``run``, ``step`` and ``model``, which ``specbound report --store`` / ``scaling`` / ``plot`` read.
    bounds : "headline", "all" or iterable of str
        Which bounds are logged (default the headline ``spectral_adaptive`` and ``edelman``); the
        store keeps every bound regardless.
    run_name : str, optional
        The records' ``run`` label and source prefix (``RUN/step-S``; default ``"train"``).
    at_start : bool
        Also analyse the weights before training (step 0).
    quiet : bool
        Do not print the cost of one analysis (printed once, on stderr, after the first one past step 0,
        against the time of a training step).
    **options
        Analysis options (:class:`~specbound.options.AnalysisOptions`: ``grid_m``, ``n``, ``margin``,
        ``threads``, ...), checked here.
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        *,
        store: str | Path | None = None,
        bounds: str | Iterable[str] = "headline",
        run_name: str = "train",
        at_start: bool = True,
        quiet: bool = False,
        **options: Any,
    ):
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise SpecboundError(
                f"every_n_steps must be a positive integer (analyse every that many steps), found {every_n_steps!r}"
            )
        given = sorted(set(options) & set(_NOT_HERE))
        if given:
            raise SpecboundError(
                f"the training callbacks analyse the model in memory and take no {given[0]}= "
                f"option; analyse a saved checkpoint with specbound.analyze(path, {given[0]}=...)"
            )
        check_path_argument(store, "store", "a results store folder")
        if not isinstance(run_name, str) or not run_name:
            raise SpecboundError(f"run_name must be a non-empty string (the records' run label), found {run_name!r}")
        for name, flag in (("at_start", at_start), ("quiet", quiet)):
            if not isinstance(flag, bool):
                raise SpecboundError(f"{name} must be True or False, found {flag!r}")
        self.options = AnalysisOptions.build(options)
        self.every_n_steps = every_n_steps
        self.bounds = self._bound_names(bounds)
        self.run_name = run_name
        self.at_start, self.quiet = at_start, quiet
        self.store = None
        if store is not None:
            self.store = Store(store)
            self.store._ensure()  # a store that cannot be written fails now, not at step N
        self.history: list[dict[str, Any]] = []  # one entry per analysis: step, seconds, bounds
        self._done: set[int] = set()
        self._said = False
        self._held = None  # (record, step): written by flush()
        self._started = time.perf_counter()

    @staticmethod
    def _bound_names(bounds) -> tuple[str, ...] | None:
        if bounds == "all":
            return None
        wrong = SpecboundError(
            f"bounds must be 'headline', 'all' or a list of bound names ({', '.join(REGISTRY)}), found {bounds!r}"
        )
        if isinstance(bounds, str):
            if bounds != "headline":
                raise wrong
            return HEADLINE
        if not isinstance(bounds, Iterable) or isinstance(bounds, (bytes, Mapping)):
            raise wrong
        names = tuple(bounds)
        if not names or not all(isinstance(b, str) and b in REGISTRY for b in names):
            raise wrong
        return names

    def start(self) -> None:
        """Training begins: the clock against which the first analysis' cost is set."""
        self._started = time.perf_counter()

    def due(self, step: int, *, start: bool = False) -> bool:
        """Whether the model at ``step`` is to be analysed (each step once)."""
        if step in self._done:
            return False
        return self.at_start and step == 0 if start else step > 0 and step % self.every_n_steps == 0

    def measure(
        self, model: Any, step: int, *, metrics: Mapping[str, Any] | None = None, hold: bool = False
    ) -> dict[str, float]:
        """Analyse ``model`` (an ``nn.Module`` with a ``.config``) as it is at ``step``; append its
        record to the store; return the scalars to log, ``{"specbound/<bound>": value}`` and
        ``{"specbound/log10_<bound>": log10 value}`` (the log is finite however large the bound).

        ``metrics``: the trainer's own numbers at this step (training loss, evaluation metrics), kept
        in the record (``metric_<name>`` in the store's table) so that the trajectory figure draws
        them on the bounds' step axis.  ``hold``: keep the record until :meth:`flush`, which may add
        the numbers the trainer logs after this call for the same step."""
        self.flush()
        self._done.add(step)
        training = time.perf_counter() - self._started - sum(h["seconds"] for h in self.history)
        begin, cpu = time.perf_counter(), time.process_time()
        analysis = analyze(model, self.options)
        seconds = time.perf_counter() - begin
        if self.store is not None:
            self._held = (self._record(model, analysis, step, seconds, time.process_time() - cpu), step)
            self.add_metrics(step, metrics or {})
            if not hold:
                self.flush()
        values = analysis.all_bounds()
        logs = analysis.log10_bounds or {}
        scalars = {}
        for name in self.bounds or tuple(values):
            if name not in values:  # a bound this model does not get (the rotation-blind ones)
                continue
            value, log10 = values[name], logs.get(name)
            if log10 is None and 0 < value < math.inf:
                log10 = math.log10(value)
            if math.isfinite(value) and abs(value) < 3.0e38:  # a TensorBoard scalar is a float32
                scalars[f"{PREFIX}/{name}"] = float(value)
            if log10 is not None and math.isfinite(log10):
                scalars[f"{PREFIX}/log10_{name}"] = float(log10)
        self.history.append({"step": step, "seconds": seconds, "bounds": {k: values[k] for k in values}})
        if step > 0 and not self._said and not self.quiet:  # once, when a step's cost is known to set it against
            self._said = True
            per_step = training / step
            say(
                f"specbound: one analysis took {seconds:.2f} s, a training step {per_step:.3g} s: every "
                f"{self.every_n_steps} steps adds about {share(seconds / (per_step * self.every_n_steps))}"
            )
        return scalars

    def add_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Add the trainer's finite numbers logged at ``step`` to the record held for that step (none
        held, or another step's: nothing)."""
        if self._held is not None and self._held[1] == step:
            found = {str(k): float(v) for k, v in metrics.items() if _finite_number(v)}
            self._held[0].meta["metrics"].update(found)

    def flush(self) -> None:
        """Write the record held by :meth:`measure` (``hold=True``), if any."""
        if self._held is not None:
            record, self._held = self._held[0], None
            self.store.put(record)

    def _record(self, model: Any, analysis, step: int, seconds: float, cpu_seconds: float):
        digest = state_digest(model)
        return record_from_analysis(
            analysis,
            key=record_key(digest, self.options),
            source=f"{self.run_name}/step-{step}",
            labels={"run": self.run_name, "step": int(step), "model": model_name(model)},
            weights_sha256=digest,
            options=self.options,
            seconds=seconds,
            cpu_seconds=cpu_seconds,
            mode="callback",
        )


def _finite_number(value: Any) -> bool:
    """A finite int or float (a 0-d tensor's ``.item()`` included), not a bool."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def share(fraction: float) -> str:
    """A cost as a percentage, with the digits it needs: ``6%``, ``0.4%``, ``under 0.1%``."""
    percent = 100 * fraction
    if percent >= 1:
        return f"{percent:.0f}%"
    return f"{percent:.1f}%" if percent >= 0.1 else "under 0.1%"


def say(line: str) -> None:
    """A line on stderr, above any tqdm progress bar that is being drawn (a trainer's), not inside it."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


def model_name(model: Any) -> str:
    """What the model is called: where transformers loaded it from (``name_or_path``: a hub id or a
    folder), else its class (``BertForSequenceClassification``, a model built from a config)."""
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else type(model).__name__


def state_digest(model: Any) -> str:
    """SHA-256 over a module's config (canonical JSON) and every tensor of its ``state_dict()``
    (name, dtype, shape, bytes, in name order): the weights' identity in a record key."""
    import torch

    h = hashlib.sha256()
    config = getattr(model, "config", None)
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
    h.update(json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode())
    state: Mapping[str, Any] = model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        h.update(b"\0" + name.encode() + b"\0" + f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # bytes: numpy has no bfloat16
    return h.hexdigest()
