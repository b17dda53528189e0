"""``specbound report``: one self-contained HTML file and a Markdown summary, from stored records.

The report holds what a results store says about its family: the records (model shapes, options,
every bound), the scaling fits of :mod:`specbound.report.scaling`, and every figure of
:mod:`specbound.report.plots` (embedded in the HTML as PNG data, linked from the Markdown, and written as
PNG and PDF beside them).  Nothing is recomputed from weights.
"""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..atomic import atomic_write
from ..bounds import in_group
from ..records.style import MAX_WIDTH, natural_order, save_figure
from ..records.view import fmt, markdown_table, short_name
from .distance import from_init_frame
from .metrics import metric_correlations, metric_names
from .plots import build_figures, pick_record
from .scaling import scaling_table, summary_table
from .trajectory import trajectory_axis, trajectory_frame

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
    "trajectory": "Every bound along the run's checkpoints (log scale), and the share of the matrices choosing "
    "each Schatten index p*.",
    "from_init": "The headline bounds on W (filled) and on W - W0 (open) of each record measured from initial "
    "weights (--init, or a LoRA adapter with its base as W0).",
    "metrics": "Each headline bound against each of your metrics (metrics.json or sweep --metrics), one dot per "
    "record, Kendall's tau in each panel's title.",
}
ONE_MODEL = ("spectral_decay", "contribution_curves", "p_star_heatmap")  # figures of the record --model names
# What each figure shows, for a reader who cannot see it (the img alt text).
ALT = {
    "bounds_vs_width": "Line chart, log-log: each bound divided by its value at the smallest hidden size N, against "
    "N, one colour per bound and one marker per fixed depth L.",
    "bounds_vs_depth": "Line chart, log-log: each bound divided by its value at the smallest depth L, against L, "
    "one colour per bound and one marker per fixed hidden size N.",
    "spectral_decay": "Four-panel line chart: the singular values of every matrix of one model against their "
    "index, log scale, one panel per role (QK, OV, feed-forward), one colour per layer.",
    "norms_vs_width": "Three-panel line chart, log-log: the (2,1)-, (1,1)- and spectral norm of every matrix "
    "against the hidden size N at one depth, coloured by role.",
    "contribution_curves": "Panel line chart: C(p)/C(0) against the Schatten index p from 0 to 2, log scale, "
    "one line per matrix, one panel per role, one colour per layer; dots at each "
    "matrix's chosen p*.",
    "p_star_heatmap": "Heat map: the chosen Schatten index p* (0 to 2) of each role (rows) in each layer "
    "(columns), mean over heads, each cell annotated with its value.",
    "bounds_side_by_side": "Dot plot: one row per checkpoint, the value of every bound on a log axis, one "
    "colour and marker per bound.",
    "trajectory": "Two panels: above, every bound against the training step on a log scale, one colour per "
    "bound; below, a stacked area chart of the share of matrices choosing each p* at each step.",
    "from_init": "Dot plot, log scale: for each record measured from initial weights, two rows (the spectrum-"
    "adaptive bound, the Edelman-style proxy), a filled dot at the bound on W and an open dot at the "
    "bound on W - W0.",
    "metrics": "Scatter plots, log vertical axis: one panel per headline bound and metric, the bound of each "
    "record against its metric, Kendall's tau in the panel's title.",
}


def _fmt(value) -> str:
    """Numbers as the analysis summary writes them (:func:`specbound.records.view.fmt`)."""
    if isinstance(value, (float, np.floating)):
        return fmt(value)
    return str(value)


def _records_table(store, bounds):

    table = natural_order(store.table())
    table["source"] = [short_name(s) for s in table["source"]]
    shapes = ("L", "N", "H", "d_ff")
    # a pattern's labels that only repeat a shape column (bert_uncased_L-{L}_H-{H}: label_H is N) are left out
    labels = [
        c
        for c in table.columns
        if c.startswith("label_")
        and table[c].nunique() > 1
        and not any(s in table and table[c].astype(str).tolist() == table[s].astype(str).tolist() for s in shapes)
    ]
    for name in bounds:  # a bound beyond float64 as 10^k, from its stored log10
        if f"log10_{name}" in table:
            table[name] = [fmt(v, l) for v, l in zip(table[name], table[f"log10_{name}"])]
    cols = ["source", *shapes, *labels] + bounds + ["seconds"]
    return table[[c for c in cols if c in table.columns]]


def _bound_tables(records, bounds) -> list[tuple[str, object]]:
    """The records table in two parts a laptop screen shows whole: the spectrum-adaptive bound with its
    variants and the Edelman-style proxy, then the baselines (and the seconds each analysis took),
    each part led by the columns that say which checkpoint a row is."""
    ours = set(in_group("bounds")) | set(in_group("adaptive_variants"))
    first = [b for b in bounds if b in ours and b in records]
    rest = [c for c in records.columns if c in bounds and c not in ours or c == "seconds"]
    ident = [c for c in records.columns if c not in bounds and c != "seconds"]
    if not first or not rest:
        return [("", records)]
    return [
        ("Spectrum-adaptive bound, its variants and the Edelman-style proxy", records[ident + first]),
        ("Baselines from the literature", records[[c for c in ("source", "L", "N") if c in records] + rest]),
    ]


def _html_header(name) -> str:
    """A column name that may wrap after its underscores (``spectral_three_type``) instead of widening its column."""
    text = html.escape(str(name))
    return text.replace("_", "_<wbr>") if len(text) > 10 else text


def _html_table(frame) -> str:
    head = "".join(f"<th>{_html_header(c)}</th>" for c in frame.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
        for row in frame.itertuples(index=False)
    )
    # a wide table scrolls inside its own box; the page never gets wider than the screen
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


# Every figure is shown at one scale, so that its fonts match the others': a figure's width on the page
# is its width in inches times FIGURE_PX_PER_INCH (a full-width 7.5 in figure: 960 px), and on a
# narrower window every figure shrinks by the same factor (the same share of the column per inch).
FIGURE_PX_PER_INCH = 128


def _figure_width(width_in: float) -> str:
    """The img style that shows a ``width_in``-inch figure at the report's one scale."""
    return f"width:{100 * min(width_in / MAX_WIDTH, 1):.1f}%;max-width:{round(width_in * FIGURE_PX_PER_INCH)}px"


def _overview(store, table) -> list[str]:
    families = ", ".join(sorted(set(table["family"])))
    options = table[[c for c in ("grid_m", "rank_tol", "l_phi", "method") if c in table.columns]].drop_duplicates()
    return [
        f"{len(table)} records in `{store.root}` (family: {families}); "
        f"L in {sorted(set(int(v) for v in table['L']))}, N in {sorted(set(int(v) for v in table['N']))}.",
        f"Option sets: {len(options.drop(columns=['grid_m'], errors='ignore').drop_duplicates())}; "
        f"generated {time.strftime('%Y-%m-%d %H:%M')} by specbound {__version__}.",
    ]


def write_report(
    store,
    out_dir: str | Path,
    *,
    model: str | None = None,
    fixed_L: int | None = None,
    bounds: list[str] | None = None,
    confidence: float = 0.95,
) -> dict[str, Path]:
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
    out = Path(out_dir)
    figures_dir = out / "figures"
    names = bounds or store.bound_names()
    table = store.table()
    figures, inches = {}, {}
    for name, fig in build_figures(store, model=model, fixed_L=fixed_L, bounds=bounds).items():
        figures[name] = save_figure(fig, figures_dir / name)[0]
        inches[name] = float(fig.get_size_inches()[0])
    along = trajectory_axis(table)
    records = _records_table(store, names)
    overview = _overview(store, table)
    level = f"{100 * confidence:g}%"

    if along is None:  # a family: growth with depth and width
        fits = summary_table(scaling_table(store, bounds=bounds, confidence=confidence))
        section = "Scaling"
        intro = (
            f"Log-log slope of every bound (and of each bound restricted to one role) in L at fixed N and in "
            f"N at fixed L, pooled over the fixed values, with {level} confidence intervals"
        )
        md_intro = intro + " (`specbound scaling --detail` gives one fit per fixed value)."
        second = fits
    else:  # one shape: a run's checkpoints along a label
        step = along[len("label_") :] if along.startswith("label_") else along
        section = "Trajectory"
        intro = (
            f"All {len(table)} records have one shape (L={int(table['L'].iloc[0])}, N={int(table['N'].iloc[0])}), "
            f"so there is no growth with depth or width to fit; every bound and the share of the matrices "
            f"choosing each Schatten index p* along {step}"
        )
        fit_hint = (
            f" (`specbound scaling --against {along}` fits each bound's log-log slope in {step})"
            if along.startswith("label_")
            else ""
        )
        md_intro = intro + fit_hint + "."

        headline = bounds or [n for n in names if n in in_group("bounds")] or names
        second = trajectory_frame(store, x=along, bounds=headline).drop(columns=["key"])
        second["source"] = [short_name(v) for v in second["source"]]

    parts = _bound_tables(records, names)
    distance = from_init_frame(store)
    shown = short_name(store.load_meta(pick_record(store, model))["source"])
    captions = {
        name: CAPTIONS.get(name, "")
        + (f" The model shown: {shown} (`--model SOURCE` picks another)." if name in ONE_MODEL else "")
        for name in figures
    }
    correlations = metric_correlations(table, names) if metric_names(table) else None
    metrics_intro = (
        "Kendall's tau between every bound and each of your metrics (metrics.json beside each checkpoint, "
        "or sweep --metrics), over the records that have both, with its two-sided p-value; a rank "
        "correlation, it needs no model of how a bound relates to the metric."
    )
    distance_intro = (
        "Records measured from initial weights (`--init`, or a LoRA adapter with its base as W0): the "
        "headline bounds on W and on W - W0, and their ratio."
    )
    md = ["# specbound report", "", *overview, "", "## Bounds", ""]
    for title, part in parts:
        md += [f"### {title}", ""] if title else []
        md += [markdown_table(part), ""]
    if len(distance):
        md += ["## Distance from initialisation (W - W0)", "", distance_intro, "", markdown_table(distance), ""]
    if correlations is not None:
        md += ["## Your metrics", "", metrics_intro, "", markdown_table(correlations), ""]
    md += [f"## {section}", "", md_intro, "", markdown_table(second), ""]
    md += ["## Figures", ""]
    for name, png in figures.items():
        md += [
            f"### {name}",
            "",
            captions[name],
            "",
            f"![{ALT.get(name, name)}](figures/{png.name})",
            f"([PDF](figures/{png.with_suffix('.pdf').name}))",
            "",
        ]
    markdown = out / "report.md"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(markdown, lambda p: Path(p).write_text("\n".join(md)))

    # Fits a laptop screen: the text column is at most 1100 px and shrinks with the window; tables
    # wider than it scroll inside their box (.scroll); figures scale down to the column.
    style = (
        "*{box-sizing:border-box}"
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;"
        "overflow-wrap:anywhere}"
        ".scroll{overflow-x:auto;max-width:100%;margin:1em 0}"
        "table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}th{background:#f3f3f3}"
        "td:first-child,th:first-child{text-align:left}img{height:auto}figure{margin:1.5em 0}"
        "figcaption{color:#555;font-size:14px}code{background:#f3f3f3;padding:1px 4px}"
    )
    body = [
        "<h1>specbound report</h1>",
        *(f"<p>{html.escape(line).replace('`', '')}</p>" for line in overview),
        "<h2>Bounds</h2>",
        *(f"<h3>{html.escape(title)}</h3>{_html_table(part)}" if title else _html_table(part) for title, part in parts),
        *(
            [
                f"<h2>Distance from initialisation (W - W0)</h2><p>{html.escape(distance_intro).replace('`', '')}</p>",
                _html_table(distance),
            ]
            if len(distance)
            else []
        ),
        *(
            [f"<h2>Your metrics</h2><p>{html.escape(metrics_intro)}</p>", _html_table(correlations)]
            if correlations is not None
            else []
        ),
        f"<h2>{section}</h2>",
        f"<p>{html.escape(md_intro).replace('`', '')}</p>",
        _html_table(second),
        "<h2>Figures</h2>",
    ]
    for name, png in figures.items():
        data = base64.b64encode(png.read_bytes()).decode()
        alt = html.escape(ALT.get(name, CAPTIONS.get(name, name)), quote=True)
        body.append(
            f'<figure><img alt="{alt}" style="{_figure_width(inches[name])}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{name}</b>: {html.escape(captions[name]).replace('`', '')} "
            f'(<a href="figures/{png.with_suffix(".pdf").name}">PDF</a>)</figcaption></figure>'
        )
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>specbound report</title><style>{style}</style></head><body>{''.join(body)}</body></html>"
    )
    report = out / "report.html"
    atomic_write(report, lambda p: Path(p).write_text(page))
    return {"html": report, "markdown": markdown, "figures": figures_dir}
