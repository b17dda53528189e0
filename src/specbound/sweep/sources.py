"""What a sweep runs over: source patterns expanded to checkpoints, and sweep config files.

A *source* is the string handed to :func:`specbound.analyze` (a model folder, or a hub id).  A
*pattern* names many sources at once, with three kinds of brace group and shell-style wildcards:

* ``{2..12}`` an integer range, ``{2..12..2}`` one with a step;
* ``{128,256,512}`` a list of alternatives;
* ``{H/64}`` an integer expression of the values bound by earlier groups (``+ - * / // %`` and
  parentheses); a group takes the name of the letters just before it (``_H-{..}`` binds ``H``),
  or an explicit one: ``{H=128..768}``;
* ``*`` and ``?`` match within one path component.

A pattern is matched against what exists, never enumerated blindly: first the file system (the
pattern with every group replaced by ``*`` is globbed, then each candidate must fit the groups),
then, for a pattern shaped like a hub id (``org/name``), the repositories of the local Hugging Face
cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``).  So
``google/bert_uncased_L-{2..12}_H-{128..768}_A-{H/64}`` finds exactly the BERT Miniatures that are
in the cache, whatever range the pattern allows.  A source without braces or wildcards is taken
as it is.
"""

from __future__ import annotations

import ast
import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..archs.spec import load_spec_file
from ..errors import SpecboundError, oversized_integer_text
from ..io.base import MAX_SMALL_FILE_BYTES, read_regular_file
from ..options import AnalysisOptions, option_names
from ..io.hub_cache import cache_dir, cached_model_ids, find_snapshot

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

_GROUP = re.compile(r"\{([^{}]*)\}")
_NAME_BEFORE = re.compile(r"([A-Za-z]+)[-_=:]?$")
_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?:\.\.\s*(\d+)\s*)?$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-*?/]*$")


@dataclass(frozen=True)
class Source:
    """One checkpoint a sweep analyses.

    Attributes
    ----------
    name : str
        How the user named it (a folder, or a hub id after expansion).
    target : str
        What :func:`specbound.analyze` opens: the folder, or for a hub id found in the local cache
        its snapshot folder.
    labels : dict
        Values bound by the pattern's brace groups (``{"L": 2, "H": 128, "A": 2}``).
    metrics : dict
        Your numbers for this checkpoint (``--metrics FILE``; :mod:`specbound.sweep.metrics`).
    """

    name: str
    target: str
    labels: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


# --- patterns ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    name: str
    kind: str  # "range", "list" or "expr"
    values: tuple = ()  # range: (start, stop, step); list: the alternatives
    expr: ast.Expression | None = None
    text: str = ""

    def accepts(self, value: str, bound: dict[str, Any]) -> Any:
        """The group's value for the matched text, or None when it does not fit."""
        if self.kind == "list":
            return _typed(value) if value in self.values else None
        number = int(value)
        if self.kind == "range":
            start, stop, step = self.values
            lo, hi = min(start, stop), max(start, stop)
            return number if lo <= number <= hi and (number - start) % step == 0 else None
        want = _evaluate(self.expr, bound, self.text)
        return number if want is not None and want == number else None


def _typed(text: str) -> Any:
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def _evaluate(expr: ast.Expression, bound: dict[str, Any], text: str) -> int | None:
    """Integer value of a group expression, None when it is not an integer (``130/64``)."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in bound or not isinstance(bound[node.id], int):
                raise SpecboundError(
                    f"pattern group {{{text}}} uses {node.id}, which no earlier integer "
                    f"group binds; name a group with {node.id}={{...}} or place it first"
                )
            return bound[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {
                ast.Add: lambda: a + b,
                ast.Sub: lambda: a - b,
                ast.Mult: lambda: a * b,
                ast.Div: lambda: a / b if b else None,
                ast.FloorDiv: lambda: a // b if b else None,
                ast.Mod: lambda: a % b if b else None,
            }
            if type(node.op) in ops and a is not None and b is not None:
                return ops[type(node.op)]()
            if a is None or b is None:
                return None
        raise SpecboundError(
            f"pattern group {{{text}}}: only integers, names of earlier groups and + - * / // % are allowed"
        )

    value = ev(expr)
    if value is None or (isinstance(value, float) and not value.is_integer()):
        return None
    return int(value)


def _parse_group(body: str, before: str, index: int) -> _Group:
    name = None
    if "=" in body.split("..")[0] and not body.startswith("="):
        name, body = (s.strip() for s in body.split("=", 1))
    if name is None:
        found = _NAME_BEFORE.search(before)
        name = found.group(1) if found else f"g{index}"
    ranged = _RANGE.match(body)
    if ranged:
        start, stop, step = int(ranged.group(1)), int(ranged.group(2)), int(ranged.group(3) or 1)
        if step < 1:
            raise SpecboundError(f"pattern group {{{body}}}: the step must be a positive integer")
        return _Group(name, "range", (start, stop, step), text=body)
    if "," in body:
        return _Group(name, "list", tuple(s.strip() for s in body.split(",")), text=body)
    try:
        expr = ast.parse(body.strip(), mode="eval") if len(body) <= 200 else None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        expr = None
    if expr is None or not body.strip():
        raise SpecboundError(
            f"cannot read the pattern group {{{body[:80]}}}: expected a range {{2..12}}, a list "
            f"{{a,b}} or an integer expression of earlier groups {{H/64}}"
        )
    for node in ast.walk(expr):
        if not isinstance(node, _EXPR_NODES) or (isinstance(node, ast.Constant) and not _plain_int(node.value)):
            raise SpecboundError(
                f"pattern group {{{body}}}: only integers, names of earlier groups and "
                f"+ - * / // % are allowed, found {type(node).__name__}"
            )
    return _Group(name, "expr", expr=expr, text=body)


# What a group expression may hold: integers, names, unary minus and + - * / // %.
_EXPR_NODES = (
    ast.Expression,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.UnaryOp,
    ast.USub,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
)


def _plain_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _wildcards_to_regex(text: str) -> str:
    out = []
    for ch in text:
        out.append("[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch))
    return "".join(out)


@dataclass(frozen=True)
class Pattern:
    """A source pattern compiled to a glob (to list candidates) and a regex (to check them)."""

    text: str
    groups: tuple[_Group, ...]
    regex: re.Pattern
    glob: str

    @classmethod
    def parse(cls, text: str) -> "Pattern":
        """Compile ``text``; a malformed group is a :class:`SpecboundError` naming it."""
        groups, regex, globbed, pos = [], [], [], 0
        for i, match in enumerate(_GROUP.finditer(text)):
            literal = text[pos : match.start()]
            regex.append(_wildcards_to_regex(literal))
            globbed.append(literal)
            group = _parse_group(match.group(1), text[: match.start()], i)
            groups.append(group)
            alternatives = "|".join(re.escape(v) for v in group.values) if group.kind == "list" else r"-?\d+"
            regex.append(f"({alternatives})")
            globbed.append("*")
            pos = match.end()
        regex.append(_wildcards_to_regex(text[pos:]))
        globbed.append(text[pos:])
        if "{" in text[pos:] or "}" in text[pos:]:
            raise SpecboundError(f"unbalanced braces in the source pattern {text!r}")
        return cls(text, tuple(groups), re.compile("".join(regex) + r"/?"), "".join(globbed))

    @property
    def is_pattern(self) -> bool:
        """Whether ``text`` names more than itself (a group or a wildcard)."""
        return bool(self.groups) or any(c in self.text for c in "*?")

    def match(self, candidate: str) -> dict[str, Any] | None:
        """The values the groups bind for ``candidate``, or None when it does not fit."""
        found = self.regex.fullmatch(candidate)
        if not found:
            return None
        bound: dict[str, Any] = {}
        for group, text in zip(self.groups, found.groups()):
            value = group.accepts(text, bound)
            if value is None:
                return None
            if group.name in bound and bound[group.name] != value:
                return None
            bound[group.name] = value
        return bound


# --- the Hugging Face cache ----------------------------------------------------------------------


def _looks_like_hub_id(text: str) -> bool:
    """``org/name`` (brace groups aside): one slash, not a path that starts from somewhere."""
    bare = _GROUP.sub("0", text)
    return bare.count("/") == 1 and not bare.startswith((".", "/", "~")) and bool(_HUB_ID.match(bare))


# --- expansion ---------------------------------------------------------------------------------


def _natural_key(source: Source):
    return [(0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in source.labels.values()] + [
        (2, 0, source.name)
    ]


def expand_pattern(text: str) -> list[Source]:
    """Every existing source that ``text`` names, ordered by the groups' values.

    Raises
    ------
    SpecboundError
        When a pattern matches nothing (with where it looked).
    """
    pattern = Pattern.parse(text)
    if not pattern.is_pattern:
        return [_plain_source(text)]
    found = []
    for candidate in glob.glob(os.path.expanduser(pattern.glob)):
        shown = candidate if not text.startswith("~") else candidate.replace(os.path.expanduser("~"), "~", 1)
        labels = pattern.match(shown.rstrip("/"))
        if labels is not None and os.path.isdir(candidate):
            found.append(Source(shown.rstrip("/"), candidate.rstrip("/"), labels))
    if not found and _looks_like_hub_id(text):
        cache = cache_dir()
        for repo_id in cached_model_ids(cache):
            labels = pattern.match(repo_id)
            if labels is not None:
                snapshot = find_snapshot(repo_id, cache=cache)
                if snapshot is not None:  # recorded as ORG/NAME@commit: what was read
                    found.append(Source(f"{repo_id}@{snapshot.name}", str(snapshot), labels))
    if not found:
        where = "the file system" + (f" or the Hugging Face cache {cache_dir()}" if _looks_like_hub_id(text) else "")
        raise SpecboundError(
            f"the source pattern {text!r} matches no model folder in {where}; check the "
            f"pattern (specbound sweep --dry-run lists what it matches)"
        )
    return sorted(found, key=_natural_key)


def _plain_source(text: str) -> Source:
    """A source without groups: a path as it is; a hub id found in the cache, its snapshot folder."""
    if not os.path.exists(os.path.expanduser(text)) and _looks_like_hub_id(text):
        repo_id, _, revision = text.partition("@")
        snapshot = find_snapshot(repo_id, revision or "main")
        if snapshot is not None:  # recorded as ORG/NAME@commit: what was read
            return Source(f"{repo_id}@{snapshot.name}", str(snapshot))
    return Source(text, text)


def expand_sources(patterns: list[str]) -> list[Source]:
    """Expand every pattern in turn; a source named twice is kept once (its first name)."""
    out, seen = [], set()
    for text in patterns:
        for source in expand_pattern(text):
            key = os.path.realpath(source.target) if os.path.exists(source.target) else source.target
            if key not in seen:
                seen.add(key)
                out.append(source)
    return out


# --- config files ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepConfig:
    """A sweep described in a TOML file.

    Attributes
    ----------
    sources : list of str
        Sources and patterns (relative folders are relative to the config file).
    option_sets : list of dict
        One or more sets of analysis options (names of :class:`~specbound.options.AnalysisOptions` that change the
        numbers); every source is analysed with
        each set.
    store : str or None
        The results store named by the file, if any.
    """

    sources: list[str]
    option_sets: list[dict[str, Any]]
    store: str | None = None


def load_sweep_config(path: str | Path) -> SweepConfig:
    """Read a sweep config file::

    sources = ["google/bert_uncased_L-{2..12}_H-{128..768}_A-{H/64}"]
    store = "results/miniatures"        # optional

    [options]                           # optional; or several [[options]] tables
    grid_m = 20
    rank_tol = 1e-10
    """
    path = Path(path)
    # a regular file of at most 16 MiB: a FIFO would block the read, /dev/zero never end it
    raw_bytes = read_regular_file(
        path, MAX_SMALL_FILE_BYTES, "sweep config", "pass a TOML file (sources, store, [options])"
    )
    try:
        doc = tomllib.loads(raw_bytes.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecboundError(
            f"cannot read the sweep config {path}: it is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}); save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecboundError(f"cannot parse the sweep config {path} as TOML: {exc}") from None
    except ValueError:  # an integer beyond Python's int-string limit (TOMLDecodeError is caught above)
        raise oversized_integer_text(f"parse the sweep config {path}", "fix the value") from None
    except RecursionError:
        raise SpecboundError(
            f"cannot parse the sweep config {path}: it is nested too deeply to be a sweep "
            f"config (sources, store, [options])"
        ) from None
    unknown = sorted(set(doc) - {"sources", "options", "store"})
    if unknown:
        raise SpecboundError(f"{path}: unknown key(s) {', '.join(unknown)}; expected sources, options, store")
    sources = doc.get("sources")
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) for s in sources):
        raise SpecboundError(
            f"{path}: 'sources' must be a non-empty list of strings (folders, hub ids or patterns), found {sources!r}"
        )
    base = path.parent
    sources = [_relative_to(base, s) for s in sources]
    raw = doc.get("options", {})
    option_sets = raw if isinstance(raw, list) else [raw]
    for options in option_sets:
        if not isinstance(options, dict):
            raise SpecboundError(f"{path}: 'options' must be a table or a list of tables, found {options!r}")
        bad = sorted(set(options) - set(option_names(key_only=True)))
        if bad:
            raise SpecboundError(
                f"{path}: unknown option(s) {', '.join(bad)}; expected some of {', '.join(option_names(key_only=True))}"
            )
        spec = options.get("arch_spec")
        if isinstance(spec, str) and not os.path.isabs(os.path.expanduser(spec)):
            options["arch_spec"] = str(base / spec)  # relative to the config file, like its sources
        try:
            AnalysisOptions.build(options)
            if options.get("arch_spec") is not None:
                load_spec_file(options["arch_spec"])  # a bad spec is the config's error, not each source's
        except SpecboundError as exc:
            raise SpecboundError(f"{path}: {exc}") from None
    store = doc.get("store")
    if store is not None and not isinstance(store, str):
        raise SpecboundError(f"{path}: 'store' must be a folder name, found {store!r}")
    if store is not None and not os.path.isabs(os.path.expanduser(store)):
        store = str(base / store)
    return SweepConfig(sources=sources, option_sets=[dict(o) for o in option_sets] or [{}], store=store)


def _relative_to(base: Path, source: str) -> str:
    """A config's relative folder is relative to the config file when its first component is there;
    anything else (an absolute path, a hub id) is kept as written."""
    if os.path.isabs(os.path.expanduser(source)):
        return source
    first = source.split("/", 1)[0]
    if source.startswith(("./", "../")) or (first not in (".", "") and (base / first).exists()):
        return str(base / source)
    return source
