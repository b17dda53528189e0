"""The ``specbound`` command: parses arguments and calls the library, nothing more."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import warnings
from dataclasses import replace

from . import __version__
from .errors import (
    ENVIRONMENT_ERRORS,
    SpecboundError,
    SpecboundWarning,
    missing_module,
    one_line,
    oversized_integer_text,
)
from .options import DEVICES, KernelOptions, option_fields, option_names


class _UsageError(Exception):
    """A command-line usage error, reported by :func:`main` on one line like every other error."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # `--n` must never be taken for `--no-progress`
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse's default prints the whole usage block and exits
        raise _UsageError(f"{message}{self._did_you_mean(message)} (see `{self.prog} --help`)")

    def _did_you_mean(self, message: str) -> str:
        """``--grid_m`` (the Python spelling) or a near miss: the option the user meant."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = sorted(set(_long_options(self)))
        for word in message.split(":", 1)[1].split():
            flag = word.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            dashed = flag.replace("_", "-")
            guess = [dashed] if dashed in known else difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
            if guess:
                return f"; did you mean {guess[0]}?"
        return ""


def _long_options(parser: argparse.ArgumentParser):
    """Every ``--option`` of ``parser`` and of its subcommands."""
    for action in parser._actions:
        yield from (o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _long_options(sub)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    return 0 if text.strip() == "0" else _positive_int(text)


def _count(text: str) -> int:
    """A positive integer, also in integral scientific notation (``--n 1e6``, ``6E4``): a decimal number that
    is a whole number; a fraction, a non-number or one beyond 1e300 is refused (before any huge integer is
    formed)."""
    from decimal import Decimal, InvalidOperation  # `--help` loads neither decimal nor pathlib

    try:
        value = Decimal(text.strip())
    except (InvalidOperation, ValueError):
        value = None
    if value is None or not value.is_finite() or value < 1 or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(
            f"expected a positive integer (digits, or a whole number in scientific notation such as 1e6), got {text!r}"
        )
    if value.adjusted() >= 300 and value > Decimal(10) ** 300:
        raise argparse.ArgumentTypeError(f"expected a positive integer of at most 1e300, got {text!r}")
    return int(value)


def _jobs(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _confidence(text: str) -> float:
    value = _number(text)
    if not 0 < value < 1:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a confidence level in (0, 1), got {text!r}")
    return value


_KIND_TYPES = {
    "positive_int": _positive_int,
    "count": _count,
    "number": _number,
    "jobs": _jobs,
    "path": str,
    "choice": str,
}


def _add_analysis_options(parser: argparse.ArgumentParser, *, key_only: bool = False) -> None:
    """One flag per :class:`~specbound.options.AnalysisOptions` field (``key_only``: those that change
    the numbers).  An absent flag is absent from the namespace, so the option keeps its default."""
    groups = {}
    for f in option_fields():
        meta = f.metadata
        if key_only and not meta["key"]:
            continue
        target = parser
        if meta["group"] == "gap":
            if "gap" not in groups:
                groups["gap"] = parser.add_argument_group(
                    "generalisation-gap bound (docs/spec.md section 7; needs --n and --margin)"
                )
            target = groups["gap"]
        default = meta["cli_default"] if meta["cli_default"] is not None and not key_only else argparse.SUPPRESS
        target.add_argument(
            meta["flag"],
            dest=f.name,
            type=_KIND_TYPES[meta["kind"]],
            choices=meta["choices"],
            metavar=meta["metavar"],
            default=default,
            help=meta["help"],
        )


def _config_from(args) -> dict | None:
    """``--config FILE`` then ``--set KEY=VALUE`` overrides, or None when neither is given."""
    config: dict = {}
    if getattr(args, "config_file", None):
        from pathlib import Path

        from .io.base import MAX_SMALL_FILE_BYTES, load_json

        config = load_json(Path(args.config_file), "--config file", "pass a config.json file", MAX_SMALL_FILE_BYTES)
        if not isinstance(config, dict):
            raise SpecboundError(f"--config {args.config_file} must hold a JSON object, found {type(config).__name__}")
    for item in getattr(args, "config_set", None) or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SpecboundError(f"--set expects KEY=VALUE, found {item!r}; e.g. --set num_attention_heads=12")
        try:
            config[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            config[key.strip()] = text
        except ValueError:  # an integer beyond Python's int-string limit
            raise oversized_integer_text(f"read --set {key.strip()}=...", "fix the value") from None
    return config or None


def _options_from(args) -> dict:
    """The analysis options given on the command line, by name."""
    return {name: getattr(args, name) for name in option_names() if hasattr(args, name)}


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specbound",
        description="Spectrum-adaptive generalization bounds and baselines for trained Transformers.",
    )
    parser.add_argument("--version", action="version", version=f"specbound {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    an = sub.add_parser(
        "analyze",
        help="analyse one checkpoint",
        description=(
            "Analyse one checkpoint: spectra of every QK/OV head and feed-forward matrix, the "
            "spectrum-adaptive bound, the Edelman-style baseline and the other baselines (docs/bounds.md)."
        ),
    )
    an.add_argument(
        "source",
        nargs="?",
        help=(
            "a model folder (Hugging Face layout), a weights file (.safetensors, .bin/.pt, .onnx, .gguf, tf_model.h5, "
            "flax_model.msgpack), a PEFT LoRA adapter folder (merged into --base, or the base it names) or a hub id "
            "ORG/NAME[@REVISION], read from the Hugging Face cache or fetched (config.json and safetensors only) "
            "(default: the embedded all-MiniLM-L6-v2)"
        ),
    )
    an.add_argument(
        "--revision",
        metavar="REV",
        help=("the hub id's branch, tag or commit hash (the same as ORG/NAME@REV; default: main)"),
    )
    an.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    an.add_argument("--out", metavar="DIR", help="also write tables (Parquet, CSV) and summary.json to DIR")
    an.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a layers progress bar on stderr (default: when stderr is a terminal); --no-progress "
        "and --quiet also hide a hub id's download bars",
    )
    talk = an.add_mutually_exclusive_group()
    talk.add_argument(
        "--quiet", action="store_true", help="text: the headline bounds only, one per line; no progress bar"
    )
    talk.add_argument(
        "--verbose",
        action="store_true",
        help="text: also every matrix (its checkpoint tensors, shape, rank, p*, contribution); "
        "a hub fetch: huggingface_hub's own lines (each retry)",
    )
    loading = an.add_argument_group("loading (not analysis options: how to read the checkpoint)")
    loading.add_argument(
        "--config",
        metavar="FILE",
        dest="config_file",
        help="a config.json for a checkpoint without one (an ONNX export on its own); its keys "
        "win over config.json's and over what the graph shows",
    )
    loading.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        dest="config_set",
        default=[],
        help="one config key (repeatable; VALUE read as JSON when it parses, else as text): "
        "--set num_attention_heads=12 --set hidden_act=gelu",
    )
    loading.add_argument(
        "--stream",
        action="store_true",
        help="read a hub id not in the cache by HTTP range requests (each shard's header, then each "
        "tensor when its layer is analysed), never downloading it: disk use none, memory one layer",
    )
    loading.add_argument(
        "--disk-budget",
        metavar="BYTES",
        type=_disk_budget,
        help="stream a hub id not in the cache when its weights exceed BYTES (20GB, 500MiB, "
        "1000000); default: the free space of the cache's filesystem",
    )
    _add_analysis_options(an)

    cp = sub.add_parser(
        "compare",
        help="two or more models side by side: bounds, per layer, per role, a figure",
        description=(
            "Analyse (or reopen) two or more models and put them side by side: every bound of each, its ratio to the "
            "first model's, the spectrum-adaptive contribution per layer and per role with the differences, and one "
            "figure (--out). A model is anything `analyze` reads (a folder, a weights file, a hub id, a LoRA adapter: "
            "--base names its base), a folder written by `analyze --out`, or a results store's record STORE#KEY "
            "(a key, a key prefix or a source name). docs/compare.md."
        ),
    )
    cp.add_argument("sources", nargs="+", metavar="MODEL", help="two or more models; the first is the reference")
    cp.add_argument("--names", metavar="A,B,...", help="display names, one per model, comma-separated")
    cp.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    cp.add_argument("--out", metavar="DIR", help="also write bounds.csv, layers.csv, roles.csv and compare.png/.pdf")
    cp.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a layers progress bar on stderr for each model analysed (default: when stderr is a terminal)",
    )
    _add_analysis_options(cp)

    arch = sub.add_parser(
        "arch",
        help="architecture specs: draft one for a family not shipped",
        description=(
            "Architecture specs map a family's tensor names to the roles of the bounds (docs/architectures.md). "
            "`specbound arch infer SOURCE` drafts one from a checkpoint; pass it to analyze with --arch-spec."
        ),
    )
    arch_sub = arch.add_subparsers(dest="arch_command", required=True, metavar="infer")
    infer = arch_sub.add_parser(
        "infer",
        help="draft a spec file from a checkpoint's tensor names and config",
        description=(
            "Draft an architecture spec from a checkpoint's tensor names, shapes and config.json: the spec on "
            "stdout (or --out FILE), and on stderr every guess with its evidence and what you must verify "
            "(square weights cannot reveal their orientation; a fused qkv's split cannot be seen in shapes)."
        ),
    )
    infer.add_argument("source", help="model folder, weights file (.safetensors, .bin, .onnx, ...) or hub id")
    infer.add_argument("--out", metavar="FILE", help="write the spec to FILE instead of stdout")

    sw = sub.add_parser(
        "sweep",
        help="analyse many checkpoints into a results store",
        description=(
            "Analyse every source (folders, hub ids in the local cache, globs and brace patterns such as "
            "'google/bert_uncased_L-{2..12}_H-{128..768}_A-{H/64}') into a results store, one record per "
            "checkpoint and option set; what is already stored is skipped."
        ),
    )
    sw.add_argument("sources", nargs="*", metavar="SOURCE", help="model folder, hub id, glob or brace pattern")
    sw.add_argument("--config", metavar="FILE", help="TOML file naming sources, options and the store (docs/sweeps.md)")
    sw.add_argument(
        "--store", metavar="DIR", help="results store folder (default: the config's, else specbound-results)"
    )
    where = sw.add_mutually_exclusive_group()
    where.add_argument(
        "--workers", type=_positive_int, metavar="K", help="run on a local Dask cluster of K worker processes"
    )
    where.add_argument("--scheduler", metavar="ADDRESS", help="run on an existing Dask cluster (tcp://host:port)")
    sw.add_argument(
        "--per-layer",
        choices=("auto", "always", "never"),
        default="auto",
        help="on Dask, one task per layer for checkpoints over 2 GiB (auto), for all, or never",
    )
    sw.add_argument("--threads", type=_positive_int, default=1, help="BLAS threads per task (default 1)")
    sw.add_argument(
        "--jobs",
        type=_jobs,
        default="auto",
        metavar="J",
        help="layers of each checkpoint analysed at once, in threads (default auto: one per core "
        "as memory allows in a local run, 1 on Dask)",
    )
    sw.add_argument(
        "--device",
        choices=DEVICES,
        help="where each task's linear algebra runs: numpy (default), or torch float64 on cpu or cuda "
        "(the same records: devices differ only within each record's proven error bound)",
    )
    sw.add_argument(
        "--metrics",
        metavar="FILE",
        help="your numbers per checkpoint (loss, accuracy, gap): a CSV with a 'source' column, or JSON "
        "{source: {name: value}}; carried into the records beside each checkpoint's own "
        "metrics.json, and correlated with every bound by scaling and report (docs/metrics.md)",
    )
    sw.add_argument("--dry-run", action="store_true", help="list the checkpoints and what is stored; analyse nothing")
    sw.add_argument("--no-progress", action="store_true", help="no progress bars (default: shown on a terminal)")
    _add_analysis_options(sw, key_only=True)

    sc = sub.add_parser(
        "scaling",
        help="log-log growth of every bound with depth and width, from a store",
        description="Fit, for every bound and every role, log B against log L at fixed N and "
        "against log N at fixed L (slopes with confidence intervals), from stored records.",
    )
    sc.add_argument(
        "--store", metavar="DIR", default="specbound-results", help="results store (default specbound-results)"
    )
    sc.add_argument("--bound", action="append", metavar="NAME", help="only this bound (repeatable; default all)")
    sc.add_argument(
        "--against",
        metavar="X[:BY]",
        action="append",
        help="fit against column X holding BY fixed (default L:N and N:L; e.g. label_step)",
    )
    sc.add_argument("--detail", action="store_true", help="one fit per fixed value as well as the pooled one")
    sc.add_argument("--confidence", type=_confidence, default=0.95, help="confidence level (default 0.95)")
    sc.add_argument(
        "--format", choices=("text", "csv", "markdown", "json"), default="text", help="output format (default: text)"
    )

    pa = sub.add_parser(
        "paper",
        help="the paper's depth/width figure and growth slopes, on your checkpoints",
        description=(
            "Redraw the paper's depth/width figure (Sakai & Imaizumi 2026, Section 5: the spectrum-adaptive bound "
            "grows much more slowly with depth L and width N than the Edelman-style proxy) on your checkpoints, with "
            "each bound's fitted growth slope in L (at fixed N) and in N (at fixed L) and its confidence interval, "
            "and say whether the claim holds. From checkpoint folders (swept into --store; L and N read from each "
            "model), an existing results store, or a `specbound study` folder. Writes paper.png, paper.pdf and "
            "slopes.csv to --out (docs/sweeps.md, 'The paper's figure in one command')."
        ),
    )
    pa.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="checkpoints (folders, hub ids in the cache, globs, brace patterns as in sweep), "
        "analysed into --store first; none: use --store or --study as it is",
    )
    pa.add_argument(
        "--store", metavar="DIR", help="results store: read (no SOURCE) or swept into (default with SOURCEs: OUT/store)"
    )
    pa.add_argument(
        "--study",
        metavar="DIR",
        help="a `specbound study` folder: its runs.csv (the runs that met "
        "the criterion; groups: runs differing only in depth or width)",
    )
    pa.add_argument(
        "--out",
        metavar="DIR",
        default="specbound-paper",
        help="folder for paper.png, paper.pdf, slopes.csv (default specbound-paper)",
    )
    pa.add_argument(
        "--bound",
        action="append",
        metavar="NAME",
        help="the bounds to fit and draw (repeatable; default spectral_adaptive and edelman)",
    )
    pa.add_argument("--confidence", type=_confidence, default=0.95, help="confidence level (default 0.95)")
    pa.add_argument("--format", choices=("text", "csv", "json"), default="text", help="output format (default: text)")

    pl = sub.add_parser(
        "plot",
        help="draw the figures from a store (PNG and PDF)",
        description="Draw every figure from stored records (never recomputing spectra).",
    )
    pl.add_argument(
        "--store", metavar="DIR", default="specbound-results", help="results store (default specbound-results)"
    )
    pl.add_argument("--out", metavar="DIR", default="specbound-figures", help="folder for the figures")
    pl.add_argument("--model", metavar="SOURCE", help="the record of one-model figures (default the largest)")
    pl.add_argument(
        "--fixed-l", type=_positive_int, metavar="L", help="depth of the norms-vs-N figure (default smallest)"
    )
    pl.add_argument("--bound", action="append", metavar="NAME", help="only this bound (repeatable; default all)")

    rp = sub.add_parser(
        "report",
        help="one self-contained HTML report and a Markdown summary from a store",
        description="Write report.html (self-contained: figures inline, no external URL), "
        "report.md and figures/ from stored records, never recomputing spectra.",
    )
    rp.add_argument(
        "--store", metavar="DIR", default="specbound-results", help="results store (default specbound-results)"
    )
    rp.add_argument(
        "--out", metavar="DIR", default="specbound-report", help="folder for report.html, report.md, figures/"
    )
    rp.add_argument("--model", metavar="SOURCE", help="the record of one-model figures (default the largest)")
    rp.add_argument(
        "--fixed-l", type=_positive_int, metavar="L", help="depth of the norms-vs-N figure (default smallest)"
    )
    rp.add_argument("--bound", action="append", metavar="NAME", help="only this bound (repeatable; default all)")
    rp.add_argument(
        "--confidence", type=_confidence, default=0.95, help="confidence level of the slopes (default 0.95)"
    )

    mi = sub.add_parser(
        "miniatures",
        help="write a BERT-Miniatures-shaped family of random checkpoints",
        description=(
            "Write 24 random BERT checkpoints with the BERT Miniatures' shapes (L in 2..12, N in 128..768, "
            "N/64 heads, d_ff = 4N), as a Hugging Face cache (point HF_HUB_CACHE at it and the ids "
            "google/bert_uncased_L-*_H-*_A-* resolve) or as plain folders."
        ),
    )
    mi.add_argument("folder", help="where to write (created if missing)")
    mi.add_argument(
        "--layout",
        choices=("hf-cache", "folders"),
        default="hf-cache",
        help="a Hugging Face cache (default) or one plain folder per checkpoint",
    )
    mi.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")

    be = sub.add_parser(
        "bench",
        help="time the analysis against the dense reference method",
        description=(
            "Time specbound on a synthetic checkpoint against a baseline run in the same process (the dense "
            "reference method, WeightWatcher when installed) and print medians and ratios (docs/benchmarks.md)."
        ),
    )
    be.add_argument(
        "--scenario",
        choices=("bert-base", "large", "llama7b", "llama70b-layer", "kernels", "miniatures", "threads"),
        default="bert-base",
        help="bert-base: one BERT-base-shaped checkpoint against the dense reference and "
        "WeightWatcher (default); large: the llama7b scenario on 4 layers (time per layer, peak "
        "RSS, stage times); llama7b: a LLaMA-7B-shaped bf16 checkpoint (11.9 GB, written and deleted), "
        "the whole analysis, peak RSS, stage times; llama70b-layer: one LLaMA-2-70B-shaped layer (1.7 GB) "
        "through the Dask per-layer path on one 4 GiB worker (time, worker peak RSS), then its "
        "stage times against their floors; kernels: the eigensolvers and (1,1)-norm tilings at "
        "n = 768, 2048, 4096 (the measurements behind the kernel choices); miniatures: a sweep of the 24 "
        "BERT-Miniatures shapes, total and per checkpoint; threads: analyze() with its defaults "
        "against threads=1 and jobs=1 on the embedded checkpoint, interleaved (with --load K busy "
        "processes beside it)",
    )
    be.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    be.add_argument("--repeats", type=_positive_int, default=3, help="timed runs of the fast path (median reported)")
    be.add_argument("--threads", type=_positive_int, default=1, help="BLAS threads per job (default 1)")
    be.add_argument(
        "--jobs",
        type=_positive_int,
        metavar="J",
        help="bert-base and miniatures: also time every contender on J cores (default: all cores "
        "this process may use; 1: one core only); large, llama7b: layers at once (default 1, 2)",
    )
    be.add_argument("--workdir", metavar="DIR", help="where to write the synthetic checkpoint (default: a temp dir)")
    be.add_argument(
        "--layers",
        type=_positive_int,
        metavar="L",
        help="llama7b: write and analyse only L layers (a disk short of 11.9 GB; the 32-layer time "
        "is then extrapolated, and says so); llama70b-layer: L layers (default 1)",
    )
    be.add_argument("--device", choices=DEVICES, help="large, llama7b: where the linear algebra runs (default numpy)")
    be.add_argument(
        "--against",
        metavar="SRC",
        help="large: time the same analysis with the code in another checkout SRC too (e.g. `git "
        "worktree add --detach SRC COMMIT`), interleaved in fresh processes, --repeats rounds; "
        "prints both medians and their ratio (with --layers L: L layers, default 4)",
    )
    be.add_argument(
        "--load",
        type=_non_negative_int,
        default=0,
        metavar="K",
        help="threads: K busy processes run beside the measurement (default 0: idle)",
    )
    st = sub.add_parser(
        "study",
        help="train small transformers on real data and check the bounds against their gaps",
        description=(
            "Train a grid of small transformers to a criterion on the CPU (a ViT on Fashion-MNIST, BERT-style "
            "encoders for word-level language identification and fortune topics), analyse every checkpoint, and "
            "report how every bound ranks the measured generalisation gap: Kendall's tau, granulated psi (Jiang et "
            "al. 2020), Jiang's K and the robust sign-error (Dziugaite et al. 2020), with bootstrap intervals, per "
            "task; figures; which bounds are vacuous. Resumable: finished runs in --out are reused. docs/study.md."
        ),
    )
    st.add_argument(
        "--quick",
        action="store_true",
        help="the small grid (33 runs, about 3 minutes on two idle cores) instead of "
        "the default grid (270 runs); the same as --grid quick",
    )
    st.add_argument(
        "--grid",
        choices=("default", "quick", "deep"),
        help="default (270 runs), quick (33) or deep (the default grid with depth up to 12: 324 runs, "
        "the 54 deep ones for Dask workers; docs/study-results.md)",
    )
    st.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild the statistics and the report from --out's runs.csv (and pstar.csv) alone: "
        "nothing trained or analysed, no run folder read",
    )
    st.add_argument(
        "--estimate",
        action="store_true",
        help="print the runs the grid still needs and an estimate of their CPU time from the CPU "
        "seconds measured in --out's runs.csv; train nothing",
    )
    st.add_argument(
        "--out",
        metavar="DIR",
        default="specbound-study",
        help="study folder: runs/ and the report (default: specbound-study)",
    )
    st.add_argument("--threads", type=_positive_int, default=2, help="CPU threads in all (default 2)")
    st.add_argument(
        "--jobs", type=_positive_int, help="worker processes (default: --threads; each gets threads/jobs torch threads)"
    )
    st.add_argument(
        "--tasks", default="fmnist,langid,fortunes", help="comma-separated tasks (default fmnist,langid,fortunes)"
    )
    st.add_argument("--seeds", help="comma-separated seeds replacing the grid's (e.g. 0,1,2,3,4: a bigger study)")
    st.add_argument(
        "--workers",
        type=_positive_int,
        metavar="K",
        help="run every run as a Dask task on a local cluster of K worker processes",
    )
    st.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run every run as a Dask task on an existing cluster (tcp://host:port); its workers must "
        "share --out and have the data installed",
    )
    st.add_argument("--bootstrap", type=int, metavar="B", help="bootstrap replicates for the intervals (default 200)")
    st.add_argument(
        "--reanalyze",
        action="store_true",
        help="recompute every run's analysis.json (after a change to the bounds); keeps the training",
    )
    st.add_argument("--no-figures", action="store_true", help="skip the figures (no matplotlib needed)")

    dc = sub.add_parser(
        "docs",
        help="the documentation, offline: list its pages, print one or one section",
        description="Print a documentation page of this version of specbound, or one of its "
        "sections: every `docs/PAGE.md section N` that the output and the error "
        "messages cite is `specbound docs PAGE N`. With no topic, the list of pages.",
    )
    dc.add_argument("topic", nargs="?", help="a page: theory, bounds, getting-started, cli, ... (docs/theory.md too)")
    dc.add_argument(
        "section",
        nargs="*",
        help="a section number as the output cites it (6, 3d, 3.2) or words of a heading (rope scaling)",
    )
    dc.add_argument("--path", action="store_true", help="print the page's file path instead of its text")
    return parser


def _disk_budget(text: str) -> int:
    from .io.hub_fetch import parse_size

    try:
        return parse_size(text)
    except SpecboundError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _analyze(args) -> int:
    from .pipeline import LayersBar, analyze
    from .records.view import format_headline, format_summary

    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):  # fail before the work
        raise SpecboundError(f"--out {args.out} is a file; pass a folder (created if missing) for the tables")
    show = (sys.stderr.isatty() and not args.quiet) if args.progress is None else args.progress
    if args.quiet or args.progress is False:  # huggingface_hub, imported when a hub id is fetched, reads it
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    bar = LayersBar(show)
    from .io.hub_errors import show_details

    show_details(args.verbose)  # huggingface_hub's retry lines on stderr only with --verbose
    source = args.source
    if args.revision is not None:
        if not args.revision.strip():
            raise SpecboundError(
                "--revision names an empty revision: leave --revision out for the main branch, "
                "or pass a branch, tag or commit hash"
            )
        if not source or "@" in source or os.path.exists(source):
            raise SpecboundError(
                f"--revision {args.revision} needs a hub id ORG/NAME without @REV; got "
                f"{source or 'no source'}: pass ORG/NAME --revision REV or ORG/NAME@REV"
            )
        source = f"{source}@{args.revision}"
    try:
        result = analyze(
            source,
            progress=bar,
            config=_config_from(args),
            stream=args.stream,
            disk_budget=args.disk_budget,
            **_options_from(args),
        )
    finally:
        bar.close()
    if args.out:
        try:
            result.save(args.out)
        except OSError as exc:
            raise SpecboundError(
                f"cannot write the tables to {args.out} ({exc.strerror or exc}: {exc.filename or args.out}); "
                f"pass --out a folder you can write to"
            ) from None
    towers = not hasattr(result, "matrices")  # a two-tower model's TowerAnalyses
    if args.format == "json":
        print(result.to_json())
    elif args.quiet:
        print(result.headline() if towers else format_headline(result))
    else:
        print(result.summary(verbose=args.verbose) if towers else format_summary(result, verbose=args.verbose))
        if args.out:
            print(f"\ntables and summary written to {args.out}")
    return 0


def _compare(args) -> int:
    from .report.compare import compare

    if len(args.sources) < 2:
        raise _UsageError(
            f"compare needs two or more models, found {len(args.sources)} (see `specbound compare --help`)"
        )
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):  # fail before the work
        raise SpecboundError(f"--out {args.out} is a file; pass a folder (created if missing)")
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    show = sys.stderr.isatty() if args.progress is None else args.progress
    result = compare(*args.sources, names=names, progress=show, **_options_from(args))
    print(json.dumps(result.to_dict(), indent=2, allow_nan=False) if args.format == "json" else result)
    if args.out:
        written = result.save(args.out)
        if args.format == "text":
            print(f"\n{len(written)} file(s) written to {args.out}")
    return 0


def _sweep(args) -> int:
    from .sweep.sources import expand_sources, load_sweep_config
    from .sweep.run import plan_sweep, run_sweep, SweepReport

    config = load_sweep_config(args.config) if args.config else None
    patterns = list(args.sources) + (config.sources if config else [])
    if not patterns:
        raise _UsageError("sweep needs at least one SOURCE or --config FILE (see `specbound sweep --help`)")
    flags = {k: v for k, v in _options_from(args).items() if k in option_names(key_only=True)}
    option_sets = [{**o, **flags} for o in (config.option_sets if config else [{}])]
    store = args.store or (config.store if config and config.store else "specbound-results")
    sources = expand_sources(patterns)
    if args.metrics:
        from .sweep.metrics import match_metrics, read_metrics_file

        given = match_metrics([s.name for s in sources], read_metrics_file(args.metrics))
        sources = [replace(s, metrics=given.get(s.name, {})) for s in sources]
    if args.dry_run:
        from .sweep.store import Store

        st = Store(store)
        report = SweepReport(store=st.root)
        tasks = plan_sweep(sources, option_sets, report, st)
        for task in tasks:
            labels = " ".join(f"{k}={v}" for k, v in task.source.labels.items())
            state = "stored" if task.key in st else "to do"
            print(f"{state:7} {task.key}  {task.source.name}  layers={task.layers} matrices={task.matrices}  {labels}")
        for name in report.duplicates:
            print(f"same    {name}: same weights and options as a source above")
        for source, message in report.failed:
            print(f"failed  {source}: {message}")
        print(f"{len(tasks)} task(s), {sum(t.key in st for t in tasks)} already in {store}")
        return 0
    report = run_sweep(
        sources,
        store,
        option_sets=option_sets,
        workers=args.workers,
        scheduler=args.scheduler,
        per_layer=args.per_layer,
        threads=args.threads,
        jobs=args.jobs,
        progress=False if args.no_progress else None,
        device=args.device,
    )
    print(report.summary())
    return 1 if report.failed else 0


def _existing_store(path: str):
    from .sweep.store import Store

    store = Store(path)
    if not store.keys():
        raise SpecboundError(f"no records in the results store {path}; run `specbound sweep ... --store {path}` first")
    return store


def _store_with_bounds(args):
    """The existing store of ``--store``, every ``--bound`` checked to be in it."""
    store = _existing_store(args.store)
    unknown = sorted(set(args.bound or ()) - set(store.bound_names()))
    if unknown:
        raise SpecboundError(
            f"unknown bound(s) {', '.join(unknown)} for --bound; the store holds {', '.join(store.bound_names())}"
        )
    return store


def _scaling(args) -> int:
    from .report.scaling import scaling_table, summary_table

    against = [("L", "N"), ("N", "L")]
    if args.against:
        against = [(a.split(":", 1)[0], a.split(":", 1)[1] if ":" in a else None) for a in args.against]
    fits = scaling_table(
        _existing_store(args.store),
        bounds=args.bound,
        confidence=args.confidence,
        per_group=args.detail,
        against=against,
    )
    from .report.scaling import left_out_note

    table = fits if args.detail or args.format != "text" else summary_table(fits)
    if args.format == "csv":
        print(table.to_csv(index=False), end="")
    elif args.format == "json":
        print(table.to_json(orient="records", indent=2))
    elif args.format == "markdown":
        from .records.view import markdown_table

        print(markdown_table(table))
    else:
        import pandas as pd

        with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_rows", None):
            print(table.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.4g}"))
    for line in left_out_note(fits):
        print(f"specbound: note: {line}", file=sys.stderr)
    _print_metric_correlations(args)
    return 0


def _print_metric_correlations(args) -> None:
    """Kendall's tau of every bound against each of the records' own metrics, when they have any."""
    from .report.metrics import metric_correlations, metric_names

    store = _existing_store(args.store)
    table = store.table()
    if args.format != "text" or not metric_names(table):
        return
    corr = metric_correlations(table, args.bound or store.bound_names())
    print("\nyour metrics: Kendall's tau of each bound with each metric over the records (p = two-sided p-value)")
    print(corr.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.3g}"))


def _plot(args) -> int:
    from .report.plots import render_all

    for path in render_all(
        _store_with_bounds(args), args.out, model=args.model, fixed_L=args.fixed_l, bounds=args.bound
    ):
        print(path)
    return 0


def _paper(args) -> int:
    from .study.paper import PAPER_BOUNDS, store_points, study_points, write_paper

    bounds = args.bound or list(PAPER_BOUNDS)
    if args.study and (args.sources or args.store):
        raise _UsageError("--study reads a study's runs.csv; pass either it or SOURCEs / --store, not both")
    failed = False
    if args.study:
        import pandas as pd

        path = os.path.join(args.study, "runs.csv")
        if not os.path.isfile(path):
            raise SpecboundError(f"no runs.csv in {args.study}: pass the folder `specbound study --out` wrote")
        points, title = study_points(pd.read_csv(path), bounds), f"study {args.study}"
    elif args.sources:
        from .sweep.run import run_sweep
        from .sweep.sources import expand_sources

        store = args.store or os.path.join(args.out, "store")
        report = run_sweep(expand_sources(args.sources), store, progress=False)
        print(report.summary(), file=sys.stderr)
        failed = bool(report.failed)
        points, title = store_points(_existing_store(store), bounds), f"store {store}"
    elif args.store:
        args.bound = bounds
        points, title = store_points(_store_with_bounds(args), bounds), f"store {args.store}"
    else:
        raise _UsageError(
            "paper needs checkpoints (SOURCE ...), --store DIR or --study DIR (see `specbound paper --help`)"
        )
    result = write_paper(points, args.out, confidence=args.confidence, title=title)
    fits = result["fits"]
    if args.format == "csv":
        print(fits.to_csv(index=False), end="")
    elif args.format == "json":
        print(fits.to_json(orient="records", indent=2))
    else:
        print(fits.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
        for line in result["verdicts"]:
            print(line)
        for path in result["files"]:
            print(f"wrote {path}")
    return 1 if failed else 0


def _report(args) -> int:
    from .report.html import write_report

    paths = write_report(
        _store_with_bounds(args),
        args.out,
        model=args.model,
        fixed_L=args.fixed_l,
        bounds=args.bound,
        confidence=args.confidence,
    )
    print(f"report: {paths['html']}\nsummary: {paths['markdown']}\nfigures: {paths['figures']}")
    return 0


def _miniatures(args) -> int:
    from .tools.miniatures import HUB_PATTERN, write_miniatures

    folders = write_miniatures(
        args.folder, layout=args.layout, seed=args.seed, progress=lambda name: print(f"wrote {name}", file=sys.stderr)
    )
    print(f"{len(folders)} checkpoints written to {args.folder}")
    if args.layout == "hf-cache":
        print(f"try: HF_HUB_CACHE={args.folder} specbound sweep '{HUB_PATTERN}'")
    return 0


def _arch(args) -> int:
    from .archs.graph_config import complete_config
    from .archs.infer import infer_spec
    from .io import open_checkpoint

    ckpt, inferred = complete_config(open_checkpoint(args.source))  # an ONNX export without config.json
    try:
        draft = infer_spec(ckpt, inferred)
    finally:
        ckpt.close()
    text = json.dumps(draft.spec, indent=2) + "\n"
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as exc:
            raise SpecboundError(
                f"cannot write the spec to {args.out} ({exc.strerror or exc}); pass --out a file path you can write to"
            ) from None
    else:
        sys.stdout.write(text)
    where = args.out or "the spec file"
    print(draft.report() + f"\n\nuse it with: specbound analyze {args.source} --arch-spec {where}", file=sys.stderr)
    return 0


def _study(args) -> int:
    from .study.pipeline import run_study
    from .study.report import format_study

    if os.path.exists(args.out) and not os.path.isdir(args.out):  # fail before the work
        raise SpecboundError(f"--out {args.out} is a file; pass a folder (created if missing) for the study")
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    try:
        seeds = tuple(int(v) for v in args.seeds.split(",") if v.strip()) if args.seeds else None
    except ValueError:
        raise SpecboundError(f"--seeds expects comma-separated integers, got {args.seeds!r}") from None
    if args.quick and args.grid not in (None, "quick"):
        raise SpecboundError(f"--quick is --grid quick; it cannot be combined with --grid {args.grid}")
    grid = "quick" if args.quick else (args.grid or "default")
    command = " ".join(["specbound", *args.argv])
    if args.report_only and args.estimate:
        raise SpecboundError("--report-only and --estimate do different things; pass one")
    if args.report_only:
        from .study.pipeline import report_study

        result = report_study(args.out, bootstrap=args.bootstrap, figures=not args.no_figures, command=command)
    elif args.estimate:
        from .study.timing import estimate_grid, format_estimate

        print(format_estimate(estimate_grid(args.out, grid=grid, tasks=tasks, seeds=seeds), args.workers))
        return 0
    else:
        result = run_study(
            args.out,
            grid=grid,
            tasks=tasks,
            threads=args.threads,
            jobs=args.jobs,
            workers=args.workers,
            scheduler=args.scheduler,
            seeds=seeds,
            bootstrap=args.bootstrap,
            reanalyze=args.reanalyze,
            figures=not args.no_figures,
            command=command,
        )
    print(format_study(result))
    return 0


def _bench(args) -> int:
    from .tools import bench, bench_dask, bench_threads

    kernel = KernelOptions(**({"device": args.device} if args.device else {}))

    runs = {
        "bert-base": (
            lambda: bench.run_bench(repeats=args.repeats, threads=args.threads, jobs=args.jobs, workdir=args.workdir),
            bench.format_bench,
        ),
        "large": (
            lambda: bench.run_llama7b_bench(
                layers=bench.LARGE_LAYERS,
                threads=args.threads,
                jobs=args.jobs or 1,
                kernel=kernel,
                workdir=args.workdir,
            ),
            bench.format_llama7b_bench,
        ),
        "llama7b": (
            lambda: bench.run_llama7b_bench(
                layers=args.layers, threads=args.threads, jobs=args.jobs or 2, kernel=kernel, workdir=args.workdir
            ),
            bench.format_llama7b_bench,
        ),
        "llama70b-layer": (
            lambda: bench_dask.run_dask_layer_bench(layers=args.layers or 1, workdir=args.workdir),
            bench_dask.format_dask_layer_bench,
        ),
        "kernels": (
            lambda: bench.run_kernels_bench(threads=args.threads, repeats=args.repeats),
            bench.format_kernels_bench,
        ),
        "miniatures": (
            lambda: bench.run_miniatures_bench(threads=args.threads, jobs=args.jobs, workdir=args.workdir),
            bench.format_miniatures_bench,
        ),
        "threads": (
            lambda: bench_threads.run_threads_bench(repeats=args.repeats, load=args.load),
            bench_threads.format_threads_bench,
        ),
    }
    if args.against is not None:
        if args.scenario != "large":
            raise _UsageError(
                f"--against times the large scenario against other code; found --scenario {args.scenario}"
            )
        from .tools import bench_ab

        runs["large"] = (
            lambda: bench_ab.run_ab_bench(
                args.against,
                layers=args.layers or bench.LARGE_LAYERS,
                repeats=args.repeats,
                threads=args.threads,
                workdir=args.workdir,
            ),
            bench_ab.format_ab_bench,
        )
    run, fmt = runs[args.scenario]
    from .tools.bench_machine import format_machine, machine_info

    machine = machine_info()  # every scenario says what it ran on (docs/benchmarks.md)
    report = {"machine": machine, **run()}
    print(json.dumps(report, indent=2) if args.format == "json" else format_machine(machine) + "\n\n" + fmt(report))
    return 0


def _docs(args) -> int:
    from .tools import doc_pages
    from .tools.doc_tables import cli_reference

    if args.path:
        if args.topic is None:
            raise _UsageError("--path needs a TOPIC")
        print(doc_pages.page_path(args.topic))
        return 0
    generated = {"cli": ("Command line", lambda: cli_reference(_parser()))}
    sys.stdout.write(doc_pages.show(args.topic, " ".join(args.section) or None, generated=generated))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        print(f"specbound: error: {exc}", file=sys.stderr)
        return 2
    args.argv = argv
    if args.command is None:  # bare `specbound`: the overview, not an error
        _parser().print_help()
        return 0
    try:
        commands = {
            "analyze": _analyze,
            "compare": _compare,
            "arch": _arch,
            "sweep": _sweep,
            "scaling": _scaling,
            "paper": _paper,
            "plot": _plot,
            "report": _report,
            "miniatures": _miniatures,
            "bench": _bench,
            "study": _study,
            "docs": _docs,
        }
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return commands[args.command](args)
    except _UsageError as exc:
        print(f"specbound: error: {exc}", file=sys.stderr)
        return 2
    except SpecboundError as exc:
        print(f"specbound: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional package this command needs (a base install)
        error = missing_module(exc, f"specbound {args.command}")
        if error is None:
            raise
        print(f"specbound: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `specbound analyze --format json | head`: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        hint = (
            "; the records finished so far are in the store: run the same command again to continue"
            if args.command == "sweep"
            else ""
        )
        print(f"specbound: interrupted{hint}", file=sys.stderr)
        return 130
    except ENVIRONMENT_ERRORS as exc:  # the one place OS errors become one line on the command line
        print(f"specbound: error: {one_line(exc, f'run specbound {args.command}')}", file=sys.stderr)
        return 2


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """A :class:`SpecboundWarning` as one line on stderr; any other warning as Python shows it."""
    if issubclass(category, SpecboundWarning):
        print(f"specbound: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


if __name__ == "__main__":
    sys.exit(main())
