"""``specbound compare A B [C ...]`` and ``specbound.compare(...)``: two or more analyses side by side.

Every bound of each model (and of ``W - W0`` where a model has one: an adapter, or ``init=``), the
ratio of each model's bound to the first model's, the adaptive bound's per-layer and per-role sums
and their differences, one figure, and a notebook view.  The sources are anything
:func:`specbound.analyze` reads (folders, files, hub ids, adapters, in-memory models), an
:class:`~specbound.records.Analysis`, a folder that ``Analysis.save`` / ``analyze --out`` wrote, or a
results store's record, ``STORE#SELECTOR`` (a record key, a prefix of one, or a source name).

Ratios and differences of bounds are taken from their logarithms, so a bound beyond float64 (a deep
model's Edelman-style proxy) still compares.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..atomic import atomic_write
from ..bounds import REGISTRY
from ..bounds.schatten import default_grid_m
from ..compute.measures import ordered_roles, with_role_groups
from ..errors import SpecboundError, os_errors
from ..io.lora import is_adapter_folder
from ..options import AnalysisOptions
from ..pipeline import analyze
from ..records import Analysis, TowerAnalyses
from ..records.style import (
    MARKERS,
    drawable,
    model_colors,
    new_figure,
    note_left_out,
    optional_png,
    require_matplotlib,
    save_figure,
    style_grid,
)
from ..records.view import fmt, html_table, short_name
from ..sweep.store import Store

HEADLINE = ("spectral_adaptive", "edelman")
INIT_SUFFIX = " (W - W0)"


@dataclass(repr=False)
class Comparison:
    """Analyses side by side, the first the reference.

    Attributes
    ----------
    analyses : dict[str, Analysis]
        By display name, in the order given.
    """

    analyses: dict[str, Analysis]

    @property
    def names(self) -> list[str]:
        return list(self.analyses)

    @property
    def reference(self) -> str:
        return self.names[0]

    # --- tables -------------------------------------------------------------------------------

    def log10_frame(self) -> pd.DataFrame:
        """``log10`` of every bound (rows, registry order; ``... (W - W0)`` rows for the headline
        bounds of any model measured from initial weights) of every model (columns); NaN where a
        model has no such bound."""
        rows: dict[str, dict[str, float]] = {}
        for name, a in self.analyses.items():
            for bound, value in _log10_bounds(a).items():
                rows.setdefault(bound, {})[name] = value
        if any(a.from_init for a in self.analyses.values()):
            for name, a in self.analyses.items():
                for bound in HEADLINE:
                    value = (a.from_init or {}).get(bound)
                    rows.setdefault(bound + INIT_SUFFIX, {})[name] = _log10(value) if value is not None else math.nan
        order = [b for b in REGISTRY if b in rows] + [b for b in rows if b not in REGISTRY]
        return pd.DataFrame(
            [{n: rows[b].get(n, math.nan) for n in self.names} for b in order], index=pd.Index(order, name="bound")
        )

    def bounds_frame(self) -> pd.DataFrame:
        """Every bound's value for each model, then each other model's ratio to the reference
        (``B / A``, from the logs: exact where the values overflow float64)."""
        logs = self.log10_frame()
        out = pd.DataFrame(index=logs.index)
        for name in self.names:
            out[name] = [
                10.0**v if math.isfinite(v) and v < 308 else (math.inf if v >= 308 else math.nan) for v in logs[name]
            ]
        for name in self.names[1:]:
            out[f"{name} / {self.reference}"] = [
                10.0**d if math.isfinite(d) and abs(d) < 308 else math.nan for d in logs[name] - logs[self.reference]
            ]
        return out

    def layers_frame(self) -> pd.DataFrame:
        """Each model's adaptive contribution per layer (the sum of ``min_p C(p)`` over the layer's
        matrices), and each other model's difference from the reference; layers a model lacks: NaN."""
        out = pd.concat({name: a.layers.set_index("layer")["adaptive"] for name, a in self.analyses.items()}, axis=1)
        out.index.name = "layer"
        return self._with_differences(out)

    def roles_frame(self) -> pd.DataFrame:
        """Each model's adaptive contribution per role (summed over layers and heads; routed experts
        together per role), and each other model's difference from the reference."""
        sums = {
            name: with_role_groups(a.matrices).groupby("role")["contribution"].sum()
            for name, a in self.analyses.items()
        }
        out = pd.concat(sums, axis=1)
        out = out.loc[ordered_roles(out.index)]
        out.index.name = "role"
        return self._with_differences(out)

    def _with_differences(self, out: pd.DataFrame) -> pd.DataFrame:
        for name in self.names[1:]:
            out[f"{name} - {self.reference}"] = out[name] - out[self.reference]
        return out

    def option_differences(self) -> dict[str, dict[str, Any]]:
        """The options the analyses were made with that differ between them: ``{option: {model name:
        setting}}``, each setting as :func:`analysis_settings` gives it (``grid_m`` and ``l_phi`` at
        that model's default read ``"default"``).  Empty when every model was analysed alike."""
        settings = {name: analysis_settings(a) for name, a in self.analyses.items()}
        options = list(dict.fromkeys(k for s in settings.values() for k in s))
        return {
            k: {name: s.get(k, "default") for name, s in settings.items()}
            for k in options
            if len({repr(s.get(k, "default")) for s in settings.values()}) > 1
        }

    def _options_line(self, letters: bool) -> list[str]:
        """The warning that the models were analysed with different options (none when alike)."""
        differ = self.option_differences()
        if not differ:
            return []
        names = {name: _letter(i) if letters else name for i, name in enumerate(self.names)}
        parts = [
            f"{option} ({', '.join(f'{names[n]} {v}' for n, v in values.items())})" for option, values in differ.items()
        ]
        return [
            f"options differ: {'; '.join(parts)}: the bounds differ by these settings as well as by the "
            f"weights; analyse the models alike to compare the weights alone"
        ]

    # --- views --------------------------------------------------------------------------------

    def models_frame(self) -> pd.DataFrame:
        """One row per model: its source, family, L, N, heads, matrices, and what it is (an adapter
        merged into its base, measured from initial weights)."""
        rows = []
        for name, a in self.analyses.items():
            m = a.model
            what = (
                "LoRA adapter merged into its base"
                if m.get("adapter")
                else ("with W - W0" if a.from_init is not None else "")
            )
            rows.append(
                {
                    "model": name,
                    "source": short_name(a.source, 60),
                    "family": m["family"],
                    "L": m["L"],
                    "N": m["N"],
                    "H": m["H"],
                    "matrices": len(a.matrices),
                    "note": what,
                }
            )
        return pd.DataFrame(rows).set_index("model")

    def _bounds_text(self) -> pd.DataFrame:
        logs, values = self.log10_frame(), self.bounds_frame()
        text = pd.DataFrame(index=logs.index)
        for name in self.names:
            text[name] = [fmt(v, l) if math.isfinite(l) else "-" for v, l in zip(values[name], logs[name])]
        for name in self.names[1:]:
            diff = logs[name] - logs[self.reference]
            text[f"{name} / {self.reference}"] = [
                fmt(10.0**d) if abs(d) < 300 else fmt(None, d) if math.isfinite(d) else "-" for d in diff
            ]
        return text

    def _letters(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` with each model's name shortened to its letter (A, B, ...: the models table says
        which is which), so the text tables stay narrow whatever the names."""
        letters = {name: _letter(i) for i, name in enumerate(self.names)}
        ref = letters[self.reference]

        def short(column: str) -> str:
            for name, letter in letters.items():
                if column == name:
                    return letter
                for op in (" / ", " - "):
                    if column == f"{name}{op}{self.reference}":
                        return f"{letter}{op}{ref}"
            return column

        return frame.rename(columns=short)

    def __str__(self) -> str:
        models = self.models_frame()
        models.insert(0, "name", models.index)
        models.index = pd.Index([_letter(i) for i in range(len(models))], name="model")
        lines = [
            f"specbound compare: {len(self.analyses)} models; ratios (B / A) and differences (B - A) against "
            f"A, the first",
            models.to_string(),
            *self._options_line(letters=True),
            "",
            "bounds (value = the complexity term B of each model; B / A = its ratio to the first model's)",
            self._letters(self._bounds_text()).to_string(),
            "",
            "per layer (adaptive = sum of min_p C(p) over the layer's matrices)",
            self._letters(_format(self.layers_frame())).to_string(),
            "",
            "per role (adaptive contribution, summed over layers and heads)",
            self._letters(_format(self.roles_frame())).to_string(),
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<specbound.Comparison of {', '.join(self.names)}>"

    def _repr_html_(self) -> str:
        figure = optional_png(self.figure, dpi=80)
        parts = [
            "<div class='specbound-analysis'>",
            f"<b>specbound compare</b>: ratios and differences against <b>{_escape(self.reference)}</b>",
            html_table(self.models_frame()),
            *(f"<p><b>{_escape(line)}</b></p>" for line in self._options_line(letters=False)),
            "<b>bounds</b>",
            html_table(self._bounds_text()),
            "<b>per layer</b> (adaptive contribution)",
            html_table(_format(self.layers_frame())),
            "<b>per role</b>",
            html_table(_format(self.roles_frame())),
        ]
        if figure:
            parts.append(f"<img src='data:image/png;base64,{figure}' style='max-width:100%'>")
        return "\n".join(parts + ["</div>"])

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``specbound compare --format json``: the models, every bound's log10
        per model, the per-layer and per-role tables (finite numbers or null)."""

        def records(frame):
            return {str(i): {c: _finite(v) for c, v in row.items()} for i, row in frame.iterrows()}

        return {
            "reference": self.reference,
            "models": {n: {"source": a.source, "model": a.model} for n, a in self.analyses.items()},
            "options_differ": self.option_differences(),
            "log10_bounds": records(self.log10_frame()),
            "layers": records(self.layers_frame()),
            "roles": records(self.roles_frame()),
        }

    # --- figures ------------------------------------------------------------------------------

    def plot_bounds(self, ax=None):
        """``log10`` of every bound, one marker and colour per model (the reference filled, the others
        open and side by side, so equal values stay visible); returns the Axes."""
        logs = self.log10_frame()
        ax = ax if ax is not None else new_figure((7.0, 3.6)).subplots()
        for i, name in enumerate(self.names):
            ax.plot(self._dodged(len(logs), i), logs[name].to_numpy(), linestyle="none", label=name, **self._marker(i))
        self._bound_ticks(ax, logs.index)
        ax.set_ylabel(r"$\log_{10} B$")
        ax.set_title("every bound, per model", fontsize=9)
        style_grid(ax)
        ax.legend(fontsize=7, frameon=False)
        return ax

    def plot_ratios(self, ax=None):
        """Each model's bounds divided by the reference's (log scale, 1 = the same), one marker per
        model; returns the Axes."""
        logs = self.log10_frame()
        ax = ax if ax is not None else new_figure((7.0, 3.6)).subplots()
        ax.axhline(1.0, color="grey", linewidth=0.8)
        left_out = 0
        for i, name in enumerate(self.names[1:], start=1):
            with np.errstate(over="ignore", invalid="ignore"):
                ratio, beyond = drawable(10.0 ** np.clip((logs[name] - logs[self.reference]).to_numpy(), -400, 400))
            left_out += beyond
            ax.plot(
                self._dodged(len(logs), i - 1, len(self.names) - 1),
                ratio,
                linestyle="none",
                label=f"{name} / {self.reference}",
                **self._marker(i),
            )
        ax.set_yscale("log")
        self._bound_ticks(ax, logs.index)
        ax.set_ylabel(f"B / B({self.reference})")
        ax.set_title(f"each bound relative to {self.reference}", fontsize=9)
        style_grid(ax)
        note_left_out(ax, left_out)
        ax.legend(fontsize=7, frameon=False)
        return ax

    def plot_layers(self, ax=None):
        """The adaptive contribution of each layer, one line per model; returns the Axes."""
        layers = self.layers_frame()
        ax = ax if ax is not None else new_figure((7.0, 3.6)).subplots()
        for i, name in enumerate(self.names):
            ax.plot(layers.index, layers[name].to_numpy(), label=name, linewidth=1.2, **self._marker(i))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("layer (0 = input)")
        ax.set_ylabel(r"$\sum \min_p C(p)$ of the layer")
        ax.set_title("adaptive contribution per layer", fontsize=9)
        style_grid(ax)
        ax.legend(fontsize=7, frameon=False)
        return ax

    def _marker(self, i: int) -> dict:
        color = model_colors(len(self.names))[i]
        filled = i == 0
        return {
            "marker": MARKERS[i % len(MARKERS)],
            "color": color,
            "markersize": 6 if filled else 7,
            "markerfacecolor": color if filled else "none",
            "markeredgewidth": 1.3,
        }

    @staticmethod
    def _dodged(n: int, i: int, k: int | None = None) -> np.ndarray:
        """x positions of series ``i`` of ``k`` side by side around 0..n-1."""
        k = k or 1
        return np.arange(n) + (i - (k - 1) / 2) * min(0.6 / k, 0.2)

    def _bound_ticks(self, ax, names) -> None:
        ax.set_xticks(list(range(len(names))), list(names), rotation=60, ha="right", fontsize=7)

    def figure(self):
        """The comparison figure: each bound relative to the reference (left) and the per-layer
        adaptive contribution (right)."""
        require_matplotlib()
        fig = new_figure((7.5, 3.9))
        left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
        self.plot_ratios(left)
        self.plot_layers(right)
        fig.suptitle(" vs ".join(self.names), fontsize=9)
        return fig

    def save(self, out_dir: str | Path) -> list[Path]:
        """``bounds.csv``, ``layers.csv``, ``roles.csv`` and ``compare.png`` / ``.pdf`` in ``out_dir``."""
        out = Path(out_dir)
        with os_errors(f"write the comparison to {out}"):
            out.mkdir(parents=True, exist_ok=True)
            written = [
                atomic_write(out / f"{name}.csv", lambda p, t=table: t.to_csv(p))
                for name, table in (
                    ("bounds", self.bounds_frame()),
                    ("layers", self.layers_frame()),
                    ("roles", self.roles_frame()),
                )
            ]
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                return written

            return written + save_figure(self.figure(), out / "compare")


def compare(
    *sources: Any, names: list[str] | None = None, options=None, progress: bool | None = None, **overrides
) -> Comparison:
    """Analyse (or reopen) two or more models and put them side by side.

    Parameters
    ----------
    *sources
        Anything :func:`specbound.analyze` reads, an :class:`Analysis`, a folder written by
        ``Analysis.save``, or ``STORE#SELECTOR`` (a results store's record: key, key prefix or
        source name).  The first is the reference of every ratio and difference.
    names : list of str, optional
        Display names (default: each source's short name, numbered when two coincide).
    progress : bool, optional
        A layers progress bar for each model analysed here (as :func:`specbound.analyze`'s).
    options, **overrides
        Analysis options for the sources that are analysed here (``base`` applies to adapters only).

    Returns
    -------
    Comparison
    """
    if len(sources) < 2:
        raise SpecboundError(
            f"compare needs two or more models, found {len(sources)}; e.g. specbound.compare('base/', 'finetuned/')"
        )
    if names is not None and len(names) != len(sources):
        raise SpecboundError(f"names gives {len(names)} name(s) for {len(sources)} models; give one per model")
    found = [_analysis_of(source, options, overrides, progress) for source in sources]
    analyses = [analysis for analysis, _ in found]
    labels = list(names) if names is not None else default_names([name for _, name in found])
    return Comparison(dict(zip(labels, analyses)))


def _analysis_of(source: Any, options, overrides: dict, progress: bool | None = None) -> tuple[Analysis, str]:
    """The Analysis a compare source stands for, and the name it goes by (its source; a store
    record's source name, ``RUN/step-S`` for a training callback's)."""
    if isinstance(source, Analysis):
        return source, source.source
    if isinstance(source, (str, Path)):
        text = str(source)
        if "#" in text and (Path(text.split("#", 1)[0]) / "records").is_dir():
            meta, analysis = store_analysis(*text.split("#", 1))
            return analysis, str(meta["source"])
        if (Path(text) / "summary.json").is_file():
            analysis = Analysis.load(text)
            return analysis, analysis.source

    given = dict(overrides)
    if "base" in given and not (isinstance(source, (str, Path)) and is_adapter_folder(Path(source))):
        given.pop("base")  # --base names the base of the adapters among the sources
    result = analyze(source, options, progress=progress, **given)
    if isinstance(result, TowerAnalyses):
        raise SpecboundError(
            f"{short_name(str(source))} is a two-tower model; compare one tower of it: "
            f"pass --tower text or --tower vision"
        )
    return result, result.source


def store_analysis(store: str, selector: str) -> tuple[dict[str, Any], Analysis]:
    """The ``record.json`` document and the analysis of the record of results store ``store`` that
    ``selector`` names (its key, a unique prefix of a key, or its source name); the analysis' source
    is the record's name (:func:`record_name`)."""
    st = Store(store)
    keys = st.keys()
    chosen = [k for k in keys if k == selector] or [k for k in keys if k.startswith(selector)] if selector else []
    if not chosen:
        chosen = [k for k in keys if st.load_meta(k)["source"] == selector]
    if len(chosen) != 1:
        found = "no record" if not chosen else f"{len(chosen)} records"
        raise SpecboundError(
            f"{store}#{selector}: {found} with that key, key prefix or source name in the store "
            f"({len(keys)} records); `specbound report --store {store}` lists them"
        )
    record = st.load(chosen[0])
    analysis = record.analysis()
    analysis.source = record_name(record.meta)
    return record.meta, analysis


def record_name(meta: dict[str, Any]) -> str:
    """A store record by its source name (a sweep's checkpoint, a training callback's ``RUN/step-S``),
    with the model's name when the record carries one (``train/step-100 (bert-base-uncased)``): an
    analysis of a model in memory has no path of its own to go by."""
    model = (meta.get("labels") or {}).get("model")
    return f"{meta['source']} ({model})" if model else str(meta["source"])


# Gap-bound parameters an analysis was made with (its gap_bound's "parameters").
_GAP_OPTIONS = ("n", "margin", "delta", "lead_constant", "confidence_constant")


def analysis_settings(a: Analysis) -> dict[str, Any]:
    """The options that set an analysis' numbers beside its weights: ``options`` (the Schatten grid, rank
    tolerance, ``l_phi``, method, Gram tolerance) and the gap bound's parameters, each ``"default"``
    where the analysis took its default (``grid_m = ceil(L + ln N)`` and ``l_phi`` from the activation
    are defaults of each model, so two models of different size or activation are alike there).  The
    initial weights (``init``) are data, not a setting, and are left out."""
    options = dict(a.options)
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in ("init", "l_phi_source"):
            continue
        if key == "grid_m" and value == default_grid_m(a.model["L"], a.model["N"]):
            value = "default"
        if key == "l_phi" and options.get("l_phi_source") != "user":
            value = "default"
        out[key] = value
    parameters = (a.gap_bound or {}).get("parameters") or {}
    defaults = AnalysisOptions()
    for key in _GAP_OPTIONS:  # no gap bound: n and margin not given, the others at their defaults
        out[key] = parameters.get(key, getattr(defaults, key))
    return out


def _letter(i: int) -> str:
    """A, B, ..., Z, then M27, M28, ...: a model's name in the text tables."""
    return chr(ord("A") + i) if i < 26 else f"M{i + 1}"


def default_names(sources: list[str]) -> list[str]:
    """Short display names: each source's last path component when they differ
    (``runs/a/step-100`` -> ``step-100``), else the short names, numbered where two coincide."""
    shorts = [short_name(s, 32) for s in sources]
    last = [s.rstrip("/").rsplit("/", 1)[-1] or s for s in shorts]
    return _unique(last if len(set(last)) == len(last) else shorts)


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if labels.count(label) == 1 else f"{label} #{seen[label]}")
    return out


def _log10(value) -> float:
    value = float(value)
    return math.log10(value) if 0 < value < math.inf else math.nan


def _log10_bounds(a: Analysis) -> dict[str, float]:
    known = a.log10_bounds or {}
    return {
        name: float(known[name]) if known.get(name) is not None else _log10(value)
        for name, value in a.all_bounds().items()
    }


def _format(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(lambda column: [fmt(v) if pd.notna(v) else "-" for v in column])


def _finite(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _escape(text: str) -> str:
    return html.escape(text)
