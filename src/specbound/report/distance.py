"""The distance from initialisation in a results store: the records analysed with ``init`` (``W - W0``)
or as a LoRA adapter merged into its base (``W0`` = the base), their headline bounds on ``W`` and on
``W - W0``, as a table and a figure for ``specbound report`` / ``plot``.  Read from the stored
records only (``record.json``'s analysis document: ``from_init``, ``model.adapter``, ``options.init``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..records.style import MAX_WIDTH, bound_color, bound_label, drawable, new_figure, note_left_out, style_grid
from ..records.view import fmt, short_name

HEADLINE = ("spectral_adaptive", "edelman")


def _what(meta) -> str:
    """What ``W0`` is for this record: the adapter's base, or the ``init`` weights."""
    adapter = meta["model"].get("adapter")
    if adapter:
        ranks = "/".join(str(r) for r in adapter["ranks"])
        return f"LoRA adapter r={ranks} on {short_name(str(adapter['base']), 32)}"
    init = meta["analysis"]["options"].get("init") or meta["options"].get("init")
    return f"init {short_name(str(init), 32)}" if init else "init"


def from_init_frame(store) -> pd.DataFrame:
    """One row per record measured from initial weights: ``source, W0`` (what the initial weights
    are), and for each headline bound its value on ``W``, on ``W - W0`` and their ratio (as text, in
    :func:`~specbound.records.view.fmt`); empty when no record has ``W - W0``."""
    rows = []
    for key in store.keys():
        meta = store.load_meta(key)
        from_init = meta["analysis"].get("from_init")
        if not from_init:
            continue
        row = {"source": short_name(meta["source"]), "W0": _what(meta)}
        logs = meta.get("log10_bounds") or {}
        for bound in HEADLINE:
            whole, delta = meta["bounds"].get(bound), from_init.get(bound)
            row[bound] = fmt(whole, logs.get(bound)) if whole is not None or logs.get(bound) is not None else "-"
            row[f"{bound} (W - W0)"] = "-" if delta is None else fmt(delta)
            ratio = _log10(delta) - (logs.get(bound) if logs.get(bound) is not None else _log10(whole))
            row[f"(W - W0) / W, {bound}"] = fmt(10.0**ratio) if math.isfinite(ratio) else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def figure_from_init(store, *, ax=None):
    """The headline bounds of each record measured from initial weights: on ``W`` (filled) and on
    ``W - W0`` (open), one colour per bound, log scale; None when no record has ``W - W0``.  ``ax``:
    draw into this matplotlib Axes (returns its Figure) instead of a new figure."""
    entries = []
    for key in store.keys():
        meta = store.load_meta(key)
        from_init = meta["analysis"].get("from_init")
        if from_init:
            entries.append((short_name(meta["source"], 40), meta["bounds"], from_init))
    if not entries:
        return None
    entries.sort(key=lambda e: e[0])
    if ax is None:
        ax = new_figure((MAX_WIDTH, 1.6 + 0.35 * len(entries) * len(HEADLINE))).add_subplot()
    fig = ax.figure
    left_out, ys, labels = 0, [], []
    for i, (source, whole, delta) in enumerate(entries):
        for j, bound in enumerate(HEADLINE):
            y = i * (len(HEADLINE) + 1) + j
            values, beyond = drawable([whole.get(bound) or np.nan, delta.get(bound, np.nan)])
            left_out += beyond
            color = bound_color(bound)
            ax.plot(values, [y, y], color=color, linewidth=1, alpha=0.5)
            ax.plot(values[0], y, "o", color=color, markersize=7, label=f"{bound_label(bound)}: W" if i == 0 else None)
            ax.plot(
                values[1],
                y,
                "o",
                markerfacecolor="white",
                markeredgecolor=color,
                markeredgewidth=1.5,
                markersize=7,
                label=f"{bound_label(bound)}: W - W0" if i == 0 else None,
            )
            ys.append(y)
            labels.append(f"{source}  {bound}")
    ax.set_xscale("log")
    ax.set_yticks(ys, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("bound (log scale)")
    ax.set_title(
        "Headline bounds on W and on W - W0 (distance from the initial weights or the adapter's base)", fontsize=9
    )
    style_grid(ax)
    ax.legend(fontsize=7, frameon=False, loc="best")
    note_left_out(ax, left_out)
    return fig


def _log10(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return math.log10(value) if 0 < value < math.inf else math.nan
