"""``specbound report``: one self-contained HTML file and a Markdown summary, from stored records.

The report holds what a results store says about its family: the records (model shapes, options,
every bound), the scaling fits of :mod:`specbound.report.scaling`, and every figure of
:mod:`specbound.report.plots` (embedded in the HTML as PNG data, linked from the Markdown, and written as
PNG and PDF beside them).  Nothing is recomputed from weights.
"""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path

from .. import __version__

CAPTIONS = {
    "bounds_vs_width": "Each bound against the hidden size N at fixed depth L, divided by its value at the "
                       "smallest N (log scale).",
    "bounds_vs_depth": "Each bound against the depth L at fixed hidden size N, divided by its value at the "
                       "smallest L (log scale).",
    "spectral_decay": "Raw singular values of every matrix of one model, by role.",
    "norms_vs_width": "(2,1)-, (1,1)- and spectral norms of every matrix against N at fixed depth.",
    "contribution_curves": "C(p)/C(0) on the post-hoc grid for every matrix of one model; dots mark the grid "
                           "minimiser p*.",
    "p_star_heatmap": "The chosen Schatten index p* over layers and roles (mean over heads).",
    "bounds_side_by_side": "Every bound of every checkpoint.",
}


def _fmt(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value)


def _records_table(store, bounds):
    table = store.table()
    cols = ["source", "L", "N", "H", "d_ff"] + bounds + ["seconds"]
    return table[[c for c in cols if c in table.columns]]


def _markdown_table(frame) -> str:
    head = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


def _html_table(frame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _overview(store, table) -> list[str]:
    families = ", ".join(sorted(set(table["family"])))
    options = table[[c for c in ("grid_m", "rank_tol", "l_phi", "method") if c in table.columns]].drop_duplicates()
    return [
        f"{len(table)} records in `{store.root}` (family: {families}); "
        f"L in {sorted(set(int(v) for v in table['L']))}, N in {sorted(set(int(v) for v in table['N']))}.",
        f"Option sets: {len(options.drop(columns=['grid_m'], errors='ignore').drop_duplicates())}; "
        f"generated {time.strftime('%Y-%m-%d %H:%M')} by specbound {__version__}.",
    ]


def write_report(store, out_dir: str | Path, *, model: str | None = None, fixed_L: int | None = None,
                 bounds: list[str] | None = None, confidence: float = 0.95) -> dict[str, Path]:
    """Write ``report.html`` (self-contained), ``report.md`` and ``figures/*.png|pdf`` to ``out_dir``.

    Parameters
    ----------
    store : Store
    out_dir : path
    model : str, optional
        The record of the one-model figures (source or key prefix); default the largest model.
    fixed_L : int, optional
        Depth of the norms-against-N figure; default the smallest.
    bounds : list of str, optional
        Bounds to show; default every bound in the store.
    confidence : float
        Level of the slopes' confidence intervals.

    Returns
    -------
    dict with the paths of ``html``, ``markdown`` and ``figures`` (the folder).
    """
    from .plots import build_figures, save_figure
    from .scaling import scaling_table, summary_table

    out = Path(out_dir)
    figures_dir = out / "figures"
    names = bounds or store.bound_names()
    table = store.table()
    figures = {}
    for name, fig in build_figures(store, model=model, fixed_L=fixed_L, bounds=bounds).items():
        figures[name] = save_figure(fig, figures_dir / name)[0]
    fits = summary_table(scaling_table(store, bounds=bounds, confidence=confidence))
    records = _records_table(store, names)
    overview = _overview(store, table)
    level = f"{100 * confidence:g}%"

    md = ["# specbound report", "", *overview, "", "## Bounds", "", _markdown_table(records), ""]
    md += ["## Scaling", "",
           f"Log-log slope of every bound (and of each bound restricted to one role) in L at fixed N and in N "
           f"at fixed L, pooled over the fixed values, with {level} confidence intervals "
           f"(`specbound scaling --detail` gives one fit per fixed value).", ""]
    md += [_markdown_table(fits), ""]
    md += ["## Figures", ""]
    for name, png in figures.items():
        md += [f"### {name}", "", CAPTIONS.get(name, ""), "", f"![{name}](figures/{png.name})",
               f"([PDF](figures/{png.with_suffix('.pdf').name}))", ""]
    markdown = out / "report.md"
    out.mkdir(parents=True, exist_ok=True)
    markdown.write_text("\n".join(md))

    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;font-size:13px;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
             "td:first-child,th:first-child{text-align:left}img{max-width:100%}figure{margin:1.5em 0}"
             "figcaption{color:#555;font-size:14px}code{background:#f3f3f3;padding:1px 4px}")
    body = ["<h1>specbound report</h1>", *(f"<p>{html.escape(line).replace('`', '')}</p>" for line in overview),
            "<h2>Bounds</h2>", _html_table(records), "<h2>Scaling</h2>",
            f"<p>Log-log slope of every bound (and of each bound restricted to one role) in L at fixed N and in "
            f"N at fixed L, pooled over the fixed values, with {level} confidence intervals.</p>",
            _html_table(fits), "<h2>Figures</h2>"]
    for name, png in figures.items():
        data = base64.b64encode(png.read_bytes()).decode()
        body.append(f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
                    f"<figcaption><b>{name}</b>: {html.escape(CAPTIONS.get(name, ''))}</figcaption></figure>")
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>specbound report</title>'
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
    report = out / "report.html"
    report.write_text(page)
    return {"html": report, "markdown": markdown, "figures": figures_dir}
