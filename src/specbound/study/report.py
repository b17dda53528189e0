"""The study's report: tables (Markdown and CSV) and figures, read from the records.

Reports never recompute anything: they read the runs table and the correlations.  Files written
into the study folder::

    report.md            setup, per-task summary, twin check, correlation tables, vacuity, timing
    runs.csv             one row per run: hyper-parameters, metrics, every measure (table.py)
    correlations.csv     every Kendall tau (correlate.py), both gaps
    study.json           timing and the command
    figures/measures_vs_gap.png     every bound / measure against the error gap
    figures/gap_bounds_vs_gap.png   every gap bound against the error gap (with the vacuity line)
    figures/headline.png            spectrum-adaptive vs Edelman-style, value and gap bound

Every figure is written as PNG at print resolution (200 dpi) and as PDF with TrueType fonts beside it,
at most a page's text width (7.5 in) wide.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..records_plot import MAX_WIDTH, PRINT_DPI, PRINT_RC
from .grid import HPARAMS
from .table import GAPS, PRIMARY_GAP

HPARAM_LABELS = {"depth": "depth", "width": "width", "train_size": "n", "weight_decay": "wd", "epochs": "epochs"}
KIND_LABELS = {"complexity": "bound / measure B", "from_init": "B on W - W0",
               "gap_bound": "gap bound (n, margin)", "gap_bound_from_init": "gap bound on W - W0"}
HEADLINE = ("spectral_adaptive", "edelman", "gap:spectral_adaptive", "gap:edelman")


# --- tables ---------------------------------------------------------------------------------------

def correlation_table(corr: pd.DataFrame, measures: pd.DataFrame, gap: str = PRIMARY_GAP) -> pd.DataFrame:
    """Wide table, one row per measure: overall tau per task and pooled, then the granulated
    ``psi`` per hyper-parameter, ``Psi``, and the twin agreement (pooled over tasks)."""
    sub = corr[corr["gap"] == gap]
    scopes = [s for s in sub["scope"].unique() if s != "all"] + ["all"]
    rows = []
    for m in measures.itertuples():
        c = sub[sub["measure"] == m.column]
        get = {(r.scope, r.statistic): r.tau for r in c.itertuples()}
        row = {"measure": m.column, "kind": m.kind}
        row.update({f"tau {s}": get.get((s, "overall"), math.nan) for s in scopes})
        row.update({HPARAM_LABELS.get(h, h): get.get(("all", h), math.nan) for h in HPARAMS})
        row["Psi"] = get.get(("all", "Psi"), math.nan)
        row["twins"] = get.get(("all", "twins"), math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def vacuity_table(runs: pd.DataFrame, measures: pd.DataFrame) -> pd.DataFrame:
    """For each gap bound: the share of runs where it is vacuous (>= 1), its smallest and median
    value, and the median of its ratio to the measured error gap (over runs with a positive gap)."""
    rows = []
    positive = runs[PRIMARY_GAP] > 0
    for m in measures[measures["kind"].str.startswith("gap_bound")].itertuples():
        flag = m.column.replace("gap:", "vacuous:", 1)
        values = runs[m.column]
        rows.append({"gap bound": m.column, "vacuous in": f"{int(runs[flag].sum())}/{len(runs)} runs",
                     "min": float(values.min()),
                     "median": float(values.median()),
                     "median bound / gap": float((values[positive] / runs.loc[positive, PRIMARY_GAP]).median())})
    return pd.DataFrame(rows)


def task_summary(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for task, sub in runs.groupby("task"):
        row = {"task": task, "runs": len(sub), "test examples": int(sub["n_test"].iloc[0])}
        for col in ("train_error", "test_error", "error_gap", "loss_gap", "margin"):
            row[col] = f"{sub[col].min():.3f} / {sub[col].median():.3f} / {sub[col].max():.3f}"
        rows.append(row)
    return pd.DataFrame(rows)


def twin_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per task: the twin pairs (:func:`.correlate.twin_pairs`) and how often the run on fewer
    examples trained longer has the larger gap."""
    from .correlate import twin_pairs

    rows = []
    runs = runs.reset_index(drop=True)
    for task, sub in runs.groupby("task"):
        pairs = twin_pairs(sub)
        if not pairs:
            continue
        sub = sub.reset_index(drop=True)
        a, b = sub.iloc[[p[0] for p in pairs]], sub.iloc[[p[1] for p in pairs]]
        row = {"task": task, "twin A (n, epochs)": f"({a['train_size'].iloc[0]}, {a['epochs'].iloc[0]})",
               "twin B (n, epochs)": f"({b['train_size'].iloc[0]}, {b['epochs'].iloc[0]})", "pairs": len(pairs)}
        for gap in GAPS:
            larger = int((a[gap].to_numpy() > b[gap].to_numpy()).sum())
            row[f"A has larger {gap}"] = f"{larger}/{len(pairs)}"
        row.update({"mean error gap A": a["error_gap"].mean(), "mean error gap B": b["error_gap"].mean()})
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, *, tau_columns: tuple[str, ...] = ()) -> str:
    """A Markdown table (no tabulate dependency); taus signed with two decimals, NaN as ``n/a``."""
    def cell(col, v):
        if isinstance(v, (bool, np.bool_)):
            return "yes" if v else "no"
        if isinstance(v, (float, np.floating)):
            if math.isnan(v):
                return "n/a"
            if col in tau_columns:
                return f"{v:+.2f}"
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"
        return str(v)

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(c, v) for c, v in zip(df.columns, row)) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def tau_columns(table: pd.DataFrame) -> tuple[str, ...]:
    return tuple(c for c in table.columns if c not in ("measure", "kind"))


def format_correlations(corr: pd.DataFrame, measures: pd.DataFrame, gap: str = PRIMARY_GAP) -> str:
    """The main table as text for the terminal."""
    table = correlation_table(corr, measures, gap).drop(columns="kind")
    fmt = {c: (lambda v: "n/a" if math.isnan(v) else f"{v:+.2f}") for c in tau_columns(table)}
    return table.to_string(index=False, formatters=fmt)


# --- figures --------------------------------------------------------------------------------------

def plot_against_gap(runs: pd.DataFrame, columns: list[str], path: Path, *, gap: str = PRIMARY_GAP,
                     ncols: int = 3, vacuity_line: bool = False, panel_size: tuple[float, float] = (2.5, 2.3),
                     dpi: int = PRINT_DPI) -> Path:
    """One panel per measure: log10 of its value against the measured gap, a colour per task,
    filled markers for the smallest training set; the title carries Kendall's tau, pooled and per task.
    Written as ``path`` (PNG, ``dpi``) and ``path`` with ``.pdf`` (TrueType fonts); panels shrink so
    that the figure is at most :data:`MAX_WIDTH` wide.
    (log10 on a linear axis rather than a log axis: the values span up to 40 decades, and
    matplotlib's log-axis layout is slow.)"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .correlate import kendall

    nrows = math.ceil(len(columns) / ncols)
    width = min(panel_size[0] * ncols, MAX_WIDTH)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, panel_size[1] * nrows + 0.6), squeeze=False)
    colours = dict(zip(sorted(runs["task"].unique()), ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    small = runs["train_size"] == runs.groupby("task")["train_size"].transform("min")
    for ax, col in zip(axes.flat, columns):
        values = runs[col].to_numpy(dtype=float)
        positive = bool(np.all(values[np.isfinite(values)] > 0))
        x = np.log10(values) if positive else values
        for task, colour in colours.items():
            for is_small, face in ((True, colour), (False, "none")):
                sel = ((runs["task"] == task) & (small == is_small)).to_numpy()
                ax.scatter(x[sel], runs.loc[sel, gap], s=14, edgecolors=colour, facecolors=face, linewidths=0.8,
                           label=f"{task}, {'smallest' if is_small else 'larger'} n")
        if vacuity_line:
            ax.axvline(0.0, color="grey", lw=0.8, ls="--")  # log10(1): vacuous to the right
        per_task = ", ".join(f"{t} {kendall(values[(runs['task'] == t).to_numpy()], runs.loc[runs['task'] == t, gap]):+.2f}"
                             for t in colours)
        ax.set_title(f"{col}\ntau: all {kendall(values, runs[gap]):+.2f}, {per_task}", fontsize=6)
        ax.set_xlabel("log10 value" if positive else "value", fontsize=7, labelpad=1)
        ax.set_ylabel(gap, fontsize=7, labelpad=1)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 2), fontsize=7, frameon=False)
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.08 if ncols > 2 else 0.12, right=0.98, top=1 - 0.45 / height,
                        bottom=(0.55 + 0.14 * math.ceil(len(labels) / 2)) / height, wspace=0.4, hspace=0.62)
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(PRINT_RC):
        fig.savefig(path, dpi=dpi)
        fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return path


# --- the report -----------------------------------------------------------------------------------

def write_report(out: Path, runs: pd.DataFrame, measures: pd.DataFrame, corr: pd.DataFrame, *,
                 timing: dict, command: str | None = None, figures: bool = True) -> dict[str, Path]:
    out = Path(out)
    files = {"runs.csv": out / "runs.csv", "correlations.csv": out / "correlations.csv",
             "study.json": out / "study.json", "report.md": out / "report.md"}
    runs.to_csv(files["runs.csv"], index=False)
    corr.to_csv(files["correlations.csv"], index=False)
    files["study.json"].write_text(json.dumps({"command": command, **timing}, indent=1))
    if figures:
        fig_dir = out / "figures"
        by_kind = {k: measures.loc[measures["kind"] == k, "column"].tolist() for k in measures["kind"].unique()}
        files["measures_vs_gap.png"] = plot_against_gap(
            runs, by_kind.get("complexity", []) + by_kind.get("from_init", []), fig_dir / "measures_vs_gap.png")
        files["gap_bounds_vs_gap.png"] = plot_against_gap(
            runs, by_kind.get("gap_bound", []) + by_kind.get("gap_bound_from_init", []),
            fig_dir / "gap_bounds_vs_gap.png", vacuity_line=True)
        headline = [c for c in HEADLINE if c in set(measures["column"])]
        files["headline.png"] = plot_against_gap(runs, headline, fig_dir / "headline.png",
                                                 ncols=min(len(headline), 2) or 1, panel_size=(3.0, 2.6))
    files["report.md"].write_text(format_report(runs, measures, corr, timing=timing, command=command,
                                                figures=figures))
    return files


def format_report(runs: pd.DataFrame, measures: pd.DataFrame, corr: pd.DataFrame, *, timing: dict,
                  command: str | None, figures: bool) -> str:
    main = correlation_table(corr, measures, PRIMARY_GAP)
    loss = correlation_table(corr, measures, "loss_gap")
    loss = loss[["measure"] + [c for c in loss.columns if c.startswith("tau ")] + ["Psi"]]
    parts = [
        "# Does the bound track generalization? Study report",
        "",
        f"Command: `{command or 'specbound study'}`  ",
        f"Grid `{timing['grid']}`: {len(runs)} runs ({', '.join(timing['tasks'])}); "
        f"{timing['trained']} trained and {timing['analysed']} analysed now, {timing['skipped']} reused; "
        f"{timing['jobs']} worker process(es), {timing['threads']} thread(s) in all; "
        f"{timing['seconds_training_and_analysis']:.0f} s of training and analysis in this invocation. "
        f"Recorded in the runs themselves (whenever they were trained): {runs['run_seconds'].sum():.0f} s of "
        f"training and evaluation summed over runs, at most {runs['run_seconds'].max():.0f} s for one run.",
        "",
        "Definitions: **error gap** = test error - train error (primary: what the margin bounds bound); "
        "loss gap = test - train cross-entropy. Every measure is `specbound.analyze(model, init=init, "
        "n=train_size, margin=gamma)`; gamma = 10th percentile of the positive training logit margins "
        "divided by the head's Lipschitz constant. Gap bounds use the unstated constants c_lead = c_conf = 1 "
        "and delta = 0.05; a gap bound >= 1 is vacuous. Kendall tau > 0: a larger measure goes with a "
        "larger gap. Granulated columns (depth ... epochs): Jiang et al. (ICLR 2020) psi, the mean tau "
        "over groups of runs that differ only in that hyper-parameter (same seed and task); "
        "Psi = their mean. twins: the mean tau over the twin pairs (same steps, 4x the data for B), "
        "+1 if the measure orders every pair as the gap does.",
        "",
        "## Runs (min / median / max)",
        "",
        markdown(task_summary(runs)),
        "",
        "## Twins: fewer examples trained longer vs more examples trained shorter",
        "",
        markdown(twin_table(runs)),
        "",
        f"## Kendall tau against the error gap ({PRIMARY_GAP})",
        "",
        markdown(main.drop(columns="kind"), tau_columns=tau_columns(main)),
        "",
        "## Kendall tau against the loss gap",
        "",
        markdown(loss, tau_columns=tau_columns(loss)),
        "",
        "## Are the gap bounds vacuous?",
        "",
        markdown(vacuity_table(runs, measures)),
        "",
    ]
    if figures:
        parts += ["## Figures", "", "PNG at 200 dpi; each also as PDF beside it (`figures/*.pdf`).", "",
                  "![spectrum-adaptive and Edelman-style bound and gap bound against the measured gap]"
                  "(figures/headline.png)", "",
                  "![every bound and measure against the measured gap](figures/measures_vs_gap.png)", "",
                  "![every generalisation-gap bound against the measured gap](figures/gap_bounds_vs_gap.png)", ""]
    return "\n".join(parts)


def format_study(result) -> str:
    """What ``specbound study`` prints: the twin check, the main table, vacuity, where the files are."""
    runs, measures, corr, timing = result.runs, result.measures, result.correlations, result.timing
    vac = vacuity_table(runs, measures)
    never = [m.column for m in measures[measures["kind"].str.startswith("gap_bound")].itertuples()
             if not runs[m.column.replace("gap:", "vacuous:", 1)].all()]
    lines = [
        f"study '{timing['grid']}': {len(runs)} runs ({timing['trained']} trained now, {timing['skipped']} reused) "
        f"in {timing['seconds']:.0f} s with {timing['jobs']} worker(s) x {max(1, timing['threads'] // timing['jobs'])} thread(s)",
        "",
        "twins (fewer examples trained longer vs more examples trained shorter):",
        twin_table(runs).to_string(index=False),
        "",
        "Kendall tau of each measure with the error gap (test - train error); granulated psi per "
        "hyper-parameter and Psi pooled over tasks (Jiang et al. 2020):",
        format_correlations(corr, measures),
        "",
        f"gap bounds vacuous (>= 1) in every run: {len(vac) - len(never)} of {len(vac)}"
        + (f"; not always vacuous: {', '.join(never)}" if never else ""),
        "",
        "report: " + str(result.files.get("report.md", "")),
    ]
    return "\n".join(lines)
