"""``specbound plot``: the paper's figures and a few more, drawn from stored records only.

Every figure reads a results store (:class:`~specbound.sweep.store.Store`); nothing here opens a
checkpoint or computes a spectrum.  Each ``figure_*`` function returns a matplotlib ``Figure``
(built without pyplot, so no global state and no display), and :func:`render_all` saves them as
PNG and PDF.

Figures (after Sakai & Imaizumi 2026, Section 5):

* ``spectral_decay``: raw singular values of every matrix of one model, by role;
* ``bounds_vs_width`` / ``bounds_vs_depth``: each bound against ``N`` at fixed ``L`` (against ``L`` at
  fixed ``N``), divided by its value at the smallest ``N`` (``L``), log scale;
* ``norms_vs_width``: (2,1)-, (1,1)- and spectral norms of every matrix against ``N`` at fixed ``L``;
* ``contribution_curves``: ``C(p)/C(0)`` on the grid, every matrix of one model, one panel per role;
* ``p_star_heatmap``: the chosen Schatten index ``p*`` over layers and roles (mean over heads);
* ``bounds_side_by_side``: every bound of every checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import SpecboundError

ROLE_COLORS = {"QK": "#d62728", "OV": "#1f77b4", "FF_in": "#556b2f", "FF_out": "#8fbc8f",
               "FF_gate": "#9467bd", "FF_up": "#bcbd22"}
ROLE_LABELS = {"QK": "QK (per head)", "OV": "OV (per head)", "FF_in": "FF_in", "FF_out": "FF_out",
               "FF_gate": "FF_gate", "FF_up": "FF_up"}
BOUND_COLORS = ["#ff7f0e", "#483d8b", "#2ca02c", "#8c564b", "#e377c2", "#7f7f7f", "#17becf", "#bcbd22",
                "#1f77b4", "#d62728"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">"]
FIGSIZE = (7.0, 4.6)


def _figure(figsize=FIGSIZE, **kwargs):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SpecboundError("plots need matplotlib: pip install -e '.[plot]' in the specbound checkout") from None
    return Figure(figsize=figsize, layout="constrained", **kwargs)


def _grid(ax):
    ax.grid(True, which="major", linewidth=0.5, alpha=0.3)
    ax.grid(True, which="minor", linewidth=0.3, alpha=0.12)


def _integer_ticks(ax, values) -> None:
    """Ticks at the family's own widths or depths, on a log axis, and no others."""
    from matplotlib.ticker import NullLocator

    ax.set_xticks(list(values), [str(v) for v in values])
    ax.xaxis.set_minor_locator(NullLocator())


def _bound_label(name: str) -> str:
    """The registry's title of a bound (``name`` for one this version does not know)."""
    from ..bounds import REGISTRY

    bound = REGISTRY.get(name)
    return bound.title if bound else name


def _roles(frame) -> list[str]:
    from ..compute.measures import ROLE_ORDER

    present = list(dict.fromkeys(frame["role"]))
    return [r for r in ROLE_ORDER if r in present] + [r for r in present if r not in ROLE_ORDER]


def _model_title(meta) -> str:
    m = meta["model"]
    return f"{meta['source']}  (L={m['L']}, N={m['N']}, H={m['H']})"


def pick_record(store, model: str | None = None) -> str:
    """The key of the record named by ``model`` (a key prefix or a source); default the largest model."""
    table = store.table()
    if table.empty:
        raise SpecboundError(f"the results store {store.root} holds no records; run `specbound sweep` first")
    if model is None:
        return table.sort_values(["L", "N"], kind="stable").iloc[-1]["key"]
    hits = table[(table["source"] == model) | table["key"].str.startswith(model)]
    if hits.empty:
        hits = table[table["source"].str.contains(model, regex=False)]
    if len(hits) != 1:
        shown = ", ".join(table["source"].head(8))
        raise SpecboundError(f"--model {model!r} names {len(hits)} records; name one by source or key "
                             f"(the store has {shown}{', ...' if len(table) > 8 else ''})")
    return hits.iloc[0]["key"]


# --- one model ---------------------------------------------------------------------------------

def figure_spectral_decay(store, key: str):
    """Raw singular values against their index, every matrix of one model, coloured by role."""
    record = store.load(key, tables=("singular_values",))
    sv = record.tables["singular_values"]
    fig = _figure()
    ax = fig.add_subplot()
    for role in _roles(sv):
        first = True
        for _, g in sv[sv["role"] == role].groupby("matrix", sort=True):
            sigma = g["sigma"].to_numpy()
            sigma = np.where(sigma > 0, sigma, np.nan)  # exact zeros have no place on a log axis
            ax.plot(g["index"], sigma, color=ROLE_COLORS.get(role, "grey"), linewidth=1.0,
                    alpha=0.35 if role in ("QK", "OV") else 0.9, label=ROLE_LABELS.get(role, role) if first else None)
            first = False
    ax.set_yscale("log")
    ax.set_xlabel("singular value index i")
    ax.set_ylabel("singular value σ_i")
    ax.set_title(f"Spectral decay: {_model_title(record.meta)}", fontsize=10)
    _grid(ax)
    for handle in ax.legend(frameon=False).legend_handles:
        handle.set_alpha(1.0)
    return fig


def figure_contribution_curves(store, key: str):
    """``C(p)/C(0)`` over the post-hoc grid, every matrix of one model; one panel per role."""
    record = store.load(key, tables=("curves", "matrices"))
    curves = record.tables["curves"]
    roles = _roles(curves)
    cols = 2 if len(roles) > 1 else 1
    rows = int(np.ceil(len(roles) / cols))
    fig = _figure(figsize=(7.5, 2.6 * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
    for ax, role in zip(axes.flat, roles):
        part = curves[curves["role"] == role]
        for _, g in part.groupby("matrix", sort=True):
            ax.plot(g["p"], g["c_over_c0"], color=ROLE_COLORS.get(role, "grey"), linewidth=0.9,
                    alpha=0.3 if role in ("QK", "OV") else 0.9)
        mats = record.tables["matrices"]
        chosen = part.merge(mats.reset_index(names="matrix")[["matrix", "p_star"]], on="matrix")
        chosen = chosen[np.isclose(chosen["p"], chosen["p_star"])]
        ax.plot(chosen["p"], chosen["c_over_c0"], "k.", markersize=4, label="p* (grid minimiser)")
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
        ax.set_yscale("log")
        ax.set_title(ROLE_LABELS.get(role, role), fontsize=10)
        ax.set_xlabel("Schatten index p")
        ax.set_ylabel("C(p) / C(0)")
        _grid(ax)
        ax.legend(frameon=False, fontsize=8)
    for ax in list(axes.flat)[len(roles):]:
        ax.set_visible(False)
    m = record.meta["analysis"]["options"]["grid_m"]
    fig.suptitle(f"Contribution curves on P_m (m={m}): {_model_title(record.meta)}", fontsize=10)
    return fig


def figure_p_star_heatmap(store, key: str):
    """Mean ``p*`` over each layer's matrices of each role (heads averaged), annotated."""
    record = store.load(key, tables=("matrices",))
    mats = record.tables["matrices"]
    roles = _roles(mats)
    L = int(record.model["L"])
    grid = np.full((len(roles), L), np.nan)
    for i, role in enumerate(roles):
        means = mats[mats["role"] == role].groupby("layer")["p_star"].mean()
        grid[i, means.index.to_numpy(int)] = means.to_numpy()
    fig = _figure(figsize=(max(4.5, 0.6 * L + 2.5), 0.55 * len(roles) + 1.8))
    ax = fig.add_subplot()
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0.0, vmax=2.0)
    ax.set_xticks(range(L), [str(l) for l in range(L)])
    ax.set_yticks(range(len(roles)), roles)
    ax.set_xlabel("layer")
    ax.set_ylabel("role")
    for i in range(len(roles)):
        for j in range(L):
            if np.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if grid[i, j] < 1.2 else "black")
    fig.colorbar(image, ax=ax, label="p* (mean over heads)")
    ax.set_title(f"Chosen Schatten index p*: {_model_title(record.meta)}", fontsize=10)
    return fig


# --- the family --------------------------------------------------------------------------------

def _bounds_long(store, bounds, *, headline_only: bool = True):
    """The family table and the bounds to draw: those asked for, else the headline ones (the
    paper's comparison: spectrum-adaptive and Edelman-style), else every stored bound."""
    from ..bounds import in_group

    table = store.table()
    stored = store.bound_names()
    headline = [n for n in stored if n in in_group("bounds")]
    names = bounds or (headline if headline_only and headline else stored)
    return table, names


def figure_bound_scaling(store, *, x: str = "N", bounds: list[str] | None = None):
    """Each bound against ``x`` (``"N"`` or ``"L"``) with the other dimension fixed, divided by its
    value at the smallest ``x`` of its group; log scale (the paper's two scaling figures)."""
    from matplotlib.lines import Line2D

    other = "L" if x == "N" else "N"
    table, names = _bounds_long(store, bounds)
    fig = _figure()
    ax = fig.add_subplot()
    groups = sorted(table[other].unique())
    drawn = 0
    for gi, value in enumerate(groups):
        part = table[table[other] == value].sort_values(x)
        if part[x].nunique() < 2:
            continue
        for bi, name in enumerate(names):
            y = part[name].to_numpy(float)
            if not (np.isfinite(y[0]) and y[0] > 0):
                continue
            ax.plot(part[x], y / y[0], color=BOUND_COLORS[bi % len(BOUND_COLORS)],
                    marker=MARKERS[gi % len(MARKERS)], linewidth=1.6, markersize=5)
            drawn += 1
    if not drawn:
        raise SpecboundError(f"no {other} value has records at two or more {x} values: nothing to plot")
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    xs = sorted(table[x].unique())
    _integer_ticks(ax, xs)
    ax.set_xlabel("hidden size N" if x == "N" else "depth L")
    ax.set_ylabel(f"bound / bound at smallest {x}")
    ax.set_title(f"Growth with {'width N at fixed depth L' if x == 'N' else 'depth L at fixed width N'}",
                 fontsize=11)
    _grid(ax)
    bound_handles = [Line2D([0], [0], color=BOUND_COLORS[i % len(BOUND_COLORS)], linewidth=2, label=_bound_label(n))
                     for i, n in enumerate(names)]
    group_handles = [Line2D([0], [0], color="dimgrey", marker=MARKERS[i % len(MARKERS)], linestyle="",
                            label=f"{other}={v}") for i, v in enumerate(groups)]
    # every curve starts at (smallest x, 1): the upper left is where no data goes
    legend = ax.legend(handles=bound_handles, loc="upper left", frameon=False, fontsize=8)
    ax.add_artist(legend)
    ax.legend(handles=group_handles, loc="upper left", bbox_to_anchor=(0.0, 0.98 - 0.065 * len(names)),
              frameon=False, fontsize=8, ncol=min(len(groups), 6), handletextpad=0.2, columnspacing=0.8,
              title=f"fixed {other}", title_fontsize=8, alignment="left")
    return fig


NORMS = (("norm_2_1", "(2,1)-norm"), ("norm_1_1", "(1,1)-norm"), ("spectral_norm", "spectral norm"))


def figure_norms_vs_width(store, *, L: int | None = None):
    """(2,1)-, (1,1)- and spectral norm of every matrix against ``N``, at fixed depth ``L`` (default
    the smallest); one line per matrix position (layer, head, role) across the widths it exists at."""
    import pandas as pd
    from matplotlib.lines import Line2D

    table = store.table()
    L = int(table["L"].min()) if L is None else int(L)
    part = table[table["L"] == L].sort_values("N")
    if part.empty:
        raise SpecboundError(f"no records with L={L}; the store has L in {sorted(table['L'].unique())}")
    frames = []
    for _, rec in part.iterrows():
        mats = store.load(rec["key"], tables=("matrices",)).tables["matrices"]
        frames.append(mats.assign(N=rec["N"]))
    mats = pd.concat(frames, ignore_index=True)
    roles = _roles(mats)
    fig = _figure(figsize=(12.0, 4.0))
    axes = fig.subplots(1, len(NORMS))
    for ax, (column, title) in zip(axes, NORMS):
        for (role, layer, head), g in mats.groupby(["role", "layer", "head"], dropna=False, sort=True):
            g = g.sort_values("N")
            ax.plot(g["N"], g[column], color=ROLE_COLORS.get(role, "grey"), marker="o", markersize=3,
                    linewidth=0.9, alpha=0.35 if role in ("QK", "OV") else 0.9)
        ax.set_xscale("log", base=2)
        _integer_ticks(ax, sorted(mats["N"].unique()))
        ax.set_yscale("log")
        ax.set_xlabel("hidden size N")
        ax.set_ylabel(title)
        ax.set_title(title, fontsize=10)
        _grid(ax)
    axes[0].legend(handles=[Line2D([0], [0], color=ROLE_COLORS.get(r, "grey"), label=ROLE_LABELS.get(r, r))
                            for r in roles], frameon=False, fontsize=8)
    fig.suptitle(f"Norms of every matrix against N at depth L={L}", fontsize=11)
    return fig


def figure_bounds_side_by_side(store, *, bounds: list[str] | None = None):
    """Every bound of every checkpoint as grouped bars, log scale."""
    table, names = _bounds_long(store, bounds, headline_only=False)
    labels = [f"L{l}/N{n}" for l, n in zip(table["L"], table["N"])]
    if len(set(labels)) < len(labels):
        labels = [f"{lab}\n{src.rsplit('/', 1)[-1][:18]}" for lab, src in zip(labels, table["source"])]
    width = 0.8 / max(len(names), 1)
    fig = _figure(figsize=(max(7.0, 0.45 * len(table) * max(len(names), 1) ** 0.5 + 2.5), 4.8))
    ax = fig.add_subplot()
    xs = np.arange(len(table))
    for i, name in enumerate(names):
        values = table[name].to_numpy(float)
        ax.bar(xs + (i - (len(names) - 1) / 2) * width, np.where(values > 0, values, np.nan), width,
               color=BOUND_COLORS[i % len(BOUND_COLORS)], label=_bound_label(name))
    ax.set_yscale("log")
    ax.set_xticks(xs, labels, rotation=60, ha="right", fontsize=8)
    ax.set_xlabel("checkpoint (depth L / hidden size N)")
    ax.set_ylabel("bound value")
    ax.set_title("Bounds side by side", fontsize=11)
    _grid(ax)
    ax.legend(frameon=False, fontsize=8)
    return fig


# --- all of them -------------------------------------------------------------------------------

def save_figure(fig, base: Path) -> list[Path]:
    """``base.png`` (150 dpi) and ``base.pdf``."""
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = [base.with_suffix(".png"), base.with_suffix(".pdf")]
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1])
    return paths


def build_figures(store, *, model: str | None = None, fixed_L: int | None = None,
                  bounds: list[str] | None = None) -> dict[str, object]:
    """Every figure the store supports, by name (the family figures need two or more widths or depths)."""
    key = pick_record(store, model)
    figures = {"spectral_decay": figure_spectral_decay(store, key)}
    table = store.table()
    for x, name in (("N", "bounds_vs_width"), ("L", "bounds_vs_depth")):
        other = "L" if x == "N" else "N"
        if table.groupby(other)[x].nunique().max() >= 2:
            figures[name] = figure_bound_scaling(store, x=x, bounds=bounds)
    if table["N"].nunique() >= 2:
        figures["norms_vs_width"] = figure_norms_vs_width(store, L=fixed_L)
    figures["contribution_curves"] = figure_contribution_curves(store, key)
    figures["p_star_heatmap"] = figure_p_star_heatmap(store, key)
    figures["bounds_side_by_side"] = figure_bounds_side_by_side(store, bounds=bounds)
    return figures


def render_all(store, out_dir: str | Path, **kwargs) -> list[Path]:
    """Build every figure and save it as PNG and PDF in ``out_dir``; returns the files written."""
    out = Path(out_dir)
    written = []
    for name, fig in build_figures(store, **kwargs).items():
        written += save_figure(fig, out / name)
    return written
