"""`specbound docs`: every documentation reference in the source (output, error messages, docstrings)
names a page, and a section of it, that the command can show from an installed package; the pages
ship in the wheel."""

import inspect
import re
import sys
from pathlib import Path

import pytest

import specbound
from specbound.cli import main
from specbound.errors import SpecboundError
from specbound.tools import doc_pages

if sys.version_info >= (3, 11):
    import tomllib
else:  # the base install's tomli (pyproject.toml: python_version < '3.11')
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "specbound"
GENERATED = {"cli"}  # pages the command generates (from the argument parser), not files
# docs/PAGE.md, then optionally "section 6", "sections 4-7", "3d", "3, 5", "3.2"
REFERENCE = re.compile(
    r"(?P<before>\S*\s?)`*docs/(?P<page>[a-z][\w-]*)\.md(?:,? (?:sections? )?(?P<sections>\d+[a-z]?"
    r"(?:\.\d+)?(?:(?:-|, )\d+[a-z]?(?:\.\d+)?)*))?"
)


def references():
    """``(file:line, page, [section, ...])`` of every docs/PAGE.md reference in src/ (ggml's own
    docs/gguf.md, which io/gguf_header.py cites for the file format, is not ours)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in REFERENCE.finditer(line):
                if "ggml's" in m["before"]:
                    continue
                sections = re.split(r"-|, ", m["sections"]) if m["sections"] else []
                found.append((f"{path.relative_to(ROOT)}:{number}", m["page"], sections))
    return found


def test_the_source_cites_pages():
    pages = {page for _, page, _ in references()}
    assert {"theory", "spec", "bounds", "rotary", "architectures"} <= pages, pages  # the scan finds them


@pytest.mark.parametrize("where,page,sections", references(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_reference_resolves(where, page, sections):
    if page in GENERATED:
        return
    text = doc_pages.page_path(page).read_text()
    for key in sections:  # raises SpecboundError when the page has no such section
        assert doc_pages.section(text, key).startswith("#"), (where, key)


def test_a_section_runs_to_the_next_heading_of_its_level():
    text = "# T\n\n## 3. a\nA\n### 3.1 b\n```\n## 9. not a heading\n```\nB\n## 3b. c\nC\n"
    assert doc_pages.section(text, "3") == "## 3. a\nA\n### 3.1 b\n```\n## 9. not a heading\n```\nB\n"
    assert doc_pages.section(text, "section 3.1.") == "### 3.1 b\n```\n## 9. not a heading\n```\nB\n"
    assert doc_pages.section(text, "3b") == "## 3b. c\nC\n"
    with pytest.raises(SpecboundError, match="no section '9'.*3, 3.1, 3b"):
        doc_pages.section(text, "9")


def test_the_command_lists_prints_and_refuses(capsys):
    assert main(["docs"]) == 0
    listing = capsys.readouterr().out
    assert re.search(r"^theory +What specbound computes", listing, re.M) and re.search(
        r"^cli +Command line", listing, re.M
    )
    assert main(["docs", "docs/theory.md", "section", "3d"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## 3d. QK-norm") and "\n## 3e." not in out
    assert main(["docs", "cli", "specbound docs"]) == 0
    assert "`specbound docs`" in capsys.readouterr().out.splitlines()[0]
    assert main(["docs", "--path", "bounds"]) == 0
    assert Path(capsys.readouterr().out.strip()).read_text() == (ROOT / "docs" / "bounds.md").read_text()
    assert main(["docs", "theroy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'theory'?" in err


def test_the_pages_ship_in_the_package():
    """``specbound/_docs`` is docs/ (a link in the source tree), and the package data takes its pages."""
    assert doc_pages.docs_root().resolve() == (ROOT / "docs").resolve()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "_docs/*.md" in project["tool"]["setuptools"]["package-data"]["specbound"]
    # the metadata names no documentation host (one that resolves nowhere was named once) until one
    # is published (the site is built from a checkout; the pages ship in the package)
    urls = project["project"]["urls"]
    assert urls == {"Source paper": "https://arxiv.org/abs/2605.07297"}
    assert "site_url" not in (ROOT / "mkdocs.yml").read_text()
    assert "make docs" in doc_pages.SITE_BUILD


def test_the_api_page_prints_the_reference_not_the_directives():
    """`specbound docs api` prints no mkdocstrings `::: name` lines; a terminal reader gets
    each object's signature and docstring, as the site shows them."""

    text = doc_pages.show("api")
    assert not any(line.startswith(":::") for line in text.splitlines())
    assert "### `specbound.pipeline.analyze(" in text
    assert inspect.getdoc(specbound.analyze).splitlines()[0] in text
    # an object that cannot be imported is named, not a traceback
    assert "not importable" in doc_pages.expand_directives("::: specbound.no_such_module.thing\n")
