"""One analysis as text and as HTML: the summary ``specbound analyze`` prints, ``print(result)``, and
the notebook view (``Analysis._repr_html_``).

It reads an :class:`~specbound.records.Analysis` only through its attributes, so the records render
themselves without the report stage (which reads results stores); ``report/`` and the command line
use the same functions.
"""

from __future__ import annotations

import html
import math
import os
import re
import textwrap
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from ..bounds import REGISTRY
from ..compute.measures import ordered_roles, with_role_groups
from ..io.formats import WEIGHT_SUFFIXES
from ..io.lora import BASE_FOUND

WIDTH = 100  # columns of the text summary's lines (its prose is wrapped, its bounds table fitted)
LEGEND = (
    "Lambda = layer Lipschitz constant; downstream_factor = prod of Lambda over the layers above (the paper's "
    "alpha_l, not a power-law exponent); xi = the layer's Edelman-style term (docs/spec.md 3, 5)"
)
LEGEND_STACKS = (
    "Lambda = layer Lipschitz constant; M = a decoder layer's Lipschitz constant in the encoder's output "
    "(through its cross-attention); downstream_factor = the paper's alpha_l, an encoder layer's carrying "
    "Z = sum_j alpha_j M_j over the decoder (docs/theory.md 3i); xi = the layer's Edelman-style term"
)
_HUB_CACHE_DIR = re.compile(r"models--([^/]+?)--([^/]+)(?:/snapshots/[^/]+)?/?$")
_WEIGHT_FILE = re.compile("(" + "|".join(re.escape(s) for s in WEIGHT_SUFFIXES) + ")$")


SIGNIFICANT = 5  # digits of every number the summary prints


def fmt(x: Any, log10: float | None = None) -> str:
    """Every number of the summary in one format: :data:`SIGNIFICANT` significant digits, fixed-point
    from 0.001 up to 10^SIGNIFICANT (``0.93440``, ``384.00``, ``20573``), scientific otherwise
    (``1.4986e+12``, ``9.9900e-04``); integers as they are; NaN or null as ``-``; a value beyond float64
    (``inf`` or null) whose ``log10`` is known as ``10^600.07``."""
    if log10 is not None and math.isfinite(log10) and (x is None or not math.isfinite(float(x))):
        return f"10^{log10:.2f}"
    if x is None or x is pd.NA:  # missing, its log unknown: like NaN
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "-"
    if x == 0 or math.isinf(x):
        return str(x) if x else "0"
    rounded = float(f"{x:.{SIGNIFICANT - 1}e}")
    exponent = math.floor(math.log10(abs(rounded)))
    if -3 <= exponent < SIGNIFICANT:
        return f"{rounded:.{SIGNIFICANT - 1 - exponent}f}"
    return f"{x:.{SIGNIFICANT - 1}e}"


def markdown_table(frame: pd.DataFrame, cell=None) -> str:
    """``frame`` as a Markdown table (no tabulate dependency); ``cell(column, value) -> str`` formats
    each entry (default: numbers as :func:`fmt`, anything else as ``str``)."""

    def default(column, value):
        return fmt(value) if isinstance(value, (float, np.floating)) else str(value)

    cell = cell or default
    lines = [
        "| " + " | ".join(str(c) for c in frame.columns) + " |",
        "|" + "|".join("---" for _ in frame.columns) + "|",
    ]
    lines += [
        "| " + " | ".join(cell(c, v) for c, v in zip(frame.columns, row)) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join(lines)


def short_name(source: str, limit: int = 48) -> str:
    """A model's name for titles and legends, not its absolute path.

    ``.../models--google--bert_uncased_L-2_H-128_A-2/snapshots/<hash>`` gives
    ``google/bert_uncased_L-2_H-128_A-2``; any other path its last folder (a weights file's folder
    and file name); a hub id or a name is kept.  Names over ``limit`` characters are cut in the middle.
    """
    text = str(source).rstrip("/")
    hub = _HUB_CACHE_DIR.search(text)
    if hub:
        text = f"{hub.group(1)}/{hub.group(2)}"
    elif re.fullmatch(r"[^/\s]+/[^/\s@]+@[0-9a-f]{40}", text):  # ORG/NAME@commit: the commit's first 8
        text = text[:-32]
    elif text.startswith(("/", "./", "../", "~")) or "\\" in text:
        parts = [p for p in re.split(r"[/\\]", text) if p]
        if parts and _WEIGHT_FILE.search(parts[-1]) and len(parts) > 1:
            text = f"{parts[-2]}/{parts[-1]}"
        elif parts:
            text = parts[-1]
    if len(text) > limit:
        half = (limit - 1) // 2
        text = text[:half] + "…" + text[-(limit - 1 - half) :]
    return text


def _p_label(p: float, m: int) -> str:
    return str(Fraction(round(p * m), m))


def comparison_frame(a) -> pd.DataFrame:
    """Every bound and measure: group, value, ratio to the spectrum-adaptive bound, and the from-init
    value and gap bound when they were computed (as text, in :func:`fmt`), indexed by name."""
    adaptive = a.bounds.get("spectral_adaptive")
    gaps = (a.gap_bound or {}).get("bounds", {})
    rows = []
    for name, value in a.all_bounds().items():
        bound = REGISTRY[name]
        log10 = a.log10_bounds.get(name)
        adaptive_log10 = a.log10_bounds.get("spectral_adaptive")
        if not adaptive:
            ratio = "-"
        elif math.isfinite(value):
            ratio = fmt(value / adaptive)
        else:  # beyond float64: the ratio from the logs, when both are known (null without a log: unknown)
            ratio = fmt(None, log10 - adaptive_log10) if log10 is not None and adaptive_log10 is not None else "-"
        row = {
            "bound": name,
            "group": bound.group.replace("adaptive_variants", "variant").rstrip("s"),
            "value": fmt(value, log10),
            "/ adaptive": ratio,
        }
        if a.from_init is not None:
            row["from init"] = fmt(a.from_init[name]) if name in a.from_init else "-"
        if a.gap_bound is not None:
            g = gaps.get(name)
            row["gap"] = "-" if g is None else fmt(g["gap"]) + (" (vacuous)" if g["vacuous"] else "")
        row["title"] = bound.title
        rows.append(row)
    return pd.DataFrame(rows).set_index("bound")


def wrap(text: str, indent: str = "") -> list[str]:
    """``text`` as lines of at most :data:`WIDTH` columns, the first indented by ``indent``, the
    others by two more."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
        break_long_words=False,
    ) or [""]


def fitted_table(frame: pd.DataFrame, column: str = "title") -> str:
    """``frame`` as text no wider than :data:`WIDTH`: its ``column`` (free text) left-aligned and cut
    to the room the other columns leave (``...``), or left out when under 12 columns remain."""
    rest = frame.drop(columns=[column]).to_string()
    room = WIDTH - max(map(len, rest.splitlines())) - 2
    if room < 12:
        return rest
    cut = [t if len(t) <= room else t[: room - 3] + "..." for t in frame[column]]
    width = max(map(len, cut + [column]))
    shown = frame.assign(**{column: [t.ljust(width) for t in cut]})
    text = shown.rename(columns={column: column.ljust(width)}).to_string()
    return "\n".join(line.rstrip() for line in text.splitlines())


def comparison_table(a) -> list[str]:
    """The bounds table with a header naming exactly its columns, and what the values mean."""
    parts = ["value = the complexity term B", "/ adaptive = value / spectral_adaptive"]
    if a.from_init is not None:
        parts.append("from init = the same bound on W - W0")
    if a.gap_bound is not None:
        parts.append("gap = the generalisation-gap bound ('-': no margin-bound form)")
    lines = [*wrap("bounds (" + "; ".join(parts) + ")"), fitted_table(comparison_frame(a))]
    if a.gap_bound is None:
        lines += wrap(
            "B is a complexity term, not an error bound: a gap bound is of order B / (margin sqrt(n)) "
            "(docs/bounds.md 9); --n N --margin G gives each bound as a generalisation-gap bound"
        )
    lines += wrap(
        "which number to report, what to cite with it, and why a variant or baseline can be smaller: "
        "specbound docs interpreting (docs/interpreting.md)"
    )
    if a.gap_bound is not None:
        p = a.gap_bound["parameters"]
        lines += wrap(
            f"gap at n={p['n']}, margin={fmt(p['margin'])}, delta={fmt(p['delta'])} = leading + c_conf "
            f"sqrt((ln(1/delta) + union cost) / n); leading = c_lead B_margin log_factor / sqrt(n) for "
            f"spectral_* (the margin inside each term, log_factor its entropy integral), c_lead B log_factor "
            f"/ (margin sqrt(n)) otherwise (docs/bounds.md 9); c_lead={fmt(p['lead_constant'])}, "
            f"c_conf={fmt(p['confidence_constant'])} (constants unstated by the sources; default 1); ramp "
            f"loss in [0, 1]: gap >= 1 is vacuous; these forms are proxies, not theorems"
        )
    return lines


def per_layer_frame(a) -> pd.DataFrame:
    """``Lambda, downstream_factor``, each role's sum of ``min_p C(p)``, the adaptive sum and Edelman's ``xi`` (a
    mixture of experts' routed experts summed per role: ``FF_gate[experts]``)."""
    mats = with_role_groups(a.matrices)
    per_role = mats.pivot_table(index="layer", columns="role", values="contribution", aggfunc="sum")
    layers = a.layers
    alpha = (
        [fmt(x, l) for x, l in zip(layers["downstream_factor"], layers["log10_downstream_factor"])]
        if "log10_downstream_factor" in layers
        else layers["downstream_factor"].to_numpy()
    )
    table = pd.DataFrame(
        {"Lambda": layers["lambda"].to_numpy(), "downstream_factor": alpha},
        index=pd.Index(a.layers["layer"].to_numpy(), name="layer"),
    )
    if "stack" in a.layers:  # an encoder-decoder: which stack, and a decoder layer's M_j
        table.insert(0, "stack", a.layers["stack"].to_numpy())
        if "memory_lipschitz" in a.layers:
            table.insert(2, "M", a.layers["memory_lipschitz"].to_numpy())
    for role in ordered_roles(mats["role"]):
        table[role] = per_role[role].reindex(table.index).to_numpy()
    table["adaptive"] = a.layers["adaptive"].to_numpy()
    table["xi"] = a.layers["xi"].to_numpy()
    return table


def per_role_frame(a) -> pd.DataFrame:
    """Per role: matrices, contribution to the adaptive bound, its share, median rank, p* counts (a
    mixture of experts' routed experts together per role: ``FF_gate[experts]``)."""
    mats, m = with_role_groups(a.matrices), a.options["grid_m"]
    total = mats["contribution"].sum()
    rows = []
    for role in ordered_roles(mats["role"]):
        part = mats[mats["role"] == role]
        counts = part["p_star"].value_counts().sort_index()
        rows.append(
            {
                "role": role,
                "matrices": len(part),
                "contribution": part["contribution"].sum(),
                "share": f"{100 * part['contribution'].sum() / total:.1f}%" if total else "-",
                "median rank": int(part["rank"].median()),
                "p* distribution": ", ".join(f"p*={_p_label(p, m)}: {n}" for p, n in counts.items()),
            }
        )
    return pd.DataFrame(rows).set_index("role")


def p_star_note(a) -> list[str]:
    """One line saying why, when every matrix chose the rank count (p* = 0): a matrix's p > 0 term
    grows with its downstream factor alpha (docs/spec.md 4), so a deep stack's large alphas make
    the rank count the cheapest everywhere; where p* varies instead."""
    p_star = a.matrices["p_star"]
    if len(p_star) == 0 or (p_star != 0).any():
        return []
    factors = a.layers["downstream_factor"]
    largest = (
        fmt(factors.max(), a.layers["log10_downstream_factor"].max())
        if "log10_downstream_factor" in a.layers
        else fmt(factors.max())
    )
    return wrap(
        f"every matrix chose p* = 0 (its rank): a p > 0 term grows with the matrix's downstream factor "
        f"(up to {largest} here), so counting the rank is cheapest; p* varies on models with "
        f"small downstream factors, e.g. a narrow random BERT: specbound miniatures DIR --layout folders, "
        f"then specbound analyze DIR/bert_uncased_L-10_H-128_A-2"
    )


def _fit(text: str, width: int) -> str:
    """A source or path shortened to ``width`` columns for the first screen: the home folder as ~,
    then the middle elided (the full path is in the JSON and in ``result.location``)."""
    home = os.path.expanduser("~")
    if len(text) > width and home not in ("", "/") and text.startswith(home + os.sep):
        text = "~" + text[len(home) :]
    if len(text) <= width:
        return text
    keep = width - 3
    return text[: keep // 3] + "..." + text[len(text) - (keep - keep // 3) :]


def _header(a) -> list[str]:
    m, o = a.model, a.options
    lines = [f"specbound: {_fit(str(a.source), 100 - 11)}"]
    if getattr(a, "location", None) and a.location != a.source:
        lines.append(f"from     {_fit(str(a.location), 100 - 9)}")
    lines += [
        f"model    {m['family']}  L={m['L']}  N={m['N']}  heads={m['H']}"
        + (f" (kv {m['H_kv']})" if m["H_kv"] != m["H"] else "")
        + f"  d_head={m['d_head']}  d_ff={m['d_ff']}  matrices={len(a.matrices)}",
        *_stacks_line(m),
        *_adapter_line(m),
        f"options  grid P_m with m={o['grid_m']} ({2 * o['grid_m'] + 1} values of p)  "
        f"rank_tol={o['rank_tol']:g}  L_phi={o['l_phi']:g} ({o['l_phi_source']})",  # options as given
    ]
    rotary = m.get("rotary")
    if rotary:
        methods = rotary.get("qk_spectral_norm")
        counts = (
            f"QK spectral norm: exact maximum over offsets for {methods.get('exact_over_offsets', 0)} "
            f"heads, product bound ||W_Q|| ||W_K|| for {methods.get('product_bound', 0)}"
            if isinstance(methods, dict)
            else f"QK spectral norm: {methods}"
        )
        lines.append(
            f"rotary   {rotary.get('pairing')} pairs, rotary_dim={rotary.get('rotary_dim')}, "
            f"base={fmt(rotary.get('base'))}, max_positions={rotary.get('max_positions')}; {counts}"
        )
        mrope = rotary.get("mrope")
        if isinstance(mrope, dict) and isinstance(mrope.get("axes"), list):  # docs/rotary.md section 7
            counts = ", ".join(
                f"{mrope['axes'].count(x)} on {name}" for x, name in enumerate(("time", "height", "width"))
            )
            lines.append(
                f"         M-RoPE ({mrope.get('kind')}): rotary pairs {counts}; QK maxima over (t, h, w) "
                f"offset vectors (docs/rotary.md 7)"
            )
        grids = [
            g
            for g in [rotary.get("grid")] + [(r or {}).get("grid") for r in rotary.get("by_layer") or []]
            if isinstance(g, dict)
        ]
        if grids:  # a vision tower's 2D rotary: the grids whose (dy, dx) offsets the QK numbers cover
            sides = sorted(
                {
                    (
                        f"{g['rows']} x {g['columns']} patches"
                        if g.get("rows") and g.get("columns")
                        else "an unbounded grid (the bounds for every rotation)"
                    )
                    + (" and a class token" if g.get("class_token") else "")
                    for g in grids
                }
            )
            lines.append(
                f"         2D rotary over the patch grid: QK maxima over the (dy, dx) offsets of "
                f"{' or '.join(sides)} (docs/rotary.md 9)"
            )
    return lines


def _adapter_line(model: dict) -> list[str]:
    """A LoRA adapter's rank, scale and base (the analysed weights are the merged ones)."""
    ad = model.get("adapter")
    if not ad:
        return []
    ranks = "/".join(str(r) for r in ad["ranks"])
    scales = "/".join(fmt(s) for s in ad["scales"])
    return [
        f"adapter  LoRA adapter r={ranks} scale={scales} on {len(ad['adapted_tensors'])} tensors"
        + (f" (+{len(ad['replaced_tensors'])} saved whole)" if ad["replaced_tensors"] else "")
        + f", merged into the base {ad['base']}{_base_found(ad)}; from init = W - W0 with the base as W0"
    ]


def _base_found(adapter: dict) -> str:
    """`` (the hub id the adapter names)``: how an adapter's base was found (records before this key: "")."""
    found = BASE_FOUND.get(adapter.get("base_found"))
    return f" ({found})" if found else ""


def _stacks_line(model: dict) -> list[str]:
    """An encoder-decoder's stacks: which layers each holds (the layers are numbered on through both)."""
    stacks = model.get("stacks")
    if not stacks:
        return []
    parts = [
        f"{s['stack']} layers {s['first_layer']}-{s['first_layer'] + s['L'] - 1} (heads={s['H']} d_ff={s['d_ff']}"
        + (", cross-attention)" if s["cross_attention"] else ")")
        for s in stacks
    ]
    return ["stacks   " + "; ".join(parts)]


def format_headline(a) -> str:
    """The headline bounds only, one per line (``specbound analyze --quiet``)."""
    width = max(len(k) for k in a.bounds) if a.bounds else 0
    return "\n".join(f"{name:<{width}}  {fmt(value)}" for name, value in a.bounds.items())


def assumptions_block(a, *, verbose: bool = False) -> list[str]:
    """Which numbers are theorems: the assumptions this model breaks and the extensions it uses
    (``verbose``: each with its effect)."""
    applying = [e for e in getattr(a, "assumptions", []) if e["applies"]]
    if not applying:
        return []
    broken = [e["name"] for e in applying if e["kind"] == "theorem"]
    conditions = [e["name"] for e in applying if e["kind"] == "condition"]
    ours = [e["name"] for e in applying if e["kind"] == "extension"]
    lines = [
        "",
        "assumptions (docs/theory.md section 6): every bound above is a proxy under these, not a theorem"
        if broken or ours
        else "assumptions (docs/theory.md section 6)",
    ]
    items = []
    if broken:
        items.append("the theorem's, broken by this model: " + ", ".join(broken))
    if conditions:
        items.append("the theorem's conditions on the data and its use (not checked here): " + ", ".join(conditions))
    if ours:
        items.append("our extensions used: " + ", ".join(ours))
    # what changes the numbers themselves, and what a number is of (one tower, no whole-model number), is said in
    # full even without --verbose
    shown = {
        "quantized_weights": "weights",
        "rope_scaling": "rotary",
        "qk_norm": "qk-norm",
        "vision_language_tower": "tower",
    }
    items += [f"{shown[e['name']]}: {e['effect']}" for e in applying if e["name"] in shown]
    if verbose:
        items += [f"- {e['name']} ({e['kind']}): {e['effect']}" for e in applying]
    for item in items:
        lines += wrap(item, "  ")
    return lines


def format_summary(a, *, verbose: bool = False) -> str:
    """The text ``specbound analyze`` prints (``verbose``: also every matrix, one line each)."""
    o = a.options
    lines = [*_header(a), ""]
    lines += comparison_table(a)
    lines += [
        "",
        *wrap(
            "per layer (each role: sum of min_p C(p) over the layer's matrices; adaptive = the "
            "layer's sum of them; spectral_adaptive = the sum over the layers + sqrt(L), "
            f"sqrt({a.model['L']}) = {fmt(math.sqrt(a.model['L']))})"
        ),
        *wrap(LEGEND_STACKS if "memory_lipschitz" in a.layers else LEGEND),
        per_layer_frame(a).to_string(float_format=fmt),
    ]
    lines += [
        "",
        *wrap(
            "adaptivity gain per layer: per-matrix p* vs one fixed p for every matrix, and the "
            "theory's three types (one FF block)"
        ),
    ]
    gain = pd.DataFrame({"adaptive": a.layers["adaptive"]})
    for p in (0, 1, 2):
        gain[f"p={p}"] = a.layers[f"adaptive_p{p}"]
    gain["3 types"] = a.layers["adaptive_three_type"]
    # a per-layer sum beyond float64 is null in the tables: say so rather than print "-"
    gain = gain.apply(lambda col: [("> 1.8e308" if pd.isna(v) else fmt(v)) for v in col])
    gain["FF block p*"] = [_p_label(p, o["grid_m"]) for p in a.layers["three_type_ff_p_star"]]
    gain.index.name = "layer"
    lines.append(gain.to_string())
    lines += [
        "",
        "per role: contribution to the adaptive bound and the chosen Schatten index p*",
        per_role_frame(a).to_string(float_format=fmt),
    ]
    lines += p_star_note(a)
    lines += wrap(
        "a row for each head's QK and OV and each feed-forward matrix (tensors, rank, p*, "
        "contribution): --verbose prints them at the end, --out DIR writes matrices.csv, "
        "result.matrices holds them"
    )
    lines += assumptions_block(a, verbose=verbose)
    if verbose:
        cols = [
            c
            for c in (
                "layer",
                "head",
                "role",
                "tensors",
                "rows",
                "cols",
                "rank",
                "spectral_norm",
                "stable_rank",
                "downstream_factor",
                "p_star",
                "contribution",
            )
            if c in a.matrices.columns
        ]
        with pd.option_context("display.max_rows", None, "display.max_colwidth", 90, "display.width", 250):
            lines += ["", "every matrix", a.matrices[cols].to_string(index=False, float_format=fmt)]
    return "\n".join(lines)


# --- HTML ------------------------------------------------------------------------------------------

_STYLE = (
    "<style>.specbound-analysis{font-family:system-ui,sans-serif;font-size:13px;max-width:100%}"
    ".specbound-analysis .sb-scroll{overflow-x:auto;max-width:100%}"
    ".specbound-analysis table{border-collapse:collapse;margin:0.4em 0}"
    ".specbound-analysis td,.specbound-analysis th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
    ".specbound-analysis td:first-child,.specbound-analysis th:first-child{text-align:left}"
    ".specbound-analysis img{max-width:100%;height:auto}</style>"
)


def html_table(frame: pd.DataFrame, *, index: bool = True) -> str:
    """A table in a horizontally scrolling box (a wide table never widens the page)."""
    frame = frame.reset_index() if index else frame
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v if isinstance(v, str) else fmt(v))}</td>" for v in row) + "</tr>"
        for row in frame.itertuples(index=False)
    )
    return f'<div class="sb-scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def analysis_html(a, figure_png: str | None = None) -> str:
    """The notebook view: header, headline bounds, the bounds table, the per-role table, and (when
    ``figure_png``, base64 PNG data, is given) the spectrum figure."""
    header = "<br>".join(html.escape(line) for line in _header(a))
    headline = " &nbsp; ".join(f"<b>{html.escape(k)}</b> = {html.escape(fmt(v))}" for k, v in a.bounds.items())
    parts = [
        _STYLE,
        '<div class="specbound-analysis">',
        f"<p>{header}</p>",
        f"<p>{headline}</p>",
        "<details><summary>every bound</summary>",
        html_table(comparison_frame(a)),
        "</details>",
        "<p>per role: contribution to the adaptive bound and the chosen Schatten index p*</p>",
        html_table(per_role_frame(a)),
    ]
    if figure_png:
        alt = (
            f"Singular values of every matrix of {html.escape(short_name(a.source))}, by role, against "
            f"their index (log scale)"
        )
        parts.append(f'<img alt="{alt}" width="600" src="data:image/png;base64,{figure_png}">')
    parts.append("</div>")
    return "".join(parts)
