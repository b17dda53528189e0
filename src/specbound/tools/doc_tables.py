"""Tables in the docs, computed by the code they describe.

    python -m specbound.tools.doc_tables bounds-minilm        # print one block
    python -m specbound.tools.doc_tables --write docs/bounds.md   # rewrite every block of a file

A generated block sits between ``<!-- generated: NAME (python -m specbound.tools.doc_tables NAME) -->``
and ``<!-- end generated: NAME -->``; ``tests/test_doc_tables.py`` fails when a block's numbers drift
from what the code computes (each to the 4 significant digits it is printed with).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from ..archs.hybrids import refused_families
from ..archs.registry import builtin_specs
from ..archs.schema import declared
from ..archs.spec import REFERENCE_KEYS, ROTARY_OPTIONS, TOWER_KEYS, ArchSpec
from ..bounds.covering import NET_CONSTANT, dudley_log_integral
from ..bounds.gap import GapParameters, gap_terms
from ..bounds.registry import REGISTRY
from ..io.gguf_archs import ARCHS
from ..pipeline import analyze

N_GAP = 10**6  # the sample size of the gap column
MARGIN = 1.0
WIDE_MARGIN = 1.8  # a margin above 1, where B / margin would understate the gap
START = "<!-- generated: {name} (python -m specbound.tools.doc_tables {name}) -->"
END = "<!-- end generated: {name} -->"
_BLOCK = re.compile(
    r"<!-- generated: (?P<name>[\w-]+) \(python -m specbound\.tools\.doc_tables (?P=name)\) -->\n"
    r"(?P<body>.*?)<!-- end generated: (?P=name) -->",
    re.S,
)


def number(x: float) -> str:
    """At least 4 significant digits: ``20573``, ``187.4``, ``0.9344``, ``6.854e28``."""
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1e6 or abs(x) < 1e-3:
        mantissa, exponent = f"{x:.3e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    if abs(x) >= 1000:  # every integer digit (20573, not 20570)
        return str(round(x))
    rounded = float(f"{x:.3e}")  # the exponent of the printed value, not of x (0.99999 -> 1.000)
    digits = max(0, 3 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:.{digits}f}"


def below_one_at(gap_at_n: float, n: int) -> float:
    """The ``n`` at which a spectrum-adaptive gap falls to 1, from its value at ``n``: both of its terms
    scale as ``n^(-1/2)`` (its entropy integral and its union cost do not depend on ``n``)."""
    return n * gap_at_n**2


def bounds_minilm() -> str:
    """docs/bounds.md section 11: every bound on the embedded all-MiniLM-L6-v2 and its gap."""
    a = analyze(n=N_GAP, margin=MARGIN, threads=1)
    gaps, dims, grid_m = a.gap_bound, a.model, a.options["grid_m"]
    adaptive = a.bounds["spectral_adaptive"]
    lines = [
        f"L = {dims['L']}, N = {dims['N']}, {dims['H']} heads, d_ff = {dims['d_ff']}, {len(a.matrices)} matrices, "
        f"m = {grid_m}:",
        "",
        "| bound | value | / spectral_adaptive | gap, n = 10^6, margin 1 |",
        "|---|---|---|---|",
    ]
    for name, value in a.all_bounds().items():
        g = gaps["bounds"].get(name)
        gap = "-" if g is None else number(g["gap"]) + (" (vacuous)" if g["vacuous"] else "")
        shown = f"{int(value):,}" if name == "param_count" else number(value)
        ratio = "" if name == "param_count" else number(value / adaptive)
        lines.append(f"| {name} | {shown} | {ratio} | {gap} |")

    m = a.matrices
    # I(ln R) of every matrix, R = 9 scale_T ||W||_F, scale_T = scale T / L with T = #matrices (the budget
    # split over the covers summed), from the table (its Frobenius norm counts the values below the rank
    # tolerance too, ~1e-13 relative on this model: no printed digit moves)
    log_r = (
        math.log(NET_CONSTANT * len(m) / dims["L"])
        + m["log10_scale"] * math.log(10)
        + (m["frobenius_norm"]).map(math.log)
    )
    factors = [dudley_log_integral(u) for u in log_r]
    wide = analyze(n=N_GAP, margin=WIDE_MARGIN, threads=1)
    g_wide = wide.gap_bound["bounds"]["spectral_adaptive"]
    union = g_wide["union_cost"]
    outside = gap_terms(wide.bounds["spectral_adaptive"], 1.0, union, GapParameters(n=N_GAP, margin=WIDE_MARGIN))
    inside_plain = gap_terms(g_wide["complexity"], 1.0, union, GapParameters(n=N_GAP, margin=1.0))
    at_zero = int((m["p_star"] == 0).sum())
    g_adaptive, g_p0 = gaps["bounds"]["spectral_adaptive"], gaps["bounds"]["spectral_fixed_p0"]
    who = (
        f"Every one of the {len(m)} matrices takes `p* = 0`"
        if at_zero == len(m)
        else f"{at_zero} of the {len(m)} matrices take `p* = 0`"
    )
    lines += [
        "",
        f"{who} (`alpha_0 = {number(a.layers['downstream_factor'].iloc[0])}`): the downstream factors make any "
        f"`p > 0` far more expensive"
        + (
            ", so the adaptive bound *equals* the rank-counting bound `B_0` (`sum sqrt(r N) + sqrt(L)`), "
            f"and its gap exceeds the fixed-p0 gap ({number(g_p0['gap'])}) only by the grid's union cost "
            f"(`{len(m)} ln {2 * grid_m + 1}`), paid for a choice that did not help."
            if at_zero == len(m)
            else "."
        ),
        f"The gap's entropy integral (section 9) is `{number(g_adaptive['log_factor'])}` times `B`: every "
        f"rank term's `sqrt(D ln(9 scale_T ||W||_F / eps))` integrated, `scale_T = scale T / L` (`T = {len(m)}` "
        f"covers) up to `10^{m['log10_scale'].max() + math.log10(len(m) / dims['L']):.1f}`. With margin 1 the "
        "adaptive gap falls below 1 only for "
        f"`n` around `{number(below_one_at(g_adaptive['gap'], N_GAP))}`.",
        f"Per matrix, `I(ln R)` runs from `{number(min(factors))}` to `{number(max(factors))}`. At margin "
        f"{WIDE_MARGIN} (`n = 10^6`) the headline gap is `{number(g_wide['gap'])}`; dividing `B` by the margin "
        f"would give `{number(outside['gap'])}`, and the margin-inside form without the entropy integral "
        f"`{number(inside_plain['gap'])}`.",
    ]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


GGUF = "gguf-"  # the model types of GGUF families: gguf-<llama.cpp architecture>


def families() -> str:
    """docs/families.md: every shipped family, from ``archs/data/*.json`` (each once, none missing)."""
    specs = builtin_specs().values()
    hub = [s for s in specs if not any(t.startswith(GGUF) for t in s.model_types)]
    gguf = [s for s in specs if s not in hub]

    def types(spec) -> str:
        towers = [t for tower in spec.towers or () if tower.spec is not None for t in tower.spec.model_types]
        named = [f"{tower.name} `{tower.family}`" for tower in spec.towers or () if tower.family is not None]
        return (
            ", ".join(f"`{t}`" for t in spec.model_types)
            + (f" (a tower alone: {', '.join(f'`{t}`' for t in towers)})" if towers else "")
            + (f" (towers: {', '.join(named)})" if named else "")
        )

    lines = [
        f"{len(hub)} families of Hugging Face checkpoints (`model_type` of config.json):",
        "",
        "| family | model types | what it is |",
        "|---|---|---|",
    ]
    lines += [f"| `{s.family}` | {types(s)} | {_cell(s.description)} |" for s in hub]
    lines += [
        "",
        f"{len(gguf)} families of llama.cpp GGUF files (`general.architecture` of the file):",
        "",
        "| family | GGUF architectures | what it is |",
        "|---|---|---|",
    ]
    lines += [
        f"| `{s.family}` | {', '.join(f'`{t.removeprefix(GGUF)}`' for t in s.model_types)} | {_cell(s.description)} |"
        for s in gguf
    ]

    refused = refused_families()
    lines += [
        "",
        f"{len(refused)} hybrid families refused as a whole (`archs/data/refused/`), in one line that names "
        f"the layers of the kind below, their indices and tensors ([why](#hybrids-refused-as-a-whole)):",
        "",
        "| family | model types | refused layers | what it is |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| `{f.family}` | {', '.join(f'`{t}`' for t in f.model_types)} | {_cell(f.block)} "
        f"(`{_cell(f.tensors)}`) | {_cell(f.description)} |"
        for f in refused
    ]
    return "\n".join(lines) + "\n"


def readme_families() -> str:
    """README.md: one row per shipped family and per refused hybrid, from ``archs/data`` (each once,
    none missing); what each is: docs/families.md."""

    def types(model_types) -> str:
        return " ".join(f"`{t.removeprefix(GGUF)}`" for t in model_types)

    specs = builtin_specs().values()
    gguf = [s for s in specs if any(t.startswith(GGUF) for t in s.model_types)]
    lines = ["| family | reads |", "|---|---|"]
    lines += [f"| `{s.family}` | {types(s.model_types)} |" for s in specs if s not in gguf]
    lines += [f"| `{s.family}` | GGUF {types(s.model_types)} |" for s in gguf]
    lines += [
        f"| `{f.family}` | refused, naming its {_cell(f.block)} layers: {types(f.model_types)} |"
        for f in refused_families()
    ]
    return "\n".join(lines) + "\n"


def gguf_architectures() -> str:
    """docs/formats.md: every llama.cpp architecture the GGUF reader reads, from its row in ``io/gguf_archs.py``."""

    def own(row) -> str:
        hooks = [
            f"{what} `{hook.__name__}`"
            for what, hook in (
                ("layer types", row.layers),
                ("keys", row.keys),
                ("tensor renames", row.blocks),
                ("joins", row.joined),
            )
            if hook is not None
        ]
        return ", ".join(hooks) or "-"

    lines = [
        f"{len(ARCHS)} llama.cpp architectures (`general.architecture`), one row each in `io/gguf_archs.py`:",
        "",
        "| architecture | family | Q and K rows | activation | fixed by llama.cpp's graph | its own translation |",
        "|---|---|---|---|---|---|",
    ]
    for row in ARCHS.values():
        family = f"`{row.family}`" + (f" (with experts: `{row.experts_family}`)" if row.experts_family else "")
        fixed = ", ".join(f"`{k}` {v}" for k, v in row.fixed.items()) or "-"
        rows = "put back (`LlamaModel.permute`)" if row.permuted else "as stored"
        lines.append(f"| `{row.name}` | {family} | {rows} | `{row.activation}` | {fixed} | {own(row)} |")
    return "\n".join(lines) + "\n"


def bounds_registry() -> str:
    """docs/registry.md: every registered bound, in output order, from ``bounds/registry.py``."""
    lines = ["| bound | group | title | reference | reads | on `W - W0` |", "|---|---|---|---|---|---|"]
    for name, b in REGISTRY.items():
        needs = ", ".join(f"`{n}`" for n in b.needs)
        lines.append(
            f"| `{name}` | {b.group} | {_cell(b.title)} | {_cell(b.reference)} | {needs} | "
            f"{'yes' if b.distance else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def cli_reference(parser) -> str:
    """docs/cli.md: every subcommand and option of ``parser`` (``specbound.cli._parser()``), read from
    the argparse objects themselves, so the page cannot drift from ``--help``."""

    def commands(p, words):
        yield words, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, [*words, name])

    def flag(action) -> str:
        if not action.option_strings:
            return f"`{action.metavar or action.dest}`"
        shown = ", ".join(f"`{o}`" for o in action.option_strings)
        takes = action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction)
        return shown + (
            f" `{action.metavar or action.dest.upper()}`" if takes and action.metavar != argparse.SUPPRESS else ""
        )

    lines = [
        "# Command line",
        "",
        "Generated from the argument parser itself (`specbound.cli`), so it says what `--help` says. "
        "Every error is one line on stderr and exit status 2.",
        "",
    ]
    for words, p in commands(parser, [parser.prog]):
        if len(words) > 1:
            lines += [f"## `{' '.join(words)}`", ""]
        lines += ["```text", p.format_usage().strip().removeprefix("usage: "), "```", ""]
        if p.description:
            lines += [_cell(p.description), ""]
        for group in p._action_groups:
            rows = [
                a
                for a in group._group_actions
                if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
            ]
            if not rows:
                continue
            lines += [f"**{_cell(group.title)}**", "", "| argument | what it does |", "|---|---|"]
            for a in rows:
                help_text = a.help % {"default": a.default, "prog": p.prog} if a.help else ""
                choices = (
                    f" Choices: {', '.join(f'`{c}`' for c in a.choices)}."
                    if a.choices and not isinstance(a.choices, dict)
                    else ""
                )
                lines.append(f"| {flag(a)} | {_cell(help_text)}{choices} |")
            lines.append("")
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        for action in subs:
            lines += ["| command | what it does |", "|---|---|"]
            lines += [
                f"| [`{' '.join([*words, c.dest])}`](#{'-'.join([*words, c.dest])}) | {_cell(c.help)} |"
                for c in action._choices_actions
            ]
            lines.append("")
    return "\n".join(lines)


def spec_keys() -> str:
    """docs/architectures.md: every key of a spec document, from its declaration on ``ArchSpec`` (archs/spec.py)."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    lines += [f"| `{d.name}` | {d.default_text()} | {_cell(d.meta['doc'])} |" for d in declared(ArchSpec)]
    lines += [
        "",
        "The `rotary` object's optional keys besides `pairing`:",
        "",
        "| `rotary` key | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {_cell(doc)} |" for name, doc in ROTARY_OPTIONS.items()]
    return "\n".join(lines) + "\n"


def tower_keys() -> str:
    """docs/architectures.md: the keys of a two-tower family's tower object, from ``archs/spec.py``."""
    return (
        "\n".join(
            [
                "| tower key | meaning |",
                "|---|---|",
                *(f"| `{name}` | {_cell(doc)} |" for name, doc in TOWER_KEYS.items()),
            ]
        )
        + "\n"
    )


def wrapper_keys() -> str:
    """docs/architectures.md: the keys of a vision-language wrapper and of its towers, from ``archs/spec.py``."""
    own = [d.name for d in declared(ArchSpec) if "wrapper" in d.meta["documents"]]
    return (
        "\n".join(
            [
                f"A wrapper holds only the keys {', '.join(f'`{k}`' for k in own)} (the table above: `ignore` "
                f"lists the patterns every tower ignores); each tower:",
                "",
                "| tower key | meaning |",
                "|---|---|",
                *(f"| `{name}` | {_cell(doc)} |" for name, doc in REFERENCE_KEYS.items()),
            ]
        )
        + "\n"
    )


GENERATORS = {
    "bounds-minilm": bounds_minilm,
    "families": families,
    "bounds-registry": bounds_registry,
    "readme-families": readme_families,
    "gguf-architectures": gguf_architectures,
    "spec-keys": spec_keys,
    "tower-keys": tower_keys,
    "wrapper-keys": wrapper_keys,
}


def blocks(text: str) -> dict[str, str]:
    """``{name: body}`` of every generated block of a document."""
    return {match["name"]: match["body"] for match in _BLOCK.finditer(text)}


def rewrite(path: Path) -> list[str]:
    """Regenerate every block of the file at ``path`` in place; the names rewritten."""
    text = path.read_text()
    names = list(blocks(text))

    def body(match):
        name = match["name"]
        return f"{START.format(name=name)}\n{GENERATORS[name]()}{END.format(name=name)}"

    path.write_text(_BLOCK.sub(body, text))
    return names


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--write":
        print("rewrote " + ", ".join(rewrite(Path(args[1]))))
        return 0
    if len(args) == 1 and args[0] in GENERATORS:
        sys.stdout.write(GENERATORS[args[0]]())
        return 0
    print(f"usage: python -m specbound.tools.doc_tables ({' | '.join(GENERATORS)} | --write FILE)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
