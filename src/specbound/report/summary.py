"""The human-readable summary printed by ``specbound analyze`` (reads records only)."""

from __future__ import annotations

import math
from fractions import Fraction

import pandas as pd

from ..bounds import REGISTRY
from ..compute.measures import ROLE_ORDER
from ..records import Analysis


def _fmt(x: float, log10: float | None = None) -> str:
    """A number in one format; one beyond float64 (``inf``, its ``log10`` known) as ``10^600.07``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-" if log10 is None else f"10^{log10:.2f}"
    if not math.isfinite(x):
        return f"10^{log10:.2f}" if log10 is not None and math.isfinite(log10) else str(x)
    return f"{x:.6g}" if abs(x) < 1e7 else f"{x:.4e}"


def _p_label(p: float, m: int) -> str:
    return str(Fraction(round(p * m), m))


def comparison_table(a: Analysis) -> list[str]:
    """Every bound and measure in one table: value, ratio to the spectrum-adaptive bound, and the
    from-init value and gap bound when they were computed."""
    adaptive = a.bounds.get("spectral_adaptive")
    gaps = (a.gap_bound or {}).get("bounds", {})
    rows = []
    for name, value in a.all_bounds().items():
        bound = REGISTRY[name]
        log10 = a.log10_bounds.get(name)
        ratio = (f"10^{log10 - a.log10_bounds['spectral_adaptive']:.2f}" if not math.isfinite(value) and adaptive
                 else _fmt(value / adaptive) if adaptive else "-")
        row = {"bound": name, "group": bound.group.replace("adaptive_variants", "variant").rstrip("s"),
               "value": _fmt(value, log10), "/ adaptive": ratio}
        if a.from_init is not None:
            row["from init"] = _fmt(a.from_init[name]) if name in a.from_init else "-"
        if a.gap_bound is not None:
            g = gaps.get(name)
            row["gap"] = "-" if g is None else _fmt(g["gap"]) + (" (vacuous)" if g["vacuous"] else "")
        row["title"] = bound.title
        rows.append(row)
    lines = ["bounds (value = the complexity term B; measures without a margin-bound form have no gap)",
             pd.DataFrame(rows).set_index("bound").to_string()]
    if a.gap_bound is not None:
        p = a.gap_bound["parameters"]
        lines.append(f"gap = c_lead B log_factor / (margin sqrt(n)) + c_conf sqrt((ln(1/delta) + union cost) / n)"
                     f" with n={p['n']}, margin={p['margin']:g}, delta={p['delta']:g}; "
                     f"c_lead={p['lead_constant']:g}, c_conf={p['confidence_constant']:g} "
                     f"(constants unstated by the sources; default 1); ramp loss in [0, 1]: gap >= 1 is vacuous")
    return lines


def format_summary(a: Analysis) -> str:
    m, mats = a.model, a.matrices
    o = a.options
    lines = [
        f"specbound: {a.source}",
        f"model    {m['family']}  L={m['L']}  N={m['N']}  heads={m['H']}"
        + (f" (kv {m['H_kv']})" if m["H_kv"] != m["H"] else "")
        + f"  d_head={m['d_head']}  d_ff={m['d_ff']}  matrices={len(mats)}",
        f"options  grid P_m with m={o['grid_m']} ({2 * o['grid_m'] + 1} values of p)  "
        f"rank_tol={o['rank_tol']:g}  L_phi={o['l_phi']:g} ({o['l_phi_source']})",
        "",
    ]
    lines += comparison_table(a)

    lines += ["", "per layer (adaptive = sum of min_p C(p) over the layer's matrices)"]
    per_layer = mats.pivot_table(index="layer", columns="role", values="contribution", aggfunc="sum")
    alpha = [_fmt(x, l) for x, l in zip(a.layers["alpha"], a.layers["log10_alpha"])]
    table = pd.DataFrame({"Lambda": a.layers["lambda"], "alpha": alpha})
    roles = [r for r in ROLE_ORDER if r in per_layer.columns]
    for role in roles:
        table[role] = per_layer[role].to_numpy()
    table["adaptive"] = a.layers["adaptive"]
    table["xi (edelman)"] = a.layers["xi"]
    lines.append(table.to_string(float_format=_fmt))

    lines += ["", "adaptivity gain per layer: per-matrix p* vs one fixed p for every matrix, and the theory's "
                  "three types (one FF block)"]
    gain = pd.DataFrame({"adaptive": a.layers["adaptive"]})
    for p in (0, 1, 2):
        gain[f"p={p}"] = a.layers[f"adaptive_p{p}"]
    gain["3 types"] = a.layers["adaptive_three_type"]
    # a per-layer sum beyond float64 is null in the tables: say so rather than print nan
    gain = gain.apply(lambda col: [("> 1.8e308" if pd.isna(v) else _fmt(v)) for v in col])
    gain["FF block p*"] = [_p_label(p, o["grid_m"]) for p in a.layers["three_type_ff_p_star"]]
    lines.append(gain.to_string())

    lines += ["", "per role: contribution to the adaptive bound and the chosen Schatten index p*"]
    total = mats["contribution"].sum()
    rows = []
    for role in roles:
        part = mats[mats["role"] == role]
        counts = part["p_star"].value_counts().sort_index()
        dist = ", ".join(f"p*={_p_label(p, o['grid_m'])}: {n}" for p, n in counts.items())
        rows.append({"role": role, "matrices": len(part), "contribution": part["contribution"].sum(),
                     "share": f"{100 * part['contribution'].sum() / total:.1f}%" if total else "-",
                     "median rank": part["rank"].median(), "p* distribution": dist})
    lines.append(pd.DataFrame(rows).set_index("role").to_string(float_format=_fmt))
    return "\n".join(lines)
