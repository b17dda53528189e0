"""The ``specbound`` command: parses arguments and calls the library, nothing more."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import SpecboundError


class _UsageError(Exception):
    """A command-line usage error, reported by :func:`main` on one line like every other error."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's default prints the whole usage block and exits
        raise _UsageError(f"{message} (see `{self.prog} --help`)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="specbound",
        description="Spectrum-adaptive generalization bounds and baselines for trained Transformers.",
    )
    parser.add_argument("--version", action="version", version=f"specbound {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    an = sub.add_parser("analyze", help="analyse one checkpoint", description=(
        "Analyse one checkpoint: spectra of every QK/OV head and feed-forward matrix, the "
        "spectrum-adaptive bound, the Edelman-style baseline and the other baselines (docs/bounds.md)."))
    an.add_argument("source", nargs="?", help="Hugging Face model folder (default: the embedded all-MiniLM-L6-v2)")
    an.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    an.add_argument("--out", metavar="DIR", help="also write tables (Parquet, CSV) and summary.json to DIR")
    an.add_argument("--arch-spec", metavar="FILE",
                    help="architecture spec file for a family not shipped (`specbound arch infer` drafts one)")
    an.add_argument("--grid-m", type=_positive_int, metavar="M", help="Schatten grid resolution (default ceil(L + ln N))")
    an.add_argument("--rank-tol", type=float, default=1e-10, help="relative rank tolerance (default 1e-10)")
    an.add_argument("--l-phi", type=float, help="activation Lipschitz constant (default from hidden_act; GELU 1.13)")
    an.add_argument("--threads", type=_positive_int, help="BLAS threads (default: the BLAS default)")
    an.add_argument("--method", choices=("factored", "dense"), default="factored",
                    help="QK/OV spectra from d_h x d_h cores (default) or dense N x N SVDs (slow reference)")
    an.add_argument("--gram-rtol", type=float, default=1e-8,
                    help="feed-forward singular values from the Gram matrix when proven accurate to this "
                         "relative error (default 1e-8); 0 forces exact SVDs")
    an.add_argument("--init", metavar="SOURCE",
                    help="model folder with the initial weights W0: also compute every bound on W - W0")
    gap = an.add_argument_group("generalisation-gap bound (SPEC section 7; needs --n and --margin)")
    gap.add_argument("--n", type=_positive_int, help="number of training sequences")
    gap.add_argument("--margin", type=float, help="ramp-loss margin gamma > 0")
    gap.add_argument("--delta", type=float, default=0.05, help="failure probability (default 0.05)")
    gap.add_argument("--lead-constant", type=float, default=1.0,
                     help="absolute constant of the leading term, unstated by the sources (default 1)")
    gap.add_argument("--confidence-constant", type=float, default=1.0,
                     help="absolute constant of the confidence term, unstated by the sources (default 1)")

    arch = sub.add_parser("arch", help="architecture specs: draft one for a family not shipped")
    arch_sub = arch.add_subparsers(dest="arch_command", required=True, metavar="infer")
    infer = arch_sub.add_parser("infer", help="draft a spec file from a checkpoint's tensor names and config", description=(
        "Draft an architecture spec from a checkpoint's tensor names, shapes and config.json: the spec on "
        "stdout (or --out FILE), and on stderr every guess with its evidence and what you must verify "
        "(square weights cannot reveal their orientation; a fused qkv's split cannot be seen in shapes)."))
    infer.add_argument("source", help="model folder, weights file (.safetensors, .bin, .onnx, ...) or hub id")
    infer.add_argument("--out", metavar="FILE", help="write the spec to FILE instead of stdout")

    be = sub.add_parser("bench", help="time the analysis against the dense reference method")
    be.add_argument("--format", choices=("text", "json"), default="text")
    be.add_argument("--scenario", choices=("bert-base", "large"), default="bert-base",
                    help="bert-base: speed vs the dense reference (default); large: a LLaMA-shaped bf16 "
                         "checkpoint, time per layer and peak RSS")
    be.add_argument("--repeats", type=_positive_int, default=3, help="timed runs of the fast path (median reported)")
    be.add_argument("--threads", type=_positive_int, default=1, help="BLAS threads (default 1)")
    be.add_argument("--workdir", metavar="DIR", help="where to write the synthetic checkpoint (default: a temp dir)")
    st = sub.add_parser("study", help="train small transformers on real data and check the bounds against their gaps",
                        description=(
        "Train a grid of small transformers on the CPU (a ViT on Fashion-MNIST, a BERT-style encoder for "
        "word-level language identification), analyse every checkpoint, and report the Kendall rank "
        "correlation of every bound with the measured generalisation gap (overall and granulated per "
        "hyper-parameter, Jiang et al. 2020), figures, and which bounds are vacuous. Resumable: finished "
        "runs in --out are reused."))
    st.add_argument("--quick", action="store_true", help="the small grid (12 runs, a minute or two) instead of "
                                                         "the default grid (192 runs)")
    st.add_argument("--out", metavar="DIR", default="specbound-study",
                    help="study folder: runs/ and the report (default: specbound-study)")
    st.add_argument("--threads", type=_positive_int, default=2, help="CPU threads in all (default 2)")
    st.add_argument("--jobs", type=_positive_int,
                    help="worker processes (default: --threads; each gets threads/jobs torch threads)")
    st.add_argument("--tasks", default="fmnist,langid", help="comma-separated tasks (default fmnist,langid)")
    st.add_argument("--reanalyze", action="store_true",
                    help="recompute every run's analysis.json (after a change to the bounds); keeps the training")
    st.add_argument("--no-figures", action="store_true", help="skip the figures (no matplotlib needed)")
    return parser


def _analyze(args) -> int:
    from .analysis import analyze
    from .summary import format_summary

    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):  # fail before the work
        raise SpecboundError(f"--out {args.out} is a file; pass a folder (created if missing) for the tables")
    result = analyze(args.source, arch_spec=args.arch_spec, grid_m=args.grid_m, rank_tol=args.rank_tol,
                     l_phi=args.l_phi, threads=args.threads, method=args.method,
                     gram_rtol=args.gram_rtol, init=args.init,
                     n=args.n, margin=args.margin, delta=args.delta, lead_constant=args.lead_constant,
                     confidence_constant=args.confidence_constant)
    if args.out:
        try:
            result.save(args.out)
        except OSError as exc:
            raise SpecboundError(
                f"cannot write the tables to {args.out} ({exc.strerror or exc}: {exc.filename or args.out}); "
                f"pass --out a folder you can write to"
            ) from None
    if args.format == "json":
        print(result.to_json())
    else:
        print(format_summary(result))
        if args.out:
            print(f"\ntables and summary written to {args.out}")
    return 0


def _arch(args) -> int:
    from .archinfer import infer_spec
    from .checkpoint import open_checkpoint

    ckpt = open_checkpoint(args.source)
    try:
        draft = infer_spec(ckpt)
    finally:
        ckpt.close()
    text = json.dumps(draft.spec, indent=2) + "\n"
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as exc:
            raise SpecboundError(f"cannot write the spec to {args.out} ({exc.strerror or exc}); pass --out a "
                                 f"file path you can write to") from None
    else:
        sys.stdout.write(text)
    where = args.out or "the spec file"
    print(draft.report() + f"\n\nuse it with: specbound analyze {args.source} --arch-spec {where}",
          file=sys.stderr)
    return 0


def _bench(args) -> int:
    from .bench import format_bench, format_large_bench, run_bench, run_large_bench

    if args.scenario == "large":
        report, fmt = run_large_bench(threads=args.threads, workdir=args.workdir), format_large_bench
    else:
        report, fmt = run_bench(repeats=args.repeats, threads=args.threads, workdir=args.workdir), format_bench
    print(json.dumps(report, indent=2) if args.format == "json" else fmt(report))
    return 0


def _study(args) -> int:
    from .study.pipeline import run_study
    from .study.report import format_study

    if os.path.exists(args.out) and not os.path.isdir(args.out):  # fail before the work
        raise SpecboundError(f"--out {args.out} is a file; pass a folder (created if missing) for the study")
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    result = run_study(args.out, grid="quick" if args.quick else "default", tasks=tasks, threads=args.threads,
                       jobs=args.jobs, reanalyze=args.reanalyze, figures=not args.no_figures,
                       command=" ".join(["specbound", *args.argv]))
    print(format_study(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        print(f"specbound: error: {exc}", file=sys.stderr)
        return 2
    args.argv = argv
    try:
        return {"analyze": _analyze, "arch": _arch, "bench": _bench, "study": _study}[args.command](args)
    except SpecboundError as exc:
        print(f"specbound: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `specbound analyze --format json | head`: not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
