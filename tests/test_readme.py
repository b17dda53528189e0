"""The README is a front page (at most 12 KB) whose every link resolves and which links to every
guide; and the pages it points to say what the code and the Makefile do: the time `study --quick`
takes (the same number in its --help), the Debian packages `make` installs, the whole `scaling`
table."""

import argparse
import re
from pathlib import Path

from specbound.bounds import in_group
from specbound.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _subparser(name):
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _slugs(markdown: str) -> set[str]:
    """The anchors of a page's headings as the site's table of contents makes them (Python-Markdown's
    toc slugify: lower case, punctuation dropped, spaces to hyphens)."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        out.add(re.sub(r"[-\s]+", "-", text))
    return out


def test_readme_is_a_front_page():
    assert len(README.encode()) <= 12 * 1024, len(README.encode())


def test_every_readme_link_resolves():
    links = LINK.findall(README)
    assert len(links) > 20
    for link in links:
        if re.match(r"https?://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            assert anchor in _slugs(target.read_text()), link


def test_readme_links_to_every_guide():
    """Every page of the site's navigation that is a file of docs/ (the generated command-line and
    notebook pages aside, which `specbound --help` and the notebook page stand for)."""
    nav = re.findall(r"^\s+- (?:[^:\n]+: )?([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    linked = {Path(link.partition("#")[0]).name for link in LINK.findall(README)}
    pages = {page for page in nav if (DOCS / page).exists()} - {"index.md"}
    assert pages - linked == set()


def test_study_quick_takes_the_same_time_in_help_and_docs():
    quick = next(a for a in _subparser("study")._actions if "--quick" in a.option_strings)
    said = re.search(r"about (\d+) minutes on two idle cores", quick.help)
    assert said, quick.help
    results = (DOCS / "study-results.md").read_text()
    lines = [l for l in results.splitlines() if l.startswith("specbound study --quick") and "minute" in l]
    assert lines and all(f"about {said.group(1)} minutes on two idle cores" in l for l in lines), lines


def test_getting_started_lists_the_debian_packages_of_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    page = (DOCS / "getting-started.md").read_text()
    debs = re.search(r"^DATA_DEBS := (.+)$", makefile, re.M).group(1).split()
    assert "fortunes" in debs  # the third task's data
    listed = re.search(r"`((?:[a-z0-9-]+ )+[a-z0-9-]+)`, and `make test` Debian's", page.replace("\n", " "))
    assert listed and listed.group(1).split() == debs
    browser = re.search(r"^BROWSER_DEBS := (.+)$", makefile, re.M).group(1).split()
    assert all(f"`{b}`" in page for b in browser)


def test_sweeps_scaling_sample_has_every_row():
    """Every bound a BERT analysis computes (rotary-only ones aside), then each headline bound per role."""
    page = (DOCS / "sweeps.md").read_text()
    block = page[page.index("$ specbound scaling --store results/miniatures\n") :]
    rows = [l.split()[:2] for l in block.split("```")[0].splitlines()[2:] if l.strip()]
    rotary_only = {"spectral_adaptive_rotation_blind", "edelman_rotation_blind"}
    bounds = [b for g in ("bounds", "adaptive_variants", "baselines") for b in in_group(g) if b not in rotary_only]
    roles = [[b, r] for b in in_group("bounds") for r in ("QK", "OV", "FF_in", "FF_out")]
    assert sorted(r[0] for r in rows if r[1] == "all") == sorted(bounds)
    assert [r for r in rows if r[1] != "all"] == roles
