"""``specbound paper``: the paper's depth/width figure redrawn on any family, with its growth slopes.

Sakai & Imaizumi (2026, Section 5) show on the BERT Miniatures that the spectrum-adaptive bound's
complexity grows much more slowly with depth ``L`` and width ``N`` than the Edelman-style proxy.  This
module checks that claim on the checkpoints a user has: a results store (their own sweep, or
checkpoint folders swept into one, ``L`` and ``N`` read from each model), or the runs of a
``specbound study`` folder (its ``runs.csv``: ``depth`` and ``width`` of models trained to a criterion).

For each axis ``x`` (``L``, then ``N``) and bound ``B``: the fixed-effects least-squares fit

    log B = b log x + c_g + e

of :func:`~specbound.report.scaling.loglog_fit`, where a group ``g`` is a set of checkpoints that
differ only in ``x`` (a store: the same ``N`` for the fit in ``L`` and the same ``L`` for the fit in
``N``; a study: the same task, seed and every other hyper-parameter).  ``b`` is the growth exponent,
with its Student-t confidence interval (``points - groups - 1`` degrees of freedom).  A slope is a
growth rate of a complexity term over this grid's range, not a guarantee (docs/bounds.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SpecboundError
from ..records.style import (
    MARKERS,
    bound_color,
    bound_label,
    drawable,
    new_figure,
    note_left_out,
    require_matplotlib,
    save_figure,
    style_grid,
)
from ..report.scaling import loglog_fit, quantities
from .scaling import axis_groups

# the paper's two headline quantities: its bound and the proxy it is compared with
PAPER_BOUNDS = ("spectral_adaptive", "edelman")
AXES = (("L", "N", "depth L"), ("N", "L", "width N"))  # (fitted, held fixed, name)
AXIS_NAMES = {axis: name for axis, _, name in AXES}
POINT_COLUMNS = ["axis", "bound", "x", "group", "log10_value", "source"]
FIT_COLUMNS = ["axis", "bound", "slope", "ci_low", "ci_high", "points", "groups", "dof", "r2"]
STUDY_HPARAM = {"L": "depth", "N": "width"}


def store_points(store, bounds=PAPER_BOUNDS) -> pd.DataFrame:
    """The long table of :data:`POINT_COLUMNS` from a results store: every record once per axis and
    bound, its group the value of the other dimension (``"N=64"`` for the fit in ``L``)."""
    data = quantities(store, list(bounds))
    data = data[data["role"] == "all"]
    parts = [
        pd.DataFrame(
            {
                "axis": axis,
                "bound": data["bound"].to_numpy(),
                "x": data[axis].to_numpy(float),
                "group": [f"{other}={v}" for v in data[other]],
                "log10_value": data["log10_value"],
                "source": data["source"].to_numpy(),
            }
        )
        for axis, other, _ in AXES
    ]
    return pd.concat(parts, ignore_index=True)[POINT_COLUMNS]


def study_points(runs: pd.DataFrame, bounds=PAPER_BOUNDS) -> pd.DataFrame:
    """:data:`POINT_COLUMNS` from a study's ``runs.csv`` (the runs that met the criterion): a group is a
    set of runs of one task and seed that differ only in ``depth`` (``width``)
    (:func:`.scaling.axis_groups`, the study's own scaling groups)."""
    missing = [c for c in ("task", "run", "converged", "depth", "width", *bounds) if c not in runs.columns]
    if missing:
        raise SpecboundError(
            f"the study's runs.csv has no column {', '.join(missing)}; pass a folder written by "
            f"`specbound study` (its runs.csv), or a results store with --store"
        )
    runs = runs[runs["converged"].astype(bool)].reset_index(drop=True)
    parts = []
    for axis, _, _ in AXES:
        hparam = STUDY_HPARAM[axis]
        for task, sub in runs.groupby("task", sort=True):
            sub = sub.reset_index(drop=True)
            label = axis_groups(sub, hparam)
            inside = label >= 0
            if not inside.any():
                continue
            for bound in bounds:
                with np.errstate(divide="ignore", invalid="ignore"):
                    log10 = np.log10(sub[bound].to_numpy(float)[inside])
                parts.append(
                    pd.DataFrame(
                        {
                            "axis": axis,
                            "bound": bound,
                            "x": sub[hparam].to_numpy(float)[inside],
                            "group": [f"{task}/{k}" for k in label[inside]],
                            "log10_value": log10,
                            "source": sub["run"].to_numpy()[inside],
                        }
                    )
                )
    return pd.concat(parts, ignore_index=True)[POINT_COLUMNS] if parts else pd.DataFrame(columns=POINT_COLUMNS)


def _varies(points: pd.DataFrame) -> bool:
    """Whether some group takes two or more values of ``x``."""
    return bool(len(points)) and int(points.groupby("group")["x"].nunique().max()) >= 2


def paper_fits(points: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """:data:`FIT_COLUMNS`: the growth exponent of every bound in every axis along which the
    checkpoints vary.  One-line errors for a grid that varies neither ``L`` nor ``N`` and for an
    axis with too few checkpoints to give a slope an interval."""
    varying = [axis for axis, _, _ in AXES if _varies(points[points["axis"] == axis])] if len(points) else []
    if not varying:
        depth = points[points["axis"] == "L"]
        shapes = sorted(set(zip(depth["x"].to_numpy(float).astype(int), depth["group"])))
        shown = ", ".join(f"L={x}, {group}" for x, group in shapes[:4]) or "no two differ in depth or width alone"
        raise SpecboundError(
            f"the checkpoints vary neither depth L nor width N ({shown}): the paper's figure "
            f"needs checkpoints at two or more depths at one width, or two or more widths at one "
            f"depth; add checkpoints of other shapes"
        )
    rows = []
    for axis in varying:
        for bound, part in points[points["axis"] == axis].groupby("bound", sort=False):
            fit = loglog_fit(
                part["x"].to_numpy(float),
                None,
                part["group"].to_numpy(),
                confidence,
                log10_y=part["log10_value"].to_numpy(float),
            )
            varied = part.groupby("group")["x"].nunique()
            if not fit["dof"] > 0:
                name = AXIS_NAMES[axis]
                raise SpecboundError(
                    f"too few checkpoints to fit the growth in {name} with an interval: {fit['points']} usable "
                    f"value(s) of {bound} in {int((varied >= 2).sum())} group(s) varying in {axis} leave no degree "
                    f"of freedom; add a third {name.split()[0]} to a group (three or more {axis} values at one "
                    f"{'N' if axis == 'L' else 'L'})"
                )
            rows.append(
                {
                    "axis": axis,
                    "bound": bound,
                    "groups": int((varied >= 2).sum()),
                    **{k: fit[k] for k in ("slope", "ci_low", "ci_high", "points", "dof", "r2")},
                }
            )
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


def _interval(row) -> str:
    return f"{row['slope']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def verdicts(fits: pd.DataFrame, adaptive: str = PAPER_BOUNDS[0], proxy: str = PAPER_BOUNDS[1]) -> list[str]:
    """Two lines per fitted axis: both slopes with their intervals, then whether the adaptive bound
    grows more slowly than the proxy and whether their intervals say so (they do not overlap) or not
    (they overlap: this grid does not decide)."""
    lines = []
    for axis, _, name in AXES:
        rows = fits[fits["axis"] == axis].set_index("bound")
        if adaptive not in rows.index or proxy not in rows.index:
            continue
        a, p = rows.loc[adaptive], rows.loc[proxy]
        if a["ci_high"] < p["ci_low"]:
            claim = f"{adaptive} grows more slowly (the intervals do not overlap): the paper's claim holds here"
        elif a["ci_low"] > p["ci_high"]:
            claim = f"{adaptive} grows faster (the intervals do not overlap): the paper's claim fails here"
        else:
            claim = f"{adaptive} and {proxy}: the intervals overlap, this grid does not decide"
        lines += [f"{name}: {adaptive} ~ {axis}^{_interval(a)}, {proxy} ~ {axis}^{_interval(p)}", f"  {claim}"]
    return lines


def figure_paper(points: pd.DataFrame, fits: pd.DataFrame, *, title: str | None = None, confidence: float = 0.95):
    """The paper's depth/width figure: one panel per fitted axis, every checkpoint's bound divided by
    its group's fitted value at the smallest ``x`` (so that every group's fit is the one line
    ``(x / x_min)^b``), the fitted line of each bound, its slope and interval written in its colour;
    log-log.  Markers tell the groups apart (up to eleven groups; more share one marker)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    axes_fitted = [a for a, _, _ in AXES if (fits["axis"] == a).any()]
    fig = new_figure((3.7 * len(axes_fitted), 4.2))
    panels = fig.subplots(1, len(axes_fitted), squeeze=False)[0]
    for ax, axis in zip(panels, axes_fitted):
        name = AXIS_NAMES[axis]
        part = points[(points["axis"] == axis) & np.isfinite(points["log10_value"].astype(float)) & (points["x"] > 0)]
        groups = list(dict.fromkeys(part["group"]))
        many = len(groups) > len(MARKERS)
        left_out = 0
        x_min, x_max = float(part["x"].min()), float(part["x"].max())
        slopes = []
        drawn = fits[fits["axis"] == axis]
        for rank, fit in enumerate(drawn.itertuples()):
            color = bound_color(fit.bound)
            on_top = 3 + len(drawn) - rank  # the first bound (the paper's, by default) over the others
            rows = part[part["bound"] == fit.bound]
            lx, ly = np.log(rows["x"].to_numpy(float)), rows["log10_value"].to_numpy(float) * math.log(10)
            # each group's intercept from the pooled slope: c_g = mean(log B) - b mean(log x)
            g = rows["group"].to_numpy()
            intercept = pd.Series(ly - fit.slope * lx).groupby(g).transform("mean").to_numpy()
            with np.errstate(over="ignore"):
                ratio, beyond = drawable(np.exp(np.clip(ly - intercept - fit.slope * math.log(x_min), -700, 700)))
            left_out += beyond
            for gi, group in enumerate(groups):
                mine = g == group
                if mine.any():
                    ax.plot(
                        rows["x"].to_numpy(float)[mine],
                        ratio[mine],
                        linestyle="",
                        alpha=0.5 if many else 0.85,
                        marker="o" if many else MARKERS[gi],
                        color=color,
                        markersize=3.5 if many else 5,
                        zorder=on_top,
                    )
            line = np.geomspace(x_min, x_max, 50)
            ax.plot(line, (line / x_min) ** fit.slope, color=color, linewidth=1.8, zorder=on_top)
            slopes.append(
                (
                    color,
                    f"grows as {axis}^{fit.slope:.2f}, {confidence:.0%} interval [{fit.ci_low:.2f}, {fit.ci_high:.2f}]",
                )
            )
        for i, (color, text) in enumerate(reversed(slopes)):  # the lower right: below growing data
            ax.text(
                0.97, 0.03 + 0.065 * i, text, transform=ax.transAxes, ha="right", va="bottom", fontsize=7.5, color=color
            )
        note_left_out(ax, left_out)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        xs = sorted(part["x"].unique())
        if len(xs) <= 8:
            ax.set_xticks(xs, [f"{v:g}" for v in xs])
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(name)
        ax.set_ylabel(f"bound / its fit at {axis} = {x_min:g}")
        held = "N" if axis == "L" else "L"
        ax.set_title(f"growth with {name} at fixed {held}", fontsize=9)
        style_grid(ax)
        if groups and not many:
            ax.legend(
                handles=[
                    Line2D([0], [0], color="dimgrey", marker=MARKERS[i], linestyle="", label=grp)
                    for i, grp in enumerate(groups)
                ],
                loc="upper left",
                frameon=False,
                fontsize=7,
                handletextpad=0.2,
            )
        elif groups:
            ax.text(
                0.03,
                0.97,
                f"{len(groups)} groups",
                transform=ax.transAxes,
                ha="left",
                va="top",
                fontsize=7,
                color="dimgrey",
            )
    bounds = list(dict.fromkeys(fits["bound"]))
    fig.legend(
        handles=[Line2D([0], [0], color=bound_color(b), linewidth=1.8, label=bound_label(b)) for b in bounds],
        loc="outside lower center",
        ncol=len(bounds),
        frameon=False,
        fontsize=8,
    )
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def write_paper(points: pd.DataFrame, out, *, confidence: float = 0.95, title: str | None = None) -> dict:
    """Fit, draw and save: ``out/paper.png``, ``out/paper.pdf`` and ``out/slopes.csv``.  Returns
    ``{"fits": DataFrame, "verdicts": [str], "files": [Path]}``."""
    fits = paper_fits(points, confidence=confidence)
    require_matplotlib()
    out = Path(out)
    files = save_figure(figure_paper(points, fits, title=title, confidence=confidence), out / "paper")
    fits.to_csv(out / "slopes.csv", index=False)
    return {"fits": fits, "verdicts": verdicts(fits), "files": files + [out / "slopes.csv"]}
