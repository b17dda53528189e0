"""The documentation pages, offline: ``specbound docs [TOPIC [SECTION]]``.

The Markdown pages of ``docs/`` ship inside the package as ``specbound/_docs`` (in the source tree a
link to ``docs/``), so every ``docs/PAGE.md section N`` that the output, an error message or a
docstring cites can be read from an installed wheel: ``specbound docs theory 3d``.  The site is built
from the same pages in a checkout (:data:`SITE_BUILD`); no host publishes it yet.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from pathlib import Path

from ..errors import SpecboundError

SITE_BUILD = "`make docs` in a checkout builds the site into site/"
DOCS = Path(__file__).resolve().parents[1] / "_docs"
# A numbered heading: "## 3d. QK-norm ...", "### 3.2 The envelope ...", "## 10. Timing ..."
_NUMBERED = re.compile(r"^(?P<level>#{1,6})\s+(?P<number>\d+[a-z]?(?:\.\d+)*)\.?\s")
_HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<title>.+?)\s*$")
_FENCE = re.compile(r"^(```|~~~)")
# mkdocstrings' directive: "::: specbound.pipeline.analyze" (its indented options lines follow)
_DIRECTIVE = re.compile(r"^:::\s+(?P<name>[A-Za-z_][\w.]*)\s*$")


def docs_root() -> Path:
    """The folder of the pages (``specbound/_docs``); one line when this install has none."""
    if not (DOCS / "index.md").is_file():
        raise SpecboundError(
            f"this installation of specbound has no documentation pages ({DOCS} is missing); "
            f"reinstall specbound from its wheel or a checkout ({SITE_BUILD})"
        )
    return DOCS


def topics(generated: dict[str, str] | None = None) -> dict[str, str]:
    """``{topic: title}`` of every page, ``theory`` for ``docs/theory.md`` (its first heading as the
    title), with the ``generated`` pages (``{topic: title}``, e.g. the command-line reference)."""
    found = {p.stem: _title(p.read_text(encoding="utf-8"), p.stem) for p in sorted(docs_root().glob("*.md"))}
    return dict(sorted({**found, **(generated or {})}.items()))


def page_path(topic: str) -> Path:
    """The file of ``topic``: ``theory``, ``theory.md`` and ``docs/theory.md`` all name docs/theory.md."""
    name = topic.strip().removeprefix("docs/").removesuffix(".md")
    path = docs_root() / f"{name}.md"
    if "/" in name or not name or not path.is_file():
        known = list(topics())
        near = difflib.get_close_matches(name, known, n=1)
        raise SpecboundError(
            f"no documentation page {topic!r}"
            + (f"; did you mean {near[0]!r}?" if near else "")
            + f" (pages: {', '.join(known)}; `specbound docs` lists them with their titles)"
        )
    return path


def section(text: str, key: str) -> str:
    """The section of the Markdown ``text`` that ``key`` names, its heading and everything up to the
    next heading of the same or a higher level.  ``key`` is a section number as the code cites it
    (``6``, ``3d``, ``3.2``; ``section 6`` and ``9.`` too) or words of a heading (``rope scaling``)."""
    key = re.sub(r"^sections?\s+", "", key.strip(), flags=re.I).rstrip(".").strip()
    lines = text.splitlines()
    headings = list(_headings(lines))
    start = next((h for h in headings if h[2] == key), None) or next(
        (h for h in headings if key and key.lower() in h[3].lower()), None
    )
    if start is None:
        numbers = [h[2] for h in headings if h[2]]
        raise SpecboundError(
            f"no section {key!r} on this page; its sections: "
            + (", ".join(numbers) if numbers else "none numbered: pass words of a heading")
        )
    index, level = start[0], start[1]
    end = next((i for i, lv, _, _ in headings if i > index and lv <= level), len(lines))
    return "\n".join(lines[index:end]).rstrip() + "\n"


def show(
    topic: str | None = None, key: str | None = None, *, generated: dict[str, tuple[str, object]] | None = None
) -> str:
    """What ``specbound docs`` prints: the list of pages, a page, or one section of it.
    ``generated``: ``{topic: (title, callable returning the page's Markdown)}``."""
    generated = generated or {}
    if topic is None:
        listing = topics({name: title for name, (title, _) in generated.items()})
        width = max(map(len, listing))
        return (
            "\n".join(f"{name:<{width}}  {title}" for name, title in listing.items())
            + "\n\n`specbound docs TOPIC [SECTION]` prints a page or one of its sections "
            "(`specbound docs theory 3d`); "
            f"the pages are in {docs_root()}; {SITE_BUILD}\n"
        )
    name = topic.strip().removeprefix("docs/").removesuffix(".md")
    text = generated[name][1]() if name in generated else page_path(topic).read_text(encoding="utf-8")
    text = expand_directives(text)
    return text if key is None else section(text, key)


def expand_directives(text: str) -> str:
    """The page with every mkdocstrings ``::: dotted.name`` block replaced by what the site shows
    there: the object's name, its signature and its docstring (``inspect.getdoc``), so that a
    terminal reader of ``specbound docs api`` sees the reference, not the directive.  An object that
    cannot be imported is named with the reason, never a traceback."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        i += 1
        while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():  # the directive's options
            i += 1
        out.extend(_reference(m["name"]))
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _reference(dotted: str) -> list[str]:
    parts = dotted.split(".")
    obj, found = None, False
    for k in range(len(parts) - 1, 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        try:
            for attr in parts[k:]:
                obj = getattr(obj, attr)
            found = True
        except AttributeError:
            pass
        break
    if not found:
        return [
            f"### `{dotted}`",
            "",
            f"(not importable in this installation: read it in the site's API page; {SITE_BUILD})",
            "",
        ]
    try:
        signature = str(inspect.signature(obj)) if callable(obj) else ""
    except (TypeError, ValueError):
        signature = ""
    doc = inspect.getdoc(obj) or "(no docstring)"
    return [f"### `{dotted}{signature}`", "", doc, ""]


def _headings(lines: list[str]):
    """``(line index, level, number or None, title)`` of every heading outside code fences."""
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := _HEADING.match(line)):
            number = _NUMBERED.match(line)
            yield i, len(m["level"]), number["number"] if number else None, m["title"]


def _title(text: str, default: str) -> str:
    first = next((h for h in _headings(text.splitlines())), None)
    return first[3].replace("`", "") if first else default
